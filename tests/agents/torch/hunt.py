"""A hang hunter for ``agents.torch.DataLoader``: generated loaders (map-style or iterable,
persistent or not, ``worker_init_fn``, fusion) under generated training loops and faults
(live resizes, SIGKILL and SIGSTOP/SIGCONT of workers and of the launcher, ``break`` then a
new epoch at once, ``close()`` from another thread, Ctrl-C in the loop), each case in a
forked child under a hard bound.

    nice -n 5 .venv/bin/python -m tests.agents.torch.hunt --cases 30 [--seed N | --replay N]

Every batch of an epoch read to its end must come once, in the sampler's order (map-style;
an iterable dataset's rows each once), or a clear error; after ``close()`` no worker may be
left. Tally in ``var/hunt-loader.json``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
import warnings

import psutil
import torch

from agents.pipeline import PipelineStopped, StageFailed
from agents.torch import DataLoader
from tests.agents.pipeline.hunt import hunt

CASE_BOUND_S = 90.0
warnings.filterwarnings("ignore", message="This DataLoader will create")


class MapData(torch.utils.data.Dataset):
    """Rows ``0..n-1``, each a tensor holding its index; one may raise; each may sleep."""

    def __init__(self, n: int, width: int, raise_at: int, sleep_ms: float) -> None:
        self.n, self.width, self.raise_at, self.sleep_ms = n, width, raise_at, sleep_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.raise_at:
            raise ValueError(f"row {i} is bad")
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        return torch.full((self.width,), float(i))


class IterData(torch.utils.data.IterableDataset):
    """Rows ``0..n-1`` split among torch's workers (``get_worker_info``)."""

    def __init__(self, n: int, width: int, sleep_ms: float) -> None:
        self.n, self.width, self.sleep_ms = n, width, sleep_ms

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, self.n, of):
            if self.sleep_ms:
                time.sleep(self.sleep_ms / 1000)
            yield torch.full((self.width,), float(i))


_INITS: dict[str, object] = {}


def init_ok(worker_id: int) -> None:
    os.environ["HUNT_WORKER"] = str(worker_id)


def init_slow(worker_id: int) -> None:
    time.sleep(0.3)


def init_raises(worker_id: int) -> None:
    raise RuntimeError(f"worker {worker_id} cannot start")


INITS = {"none": None, "ok": init_ok, "slow": init_slow, "raises": init_raises}


def generate(rng: random.Random) -> dict:
    """One case: a loader, and the epochs and faults of its training loop."""
    iterable = rng.random() < 0.35
    n = rng.randint(0, 80)
    ops = []
    for _ in range(rng.randint(1, 10)):
        kind = rng.choice(
            ["take", "take", "apply", "kill", "stopcont", "kill_launcher", "stop_launcher",
             "break_new", "close_thread", "sigint", "epoch", "sleep", "flurry",
             "sigint_close", "sigint_iter"]
        )  # fmt: skip
        if kind == "take":
            ops.append(["take", rng.randint(1, 10)])
        elif kind == "apply":
            ops.append(["apply", rng.randint(1, 4)])
        elif kind in ("stopcont", "stop_launcher"):
            ops.append([kind, rng.choice([0.05, 0.4, 1.2])])
        elif kind == "sleep":
            ops.append(["sleep", rng.choice([0.05, 0.3])])
        elif kind == "flurry":
            ops.append(["flurry", rng.randint(2, 8)])
        elif kind in ("sigint_close", "sigint_iter"):
            ops.append([kind, rng.choice([0.0, 0.005, 0.02, 0.1, 0.3])])
        else:
            ops.append([kind])
    return {
        "iterable": iterable,
        "n": n,
        "width": rng.choice([1, 64, 40_000]),
        "batch_size": rng.choice([1, 2, 5, 16]),
        "num_workers": rng.choice([0, 1, 2, 3]),
        "persistent": rng.random() < 0.5,
        "fuse": rng.choice(["auto", "auto", None]),
        "init": rng.choice(["none", "none", "ok", "slow", "raises"]),
        "raise_at": rng.randint(0, n) if rng.random() < 0.2 else -1,
        "sleep_ms": rng.choice([0.0, 0.0, 1.0, 5.0]),
        "timeout": rng.choice([0, 0, 20]),
        "drop_last": rng.random() < 0.2,
        "ops": ops,
        "agent": rng.random() < 0.5,
    }


def _worker_pids(loader: DataLoader) -> list[int]:
    pipeline = loader.pipeline
    return [
        w.pid
        for pool in list(pipeline._pools)
        for w in pool.active + pool.retiring
        if w.pid and not w.ended
    ]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _later(seconds: float, fn, *args) -> None:
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()


def run_case(case: dict, log: list) -> None:
    """Run one case; raise on a wrong result."""
    if case["iterable"]:
        dataset = IterData(case["n"], case["width"], case["sleep_ms"])
    else:
        dataset = MapData(case["n"], case["width"], case["raise_at"], case["sleep_ms"])
    loader = DataLoader(
        dataset,
        batch_size=case["batch_size"],
        num_workers=case["num_workers"],
        persistent_workers=case["persistent"] and case["num_workers"] > 0,
        worker_init_fn=INITS[case["init"]],
        fuse=case["fuse"],
        timeout=case["timeout"],
        drop_last=case["drop_last"],
    )
    me = psutil.Process()
    iterator = None
    rows: list[int] = []
    clean = True  # no fault that may fail or cut an epoch
    errors: list[str] = []

    def take(count: int) -> bool:
        nonlocal iterator
        if iterator is None:
            iterator = iter(loader)
        for _ in range(count):
            try:
                batch = next(iterator)
            except StopIteration:
                check_epoch()
                iterator = None
                return False
            except (StageFailed, ValueError, RuntimeError, PipelineStopped) as exc:
                errors.append(type(exc).__name__)
                if isinstance(exc, PipelineStopped) or "ended by" in str(exc):
                    iterator = None
                    return False
                continue
            rows.extend(int(v) for v in batch[:, 0].tolist())
        return True

    def check_epoch() -> None:
        if not clean or case["init"] == "raises" or case["raise_at"] >= 0:
            rows.clear()
            return
        n, b = case["n"], case["batch_size"]
        expected = list(range(n - n % b if case["drop_last"] else n))
        if case["iterable"]:
            if case["drop_last"]:
                assert len(rows) == len(set(rows)), f"a row twice: {rows}"
            else:
                assert sorted(rows) == expected, f"rows {sorted(rows)} != {expected}"
        else:
            assert rows == expected, f"rows {rows} != {expected}"
        rows.clear()

    def new_epoch() -> None:
        nonlocal iterator
        iterator = iter(loader)
        rows.clear()

    agent_stop = threading.Event()
    agent_errors: list[str] = []

    def agent() -> None:
        # As the agent daemon: a sample every few ms, an allocation now and then.
        rng = random.Random(1)
        while not agent_stop.wait(rng.choice([0.005, 0.02, 0.1])):
            try:
                loader.metrics()
                loader.consumer_stats()
                if rng.random() < 0.3:
                    loader.apply({rng.choice(loader.stage_names): rng.randint(1, 4)})
            except Exception as exc:  # noqa: BLE001
                agent_errors.append(repr(exc))

    agent_thread = threading.Thread(target=agent, daemon=True)
    if case.get("agent"):
        agent_thread.start()
    try:
        for op in case["ops"]:
            kind = op[0]
            log.append(kind)
            if kind == "take":
                take(op[1])
            elif kind == "apply":
                names = loader.stage_names
                loader.apply({random.choice(names): op[1]})
            elif kind == "kill":
                pids = _worker_pids(loader)
                if pids:
                    _signal(random.choice(pids), signal.SIGKILL)
                    clean = clean and not case["iterable"]
            elif kind == "stopcont":
                pids = _worker_pids(loader)
                if pids:
                    pid = random.choice(pids)
                    _signal(pid, signal.SIGSTOP)
                    _later(op[1], _signal, pid, signal.SIGCONT)
            elif kind in ("kill_launcher", "stop_launcher"):
                zygote = loader.pipeline._zygote
                if zygote is not None and loader.pipeline._started:
                    if kind == "kill_launcher":
                        _signal(zygote.pid, signal.SIGKILL)
                        clean = clean and not case["iterable"]  # readers die with it
                    else:
                        _signal(zygote.pid, signal.SIGSTOP)
                        _later(op[1], _signal, zygote.pid, signal.SIGCONT)
            elif kind == "break_new":
                if iterator is not None:
                    take(1)
                new_epoch()
                take(1)
            elif kind == "epoch":
                while take(50):
                    pass
            elif kind == "close_thread":
                _later(0.05, loader.close)
                take(5)
                time.sleep(0.1)
                iterator = None
                rows.clear()
            elif kind == "sigint":
                if iterator is None:
                    iterator = iter(loader)
                try:
                    _later(0.02, _signal, os.getpid(), signal.SIGINT)
                    for _ in range(1000):
                        try:
                            next(iterator)
                        except StopIteration:
                            break
                        except (StageFailed, ValueError, RuntimeError):
                            continue
                    time.sleep(0.5)
                except KeyboardInterrupt:
                    log.append("interrupted")
                iterator = None
                rows.clear()
            elif kind == "sleep":
                time.sleep(op[1])
            elif kind in ("sigint_close", "sigint_iter"):
                # Ctrl-C lands inside close() or inside iter() (an epoch's start).
                try:
                    _later(op[1], _signal, os.getpid(), signal.SIGINT)
                    if kind == "sigint_close":
                        loader.close()
                    else:
                        iterator = iter(loader)
                        take(2)
                    time.sleep(0.4)
                except KeyboardInterrupt:
                    log.append("interrupted")
                iterator = None
                rows.clear()
            elif kind == "flurry":
                # Epochs begun and left at once, one after the other.
                for _ in range(op[1]):
                    new_epoch()
                    take(random.choice([0, 1, 2]))
        # The last epoch, whole.
        new_epoch()
        while take(50):
            pass
    finally:
        agent_stop.set()
        if agent_thread.is_alive():
            agent_thread.join(10)
            assert not agent_thread.is_alive(), "the agent's thread is stuck in a call"
        began = time.monotonic()
        iterator = None
        loader.close()
        log.append(f"close {time.monotonic() - began:.2f}s errors={len(errors)}")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"processes left after close(): {left}"
    odd = [e for e in agent_errors if "PipelineStopped" not in e]
    assert not odd, f"the agent's calls raised: {odd[:3]}"


def main() -> None:
    hunt(generate, run_case, CASE_BOUND_S, "loader")


if __name__ == "__main__":
    sys.exit(main())
