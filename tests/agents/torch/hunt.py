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

import gc
import os
import random
import signal
import subprocess
import sys
import threading
import time
import warnings

import psutil
import torch

from agents.pipeline import PipelineStopped, StageFailed
from agents.torch import DataLoader
from tests.agents.pipeline.hunt import hunt
from tests.support.processes import still_running

CASE_BOUND_S = 90.0
AGENT_BOUND_S = 3.0  # the slowest metrics() the agent's thread may see
warnings.filterwarnings("ignore", message="This DataLoader will create")


class MapData(torch.utils.data.Dataset):
    """Rows ``0..n-1``, each a tensor holding its index; one may raise; each may sleep."""

    def __init__(
        self, n: int, width: int, raise_at: int, sleep_ms: float, row: str = "none", at: int = -1
    ) -> None:
        self.n, self.width, self.raise_at, self.sleep_ms = n, width, raise_at, sleep_ms
        self.row, self.at = row, at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.raise_at:
            raise ValueError(f"row {i} is bad")
        odd = _odd_row(self.row, i, self.at)
        if odd is _NONE:
            return None  # default_collate refuses it: the epoch's error
        if odd is _LOCK:
            return threading.Lock()  # neither collated nor pickled: the epoch's error
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        return torch.full((self.width,), float(i))


class IterData(torch.utils.data.IterableDataset):
    """Rows ``0..n-1`` split among torch's workers (``get_worker_info``); worker 0 sleeps
    ``slow_ms`` more a row (a reader persistently slower than the others)."""

    def __init__(self, n: int, width: int, sleep_ms: float, slow_ms: float = 0.0) -> None:
        self.n, self.width, self.sleep_ms, self.slow_ms = n, width, sleep_ms, slow_ms

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k, self.n, of):
            pause = self.sleep_ms + (self.slow_ms if k == 0 else 0.0)
            if pause:
                time.sleep(pause / 1000)
            yield torch.full((self.width,), float(i))


def torchs_iterable_order(n: int, batch_size: int, drop_last: bool, workers: int) -> list[int]:
    """The rows of ``IterData(n)`` in the order torch's loader yields them: each worker's
    batches of its share, the workers in turns, a worker whose share ended dropping out."""
    of = max(1, workers)
    batches = []
    for k in range(of):
        share = list(range(k, n, of))
        chunks = [share[i : i + batch_size] for i in range(0, len(share), batch_size)]
        if drop_last and chunks and len(chunks[-1]) < batch_size:
            chunks.pop()
        batches.append(chunks)
    rows: list[int] = []
    for turn in range(max((len(c) for c in batches), default=0)):
        for chunks in batches:
            if turn < len(chunks):
                rows.extend(chunks[turn])
    return rows


_INITS: dict[str, object] = {}


def init_ok(worker_id: int) -> None:
    os.environ["HUNT_WORKER"] = str(worker_id)


def init_slow(worker_id: int) -> None:
    time.sleep(0.3)


def init_raises(worker_id: int) -> None:
    raise RuntimeError(f"worker {worker_id} cannot start")


def init_exits(worker_id: int) -> None:
    os._exit(3)  # every worker, as it starts


def init_sysexit_0(worker_id: int) -> None:
    if worker_id == 0:
        sys.exit(4)


def init_hangs_0(worker_id: int) -> None:
    if worker_id == 0:
        time.sleep(1000)  # the loader's timeout (HANG_TIMEOUT_S) bounds each wait on it


HANG_TIMEOUT_S = 1.0

INITS = {
    "none": None, "ok": init_ok, "slow": init_slow, "raises": init_raises,
    "exits": init_exits, "sysexit_0": init_sysexit_0, "hangs_0": init_hangs_0,
}  # fmt: skip
# What may fail or cut an epoch (its rows are not checked).
FAILING_INITS = ("raises", "exits", "sysexit_0", "hangs_0")
_HELD = threading.Lock()
# Rows that make the epoch fail (a batch that cannot be collated or sent), so not checked.
FAILING_ROWS = {"none_row", "unpicklable"}


def _odd_row(row: str, i: int, at: int):
    """What the row behaviours added on 2026-11-25 (hunt6) do to row ``i``: a row to return
    instead of the usual one, or ``None``."""
    in_worker = torch.utils.data.get_worker_info() is not None
    if row == "lock":  # a lock held across a sleep
        with _HELD:
            time.sleep(0.002)
    elif row == "subprocess" and i % 9 == 0:  # waits on a child it started
        subprocess.run(["sleep", "0.01"], check=False)
    elif row == "bg_subprocess" and i == at and in_worker:  # a child it never waits for
        subprocess.Popen(["sleep", "30"])  # noqa: S603,S607
    elif row == "thread" and i == at:  # a thread left running
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    elif row == "none_row" and i == at:
        return _NONE
    elif row == "unpicklable" and i == at:
        return _LOCK
    return None


_NONE = object()
_LOCK = object()


def generate(rng: random.Random) -> dict:
    """One case: a loader, and the epochs and faults of its training loop."""
    iterable = rng.random() < 0.35
    n = rng.randint(0, 80)
    ops = []
    for _ in range(rng.randint(1, 10)):
        kind = rng.choice(
            ["take", "take", "apply", "kill", "stopcont", "kill_launcher", "stop_launcher",
             "break_new", "close_thread", "sigint", "epoch", "sleep", "flurry",
             "sigint_close", "sigint_iter", "zip"]
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
        elif kind == "zip":
            ops.append(["zip", rng.randint(0, 6)])
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
        "init": rng.choice(
            ["none", "none", "ok", "slow", "raises", "exits", "sysexit_0", "hangs_0"]
        ),
        "raise_at": rng.randint(0, n) if rng.random() < 0.2 else -1,
        "sleep_ms": rng.choice([0.0, 0.0, 1.0, 5.0]),
        "slow_ms": rng.choice([0.0, 0.0, 3.0, 10.0]),
        "timeout": rng.choice([0, 0, 20]),
        "drop_last": rng.random() < 0.2,
        "ops": ops,
        "agent": rng.random() < 0.5,
        **_generate_more(rng, n, ops),
        **_generate_round3(rng, ops),
    }


def _generate_more(rng: random.Random, n: int, ops: list) -> dict:
    """The dimensions added on 2026-11-25 (hunt6), drawn after the others so that each
    earlier seed keeps its case: rows that block on a lock or a subprocess, leave a
    subprocess or a thread behind, are ``None`` or cannot be pickled; SIGTERM to a worker; a
    launcher stopped past its request timeout while the loop resizes; the agent's slowest
    ``metrics()`` bounded; a loader dropped without ``close()`` (the collector's to end)."""
    for _ in range(rng.randint(0, 2)):
        at = rng.randrange(len(ops) + 1)
        if rng.random() < 0.5:
            ops.insert(at, ["sigterm"])
        else:
            ops.insert(at, ["stop_launcher", 12.0])
            ops.insert(at + 1, ["apply", rng.randint(2, 4)])
    return {
        "row": rng.choice(
            ["none"] * 6
            + ["lock", "subprocess", "bg_subprocess", "thread", "none_row", "unpicklable"]
        ),
        "row_at": rng.randint(0, max(n - 1, 0)),
        "drop": rng.random() < 0.15,
    }


def _generate_round3(rng: random.Random, ops: list) -> dict:
    """The dimensions added on 2026-11-30, drawn after ``_generate_more`` (every earlier seed
    keeps its case and gains these): ``prefetch_factor`` and ``pin_memory``; a second loader
    (a validation set) read whole while the first's epoch is under way and its faults land;
    a loop that raises mid-epoch and keeps the exception (its traceback holds the iterator)
    into what follows; a child forked mid-epoch that collects and exits."""
    for _ in range(rng.randint(0, 2)):
        at = rng.randrange(len(ops) + 1)
        kind = rng.choice(["valid", "raise_loop", "fork"])
        ops.insert(at, [kind, rng.randint(0, 3)])
    return {
        "prefetch_factor": rng.choice([None, None, 1, 4]),
        "pin_memory": rng.random() < 0.2,
    }


class LoopError(Exception):
    """What the "raise_loop" op's training loop raises mid-epoch."""


def _valid_rows(loader: DataLoader, workers: int, take) -> list[int]:
    """A second loader of 23 rows (``workers`` workers) read whole, one ``take(1)`` of the
    first loader between each of its batches: its rows, in order."""
    valid = DataLoader(MapData(23, 3, -1, 0.0), batch_size=4, num_workers=workers)
    rows: list[int] = []
    try:
        for batch in valid:
            rows.extend(int(v) for v in batch[:, 0].tolist())
            take(1)
    finally:
        valid.close()
    return rows


def _fork_child(bound_s: float = 60.0) -> int | str:
    """A child forked mid-epoch collects and exits: its status (or "hung" past ``bound_s``)."""
    pid = os.fork()
    if pid == 0:
        try:
            gc.collect()
        finally:
            os._exit(0)
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    _signal(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


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
        dataset = IterData(case["n"], case["width"], case["sleep_ms"], case.get("slow_ms", 0.0))
    else:
        dataset = MapData(
            case["n"],
            case["width"],
            case["raise_at"],
            case["sleep_ms"],
            case.get("row", "none"),
            case.get("row_at", -1),
        )
    loader = DataLoader(
        dataset,
        batch_size=case["batch_size"],
        num_workers=case["num_workers"],
        persistent_workers=case["persistent"] and case["num_workers"] > 0,
        worker_init_fn=INITS[case["init"]],
        fuse=case["fuse"],
        # A worker_init_fn that hangs holds its worker's batches as torch's does: the
        # loader's timeout bounds each wait on them, as torch's.
        timeout=HANG_TIMEOUT_S if case["init"] == "hangs_0" else case["timeout"],
        drop_last=case["drop_last"],
        prefetch_factor=case.get("prefetch_factor") if case["num_workers"] else None,
        pin_memory=case.get("pin_memory", False),
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
            except (StageFailed, ValueError, RuntimeError, PipelineStopped, TypeError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:400])
                hung = case["init"] == "hangs_0" and "timed out after" in str(exc)
                if isinstance(exc, PipelineStopped) or "ended by" in str(exc) or hung:
                    # A hung worker_init_fn: its worker's batches never come (torch's
                    # neither); the epoch is left.
                    iterator = None
                    return False
                continue
            rows.extend(int(v) for v in batch[:, 0].tolist())
        return True

    def check_epoch() -> None:
        failing = case.get("row") in FAILING_ROWS and not case["iterable"]
        if not clean or case["init"] in FAILING_INITS or case["raise_at"] >= 0 or failing:
            rows.clear()
            return
        n, b = case["n"], case["batch_size"]
        expected = list(range(n - n % b if case["drop_last"] else n))
        if case["iterable"]:
            # torch's turns, however slow reader 0 is (agents.torch.steps.Read).
            turns = torchs_iterable_order(n, b, case["drop_last"], case["num_workers"])
            assert rows == turns, f"rows {rows} != torch's {turns}"
        else:
            assert rows == expected, f"rows {rows} != {expected}; errors {errors[-3:]}"
        rows.clear()

    def new_epoch() -> None:
        nonlocal iterator
        iterator = iter(loader)
        rows.clear()

    kept = None  # the "raise_loop" op's exception, kept (its traceback holds the iterator)
    agent_stop = threading.Event()
    agent_errors: list[str] = []
    agent_slowest = [0.0]

    def agent() -> None:
        # As the agent daemon: a sample every few ms, an allocation now and then.
        rng = random.Random(1)
        while not agent_stop.wait(rng.choice([0.005, 0.02, 0.1])):
            try:
                began = time.monotonic()
                loader.metrics()
                agent_slowest[0] = max(agent_slowest[0], time.monotonic() - began)
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
            elif kind == "sigterm":
                pids = _worker_pids(loader)
                if pids:
                    _signal(random.choice(pids), signal.SIGTERM)
                    clean = clean and not case["iterable"]
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
                        except (StageFailed, ValueError, RuntimeError, TypeError):
                            continue
                    time.sleep(0.5)
                except KeyboardInterrupt:
                    log.append("interrupted")
                iterator = None
                rows.clear()
            elif kind == "sleep":
                time.sleep(op[1])
            elif kind == "valid":
                got = _valid_rows(loader, op[1] % 3, take)
                assert got == list(range(23)), f"the second loader's rows {got}"
            elif kind == "raise_loop":

                def loop(count: int) -> None:
                    take(count)
                    raise LoopError(count)

                try:
                    loop(op[1])
                except LoopError as exc:
                    kept = exc
            elif kind == "fork":
                status = _fork_child()
                assert status == 0, f"a child forked mid-epoch ended {status}"
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
            elif kind == "zip":
                # Two iterators at once: each its own epoch, or (persistent) the same one,
                # reset, as torch's; left after op[1] pairs.
                pairs = 0
                try:
                    for _pair in zip(loader, loader, strict=False):
                        pairs += 1
                        if pairs >= op[1]:
                            break
                except (StageFailed, ValueError, RuntimeError, PipelineStopped) as exc:
                    errors.append(type(exc).__name__)
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
        del kept
        agent_stop.set()
        if agent_thread.is_alive():
            agent_thread.join(10)
            assert not agent_thread.is_alive(), "the agent's thread is stuck in a call"
        began = time.monotonic()
        iterator = None
        if case.get("drop"):
            # Dropped without close(): the collector ends its workers.
            del loader, agent
            gc.collect()
            log.append(f"dropped errors={len(errors)}")
        else:
            loader.close()
            log.append(f"close {time.monotonic() - began:.2f}s errors={len(errors)}")
    deadline = time.monotonic() + (15 if case.get("drop") else 5)
    while time.monotonic() < deadline:
        # A child may end between the listing and its status: still_running() allows for it.
        left = still_running(c.pid for c in me.children(recursive=True))
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"processes left after close(): {left}"
    odd = [e for e in agent_errors if "PipelineStopped" not in e]
    assert not odd, f"the agent's calls raised: {odd[:3]}"
    # metrics() answers promptly whatever the launcher does (stopped past its timeout).
    assert agent_slowest[0] < AGENT_BOUND_S, f"metrics() took {agent_slowest[0]:.1f} s"
    log.append(f"agent {agent_slowest[0]:.2f}s")


def main() -> None:
    hunt(generate, run_case, CASE_BOUND_S, "loader")


if __name__ == "__main__":
    sys.exit(main())
