"""A small distributed training script as users write it, for the rank hunter
(``tests/agents/torch/rank_hunt.py``): run by ``torchrun`` with and without ``intune-run``.

What it does is read from ``RANK_JOB`` (JSON): the dataset (map-style under a
``DistributedSampler``, or an ``IterableDataset`` sharded by rank and worker), the loader
(``num_workers``, ``persistent_workers``), the epochs, and what one rank does at a batch:
nothing, leave the loop early (``return``), raise, ``sys.exit(3)``, SIGKILL itself, or run
slower than the others. ``actor`` says which rank: ``"host"`` is the rank that runs the host
agent under ``intune-run`` (rank 0 without it), ``"other"`` one that does not (the last rank
without it). ``at_restart``: the torchrun restart the fault happens in (``--max-restarts``).

SIGUSR1 dumps every thread's stack (the hunter sends it to a job that passed its bound).
"""

import datetime
import faulthandler
import json
import os
import signal
import sys
import time

faulthandler.register(signal.SIGUSR1, all_threads=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset  # noqa: E402

JOB = json.loads(os.environ["RANK_JOB"])
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# This rank's own settings over the job's (``per_rank``, the hunter's mixed cases): its
# dataset, workers, persistence; ``no_loader`` (it trains on nothing the loader gives), ``loaders``
# (that many more loaders built and iterated before the training one), ``delay_s`` (it starts
# that much later), ``affinity`` (pinned to one CPU with os.sched_setaffinity).
MINE = {**JOB, **JOB.get("per_rank", {}).get(str(RANK), {})}
ROWS = JOB.get("rows", 48) * WORLD  # 12 batches of 4 a rank
ITEM_S = JOB.get("item_s", 0.004)
STEP_S = JOB.get("step_s", 0.1)  # a training step's time


class Rows(Dataset):
    """Rows 0..n-1 (a tensor of its index), each a moment's work."""

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        time.sleep(ITEM_S)
        return torch.tensor([float(i)])


class Stream(IterableDataset):
    """Rows 0..n-1 shared out by rank and by worker."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        for i in range(RANK * workers + worker, ROWS, WORLD * workers):
            time.sleep(ITEM_S)
            yield torch.tensor([float(i)])


def hosting() -> bool:
    """Whether this rank runs the host agent (under intune-run; rank 0 without it)."""
    if os.environ.get("INTUNE_AUTO") != "1":
        return RANK == 0
    from agents.torch import auto

    deadline = time.monotonic() + JOB.get("host_wait_s", 3.0)
    while time.monotonic() < deadline:
        attachment = auto._tuned.agent
        link = getattr(attachment, "link", None)
        if link is not None and link.connected.is_set():
            return link.hosting
        time.sleep(0.05)
    return False


def reached() -> bool | None:
    """Whether this rank's tuned loader has reached the host agent (``None``: not tuned)."""
    if os.environ.get("INTUNE_AUTO") != "1":
        return None
    from agents.torch import auto

    link = getattr(auto._tuned.agent, "link", None)
    return None if link is None else link.connections > 0


def acting_rank() -> int | None:
    """The rank that does the fault, agreed by all (an all-gather at the fault's batch):
    ``host`` the one that runs the host agent (rank 0 when none does, as without intune-run),
    ``other`` the highest rank that does not."""
    if JOB["action"] == "none" or RESTART != JOB.get("at_restart", 0):
        return None
    flags = [None] * WORLD
    dist.all_gather_object(flags, hosting())
    host = flags.index(True) if True in flags else 0
    if JOB["actor"] == "host":
        return host
    return max(r for r in range(WORLD) if r != host)


def main() -> int:
    if MINE.get("affinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[RANK % len(cpus)]})
    time.sleep(MINE.get("delay_s", 0.0))
    # Each restart's ranks meet under a prefix of their own: with the elastic agent's store
    # alone, a restarted rank read a dead rank's address from the round before and gloo failed
    # ("connectFullMesh failed ... Connection refused"), or hung, under plain torchrun too.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, is_master=False,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"restart{RESTART}", store), rank=RANK, world_size=WORLD
    )
    dist.barrier()
    if MINE.get("no_loader"):
        for _ in range(JOB["epochs"]):
            time.sleep(12 * STEP_S)
            if JOB.get("barrier_epochs"):
                dist.barrier()
        print(f"rank {RANK} (restart {RESTART}, pid {os.getpid()}) done: 0 rows, "
              f"reached={reached()}", flush=True)  # fmt: skip
        dist.destroy_process_group()
        return 0
    for extra in range(MINE.get("loaders", 0)):
        # Other loaders first (a validation set, a calibration pass), each iterated once.
        other = DataLoader(Rows(), batch_size=4, sampler=range(4 * (extra + 1)),
                           num_workers=1 + extra % 2)  # fmt: skip
        for _ in other:
            time.sleep(STEP_S / 2)
    if MINE["dataset"] == "map":
        dataset = Rows()
        sampler = DistributedSampler(dataset, shuffle=True, seed=JOB.get("seed", 0))
    else:
        dataset, sampler = Stream(), None
    if JOB.get("val_first"):
        # A validation loader iterated first (Lightning's sanity check): tuned first, then
        # the tuning moves to the training loader, built afterwards, when that one starts.
        val = DataLoader(Rows(), batch_size=4, sampler=range(8), num_workers=1,
                         persistent_workers=JOB["persistent"])  # fmt: skip
        for _ in val:
            time.sleep(STEP_S)
        time.sleep(JOB.get("val_pause_s", 0.0))
    workers = MINE["num_workers"]
    loader = DataLoader(
        dataset,
        batch_size=4,
        sampler=sampler,
        num_workers=workers,
        persistent_workers=MINE["persistent"] and workers > 0,
    )
    acting = None  # decided at the action's batch (the host agent is up by then)
    seen = 0
    for epoch in range(JOB["epochs"]):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for b, batch in enumerate(loader):
            seen += len(batch)
            if (epoch, b) == tuple(JOB["at"]):
                acting = acting_rank() == RANK
                if acting:
                    action = JOB["action"]
                    print(
                        f"{time.time():.3f} rank {RANK} (restart {RESTART}, pid {os.getpid()}) "
                        f"does {action}",
                        flush=True,
                    )
                    if action == "return":
                        # torch aborts a rank that exits with its process group while
                        # others run, 1 run in 20 or so ("terminate called without an
                        # active exception"; seed 3019 under plain torchrun)
                        dist.destroy_process_group()
                        return 0
                    if action == "raise":
                        raise RuntimeError(f"rank {RANK} fails at batch {b} of epoch {epoch}")
                    if action == "exit":
                        sys.exit(3)
                    if action == "sigkill":
                        os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(STEP_S * (3 if acting and JOB["action"] == "slow" else 1))
        if JOB.get("barrier_epochs"):
            dist.barrier()  # a gloo barrier between epochs, while the host's ranks may move
    print(
        f"rank {RANK} (restart {RESTART}, pid {os.getpid()}) done: {seen} rows, reached={reached()}",
        flush=True,
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
