"""A hang hunter: generated pipelines under generated sequences of what a training host does
to them, each case in a forked child under a hard bound, stacks dumped on a hang.

What it combines that the stress suites do not: SIGSTOP then SIGCONT of a worker or of the
launcher, bursts of resizes, relayouts, SIGKILLs of workers and of the launcher, a stop()
from another thread, a consumer that leaves early, all in one sequence.

    nice -n 5 .venv/bin/python -m tests.agents.pipeline.hunt --cases 50 [--seed N]

Each case runs in a child forked from this driver; the child dumps every thread's stack
(``faulthandler``) and exits if it passes ``CASE_BOUND_S``; the driver then prints each of
the child's processes' kernel wait channels. A case that fails is printed with the seed that
reproduces it (``--replay SEED``). The tally goes to ``var/hunt-pipeline.json``.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import gc
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path

import psutil

from agents.pipeline import (
    AllocationError,
    LayoutBusy,
    Pipeline,
    PipelineStopped,
    Stage,
    StageFailed,
    shm,
)

CASE_BOUND_S = 60.0
ITEM_BOUND_S = 25.0
# Drawn again since the referrer was found (2026-11-25): a log record that kept a
# LauncherGone, whose traceback held the pool (tests/agents/test_log_records_never_hold_a_pipeline.py).
DRAW_DROP = True
AGENT_BOUND_S = 3.0  # the slowest metrics() an agent thread may see
SIZES = [8, 1024, 70_000, 300_000, 3_000_000]
_CASE_PID = [0]  # the process running the case (a thread stage's function runs there)


_HELD = threading.Lock()  # a lock the "lock" behaviour's threads and processes contend for


class _RefusesPickling:
    """A result whose pickling raises (in a process worker, as its answer is sent)."""

    def __reduce__(self):
        raise ValueError("this result refuses to be pickled")


def _extra(behaviour: str, i: int, raise_at: int, ms: float):
    """What the behaviours added on 2026-11-25 (hunt6) do to item ``i``; a result to return
    instead of the usual one, or ``None``."""
    if behaviour == "io_wait":  # blocked in the kernel on a pipe nobody writes
        r, w = os.pipe()
        try:
            select.select([r], [], [], max(ms, 1.0) / 1000.0)
        finally:
            os.close(r)
            os.close(w)
    elif behaviour == "lock":  # a lock held across a sleep, contended by a thread stage's workers
        with _HELD:
            time.sleep(ms / 1000.0)
    elif behaviour == "subprocess" and i % 7 == 0:  # waits on a child it started
        subprocess.run(["sleep", "0.02"], check=False)
    elif behaviour == "bg_subprocess" and i == raise_at and os.getpid() != _CASE_PID[0]:
        # A child it never waits for (in a process worker: in a thread stage it would be the
        # training process's own child, not the pipeline's to end).
        subprocess.Popen(["sleep", "30"])  # noqa: S603,S607
    elif behaviour == "thread" and i == raise_at:  # a thread left running in the worker
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    elif behaviour == "fork" and i == raise_at and os.getpid() != _CASE_PID[0]:
        if os.fork() == 0:  # a forked child that outlives the item (never in the case's process)
            time.sleep(30)
            os._exit(0)
    elif behaviour == "unpicklable" and i == raise_at:
        return i, threading.Lock()
    elif behaviour == "pickle_raises" and i == raise_at:
        return i, _RefusesPickling()
    return None


def _stage_fn(name: str, size: int, behaviour: str, ms: float, raise_at: int):
    def fn(item):
        i, _ = item
        instead = _extra(behaviour, i, raise_at, ms)
        if instead is not None:
            return instead
        if size < 0:  # huge and tiny items mixed
            return i, bytes(SIZES[(i * 7) % len(SIZES)])
        if behaviour == "raise_stopiteration" and i == raise_at:
            raise StopIteration(f"{name} stops at item {i}")
        if behaviour == "raise" and i == raise_at:
            raise ValueError(f"{name} refuses item {i}")
        if behaviour == "exit" and i == raise_at and os.getpid() != _CASE_PID[0]:
            os._exit(7)  # a process worker dies on this item, every time
        if behaviour == "slow_once" and i == raise_at:
            time.sleep(2.0)
        if behaviour == "sleep":
            time.sleep(ms / 1000.0)
        elif behaviour == "spin":
            end = time.perf_counter() + ms / 1000.0
            while time.perf_counter() < end:
                pass
        return i, bytes(size)

    return fn


def generate(rng: random.Random) -> dict:
    """One case: the pipeline's shape and its operations."""
    n = rng.randint(1, 5)
    items = rng.randint(0, 120)
    stages = []
    for k in range(n):
        behaviour = rng.choice(
            ["none", "sleep", "spin", "raise", "none", "sleep", "exit", "slow_once"]
        )
        stages.append(
            {
                "name": f"s{k}",
                "kind": rng.choice(["process", "process", "thread"]),
                "size": rng.choice(SIZES),
                "behaviour": behaviour,
                "ms": rng.choice([0.0, 0.5, 2.0, 10.0]),
                "raise_at": rng.randint(0, max(items - 1, 0)) if behaviour != "none" else -1,
                "ordered": rng.random() < 0.8,
                "shm_min_bytes": rng.choice([1, 64 * 1024, 64 * 1024]),
            }
        )
    names = [s["name"] for s in stages]
    ops = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.choice(
            [
                "apply", "burst", "relayout", "kill", "stopcont", "kill_launcher",
                "stop_launcher", "consume", "consume", "sleep", "sigint_during",
            ]
        )  # fmt: skip
        if kind == "apply":
            ops.append(["apply", {rng.choice(names): rng.randint(1, 4)}])
        elif kind == "burst":
            ops.append(
                [
                    "burst",
                    [{rng.choice(names): rng.randint(1, 4)} for _ in range(rng.randint(3, 12))],
                ]
            )
        elif kind == "relayout" and n > 1:
            cuts = [rng.random() < 0.5 for _ in range(n - 1)]
            ops.append(["relayout", _groups(names, cuts)])
        elif kind in ("kill", "stopcont"):
            ops.append([kind, rng.randrange(n), rng.choice([0.05, 0.3, 1.0])])
        elif kind in ("kill_launcher", "stop_launcher"):
            ops.append([kind, rng.choice([0.05, 0.3, 1.5])])
        elif kind == "consume":
            ops.append(["consume", rng.randint(0, 30)])
        elif kind == "sigint_during":
            what = rng.choice(["burst", "relayout", "consume"])
            ops.append(["sigint_during", what, rng.choice([0.0, 0.005, 0.02, 0.1])])
        else:
            ops.append(["sleep", rng.choice([0.01, 0.1, 0.5])])
    end = rng.choice(["all", "all", "all", "leave", "stop_thread", "stop_thread_now"])
    layout = None
    if n > 1 and rng.random() < 0.4:
        layout = _groups(names, [rng.random() < 0.5 for _ in range(n - 1)])
    case = {
        "stages": stages,
        "items": items,
        "queue_size": rng.randint(1, 8),
        "layout": layout,
        "ops": ops,
        "end": end,
        "max_item_retries": 2
        if any(s["behaviour"] == "exit" for s in stages)
        else rng.choice([2, 50]),
    }
    _generate_more(rng, case)
    _generate_round3(rng, case)
    return case


EXTRA_BEHAVIOURS = [
    "io_wait", "lock", "subprocess", "bg_subprocess", "thread", "fork", "stopiteration",
    "unpicklable", "pickle_raises", "mixed_sizes",
]  # fmt: skip
# Lenient outcomes: the stage's failure or every item (where the stage ran in a thread, a
# result nobody pickles goes through).
LENIENT = {"unpicklable", "pickle_raises"}


def _generate_more(rng: random.Random, case: dict) -> None:
    """The dimensions added on 2026-11-25 (hunt6), drawn after the others so that every
    earlier seed keeps its case and gains these: stage functions that block on I/O, a lock
    or a subprocess, that leave a subprocess, a thread or a forked child behind, raise
    StopIteration, return what cannot be pickled; huge and tiny items mixed; SIGTERM and
    SIGINT to workers and the launcher; resizes to the ceiling, to 0 (refused) and back; an
    agent thread calling ``metrics()`` all along (its slowest answer bounded); a source that
    raises StopIteration; a file-size limit (``RLIMIT_FSIZE``: shared memory refused); a
    consumer that drops the pipeline unstopped for the collector to end."""
    items = case["items"]
    stages = case["stages"]
    names = [s["name"] for s in stages]
    for stage in stages:
        if rng.random() < 0.3:
            stage["behaviour"] = rng.choice(EXTRA_BEHAVIOURS)
            stage["raise_at"] = rng.randint(0, max(items - 1, 0))
            if stage["behaviour"] == "mixed_sizes":
                stage["behaviour"], stage["size"] = "none", -1
            elif stage["behaviour"] == "stopiteration":
                stage["behaviour"] = "raise_stopiteration"
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(
            ["signal_worker", "signal_launcher", "ceiling", "zero", "metrics_gap", "long_stop",
             "timed", "timed"]
        )  # fmt: skip
        at = rng.randrange(len(case["ops"]) + 1)
        if kind == "signal_worker":
            op = ["signal_worker", rng.randrange(len(stages)), rng.choice(["SIGTERM", "SIGINT"])]
        elif kind == "signal_launcher":
            op = ["signal_launcher", rng.choice(["SIGTERM", "SIGINT"])]
        elif kind == "ceiling":
            op = ["apply", {name: 4 for name in names}]
        elif kind == "zero":
            op = ["zero", rng.choice(names), rng.choice([0, 10**6])]
        elif kind == "timed":  # a signal at a random moment of what follows, from a timer
            op = [
                "timed",
                rng.choice(["worker", "worker", "launcher"]),
                rng.choice(["SIGKILL", "SIGTERM", "SIGSTOP"]),
                rng.choice([0.0, 0.01, 0.05, 0.2, 0.6]),
            ]
        elif kind == "long_stop":  # a launcher stopped past its request timeout, then resizes
            op = ["stop_launcher", 12.0]
            case["ops"].insert(at, ["burst", [{rng.choice(names): rng.randint(1, 4)}] * 3])
        else:
            op = ["sleep", rng.choice([0.05, 0.5])]
        case["ops"].insert(at, op)
    case["agent"] = rng.random() < 0.5  # a thread calling metrics() every 10 ms
    case["source_stops_at"] = rng.randint(0, items) if rng.random() < 0.1 else None
    case["fsize_limit"] = rng.choice([None] * 9 + [200_000])
    if rng.random() < 0.15 and DRAW_DROP:
        case["end"] = "drop"


def _generate_round3(rng: random.Random, case: dict) -> None:
    """The dimensions added on 2026-11-29 (phunt), drawn last so that every earlier seed
    keeps its case: a stage whose items are empty (0 bytes) or 16 MB (few items), one stage
    far slower than the others (30 ms an item beside stages of none), and resizes from a
    thread while a relayout runs and the consumer takes items slowly."""
    stages = case["stages"]
    if rng.random() < 0.15:
        rng.choice(stages)["size"] = 0
    if rng.random() < 0.08 and case["items"] <= 40:
        rng.choice(stages)["size"] = 16_000_000
    plain = [s for s in stages if s["behaviour"] == "none"]
    if rng.random() < 0.15 and plain:
        uneven = rng.choice(plain)
        uneven["behaviour"], uneven["ms"] = "sleep", 30.0
    if rng.random() < 0.15:
        at = rng.randrange(len(case["ops"]) + 1)
        case["ops"].insert(at, ["resize_relayout_slow", rng.randint(3, 10)])


def _resize_relayout_slow(pipeline: Pipeline, stages: list, count: int, take) -> None:
    """Resizes from a thread while a relayout runs, then ``count`` items taken slowly."""
    names = [s.name for s in stages]

    def resizes() -> None:
        for k in range(6):
            try:
                pipeline.apply(_in_layout(pipeline, {names[k % len(names)]: 1 + k % 4}))
            except (KeyError, LayoutBusy, AllocationError, PipelineStopped):
                pass

    thread = threading.Thread(target=resizes, name="hunt-resizes", daemon=True)
    thread.start()
    if len(names) > 1:
        try:
            pipeline.relayout(["+".join(names)] if len(pipeline.stage_names) > 1 else names,
                              timeout_s=1.0)  # fmt: skip
        except LayoutBusy:
            pass
    for _ in range(count):
        take(1)
        time.sleep(0.02)
    thread.join(ITEM_BOUND_S)
    assert not thread.is_alive(), "apply() from a thread still waits after a relayout"


def _groups(names: list[str], cuts: list[bool]) -> list[str]:
    groups, current = [], [names[0]]
    for name, cut in zip(names[1:], cuts, strict=True):
        if cut:
            groups.append("+".join(current))
            current = []
        current.append(name)
    return [*groups, "+".join(current)]


def _in_layout(pipeline: Pipeline, allocation: dict[str, int]) -> dict[str, int]:
    group_of = {unit: group for group in pipeline.stage_names for unit in group.split("+")}
    result: dict[str, int] = {}
    for unit, count in allocation.items():
        group = group_of.get(unit, unit)
        result[group] = max(result.get(group, 1), count)
    return result


def _workers(pipeline: Pipeline, stage: int) -> list:
    pools = list(pipeline._pools)
    if not pools:
        return []
    pools = [pools[stage % len(pools)], *(p for run in pipeline._draining for p in run)]
    return [w for pool in pools for w in pool.active + pool.retiring if w.pid and not w.ended]


def _fire(ref, target: str, signum: int) -> None:
    """A signal to a random worker or to the launcher, from a timer (a random moment)."""
    pipeline = ref()
    if pipeline is None:
        return
    if target == "launcher":
        zygote = pipeline._zygote
        if zygote is None:
            return
        send = functools.partial(_signal_pid, zygote.pid)
    else:
        workers = _workers(pipeline, random.randrange(8))
        if not workers:
            return
        send = random.choice(workers).signal  # through its pidfd: never a reused pid
    send(signum)
    if signum == signal.SIGSTOP:
        _later(random.choice([0.05, 0.3, 1.0]), send, signal.SIGCONT)


def _later(seconds: float, fn, *args) -> None:
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()


def _signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def run_case(case: dict, log: list) -> None:
    """Run one case in this process; raise on a wrong result (a hang is the bound's)."""
    _CASE_PID[0] = os.getpid()
    stages = [
        Stage(
            s["name"],
            _stage_fn(s["name"], s["size"], s["behaviour"], s["ms"], s["raise_at"]),
            kind=s["kind"],
            ordered=s["ordered"],
            max_workers=4,
            shm_min_bytes=s["shm_min_bytes"],
        )
        for s in case["stages"]
    ]
    items = case["items"]
    stops_at = case.get("source_stops_at")
    if case.get("fsize_limit"):
        # Shared memory past the limit is refused (EFBIG; SIGXFSZ ignored, as a job under a
        # quota would set it, else the writer dies): what a full /dev/shm cannot simulate.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (case["fsize_limit"], hard))

    def source():
        for i in range(items):
            if i == stops_at:
                raise StopIteration(f"the source stops at {i}")  # a RuntimeError (PEP 479)
            yield i, b"x"

    pipeline = Pipeline(
        source,
        stages,
        queue_size=case["queue_size"],
        name="hunt",
        layout=case["layout"],
        max_item_retries=case["max_item_retries"],
        item_timeout_s=ITEM_BOUND_S,
    )
    pipeline.start()
    prefix = pipeline._prefix
    received: list[int] = []
    error: list[BaseException] = []
    iterator = iter(pipeline)
    agent_done = threading.Event()
    agent_slowest = [0.0]
    agent_errors: list[BaseException] = []

    def agent() -> None:
        while not agent_done.is_set():
            began = time.monotonic()
            try:
                pipeline.metrics(by_unit=True)
                pipeline.allocation  # noqa: B018
            except PipelineStopped:
                return
            except BaseException as exc:  # noqa: BLE001
                agent_errors.append(exc)
                return
            agent_slowest[0] = max(agent_slowest[0], time.monotonic() - began)
            agent_done.wait(0.01)

    agent_thread = None
    if case.get("agent"):
        agent_thread = threading.Thread(target=agent, name="hunt-agent", daemon=True)
        agent_thread.start()
    done = False
    stopped_by_thread = False

    def take(count: int) -> None:
        nonlocal done
        for _ in range(count):
            if done:
                return
            try:
                item = next(iterator)
            except StopIteration:
                done = True
                return
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001
                error.append(exc)
                done = True
                return
            received.append(item[0])

    for op in case["ops"]:
        log.append(op[0])
        kind = op[0]
        if kind == "apply":
            pipeline.apply(_in_layout(pipeline, op[1]))
        elif kind == "burst":
            for allocation in op[1]:
                pipeline.apply(_in_layout(pipeline, allocation))
        elif kind == "relayout":
            try:
                pipeline.relayout(op[1], timeout_s=1.0)
            except LayoutBusy:
                pass
        elif kind == "kill":
            workers = _workers(pipeline, op[1])
            if workers:
                random.choice(workers).signal(signal.SIGKILL)
        elif kind == "stopcont":
            workers = _workers(pipeline, op[1])
            if workers:
                w = random.choice(workers)
                _signal_pid(w.pid, signal.SIGSTOP)
                _later(op[2], _signal_pid, w.pid, signal.SIGCONT)
        elif kind == "signal_worker":
            workers = _workers(pipeline, op[1])
            if workers:
                random.choice(workers).signal(getattr(signal, op[2]))
        elif kind == "signal_launcher":
            if pipeline._zygote is not None:
                _signal_pid(pipeline._zygote.pid, getattr(signal, op[1]))
        elif kind == "timed":
            # Weakly: a timer still waiting must not keep a dropped pipeline alive.
            _later(op[3], _fire, weakref.ref(pipeline), op[1], getattr(signal, op[2]))
        elif kind == "zero":
            try:
                pipeline.apply({op[1]: op[2] if len(op) > 2 else 0})
                raise AssertionError("an allocation of 0 workers was taken")
            except AllocationError:
                pass
            except KeyError:
                pass  # the stage is fused under another name now
        elif kind == "kill_launcher":
            if pipeline._zygote is not None:
                _signal_pid(pipeline._zygote.pid, signal.SIGKILL)
        elif kind == "stop_launcher":
            if pipeline._zygote is not None:
                pid = pipeline._zygote.pid
                _signal_pid(pid, signal.SIGSTOP)
                _later(op[1], _signal_pid, pid, signal.SIGCONT)
        elif kind == "consume":
            take(op[1])
        elif kind == "resize_relayout_slow":
            _resize_relayout_slow(pipeline, stages, op[1], take)
        elif kind == "sleep":
            time.sleep(op[1])
        elif kind == "sigint_during":
            # Ctrl-C lands in an operation: the pipeline must stay whole.
            try:
                _later(op[2], _signal_pid, os.getpid(), signal.SIGINT)
                if op[1] == "burst":
                    for count in (4, 1, 3, 1, 4, 2):
                        pipeline.apply({pipeline.stage_names[0]: count})
                elif op[1] == "relayout" and len(stages) > 1:
                    for groups in (None, "+".join(s.name for s in stages), None):
                        try:
                            pipeline.relayout(groups, timeout_s=0.3)
                        except LayoutBusy:
                            pass
                else:
                    take(5)
                time.sleep(0.2)
            except KeyboardInterrupt:
                log.append("interrupted")
    end = case["end"]
    if end in ("stop_thread", "stop_thread_now"):
        stopped_by_thread = True
        _later(0.0 if end == "stop_thread_now" else 0.2, pipeline.stop)
        take(items + 1)
        began = time.monotonic()
        pipeline.stop()
        log.append(f"stop {time.monotonic() - began:.2f}s")
    elif end == "leave":
        pipeline.stop()
    elif end == "drop":
        # The consumer breaks out and drops every reference, never stopping: the collector
        # stops the pipeline (``Pipeline.__del__``, in a thread of its own).
        take(min(items, 5))
        agent_done.set()
        if agent_thread is not None:
            agent_thread.join(AGENT_BOUND_S + 10)
        # A StageFailed kept here holds the pipeline through its traceback's frames.
        error.clear()
        ref = weakref.ref(pipeline)
        del iterator, pipeline
        gc.collect()
        # Collected first: until then its monitor may start a launcher again, and a moment
        # with none (a killed one not yet replaced) read as nothing left.
        _wait_for(lambda: ref() is None, 15.0)
        assert ref() is None, "the dropped pipeline was not collected within 15 s"
        _wait_for(lambda: not _left_over(prefix), 15.0)
    else:
        take(items + 1)
        began = time.monotonic()
        pipeline.stop()
        log.append(f"stop {time.monotonic() - began:.2f}s")
    agent_done.set()
    # The launcher sweeps after it leaves; what a worker started is ended as it does.
    _wait_for(lambda: not _left_over(prefix), 5.0)
    assert not _left_over(prefix), f"left after the stop: {_left_over(prefix)}"
    assert not agent_errors, f"metrics() raised {agent_errors[0]!r}"
    # metrics() answers promptly whatever the launcher does (stopped, killed, slow).
    assert agent_slowest[0] < AGENT_BOUND_S, f"metrics() took {agent_slowest[0]:.1f} s"
    log.append(f"agent {agent_slowest[0]:.2f}s")
    # Every item once; in order when every stage is ordered.
    assert len(received) == len(set(received)), f"an item came twice: {received}"
    ordered = all(s["ordered"] for s in case["stages"])
    if ordered:
        assert received == list(range(len(received))), f"out of order: {received}"
    if end in ("leave", "drop"):
        return
    if stopped_by_thread:
        if error:
            assert isinstance(error[0], (PipelineStopped, StageFailed)), repr(error[0])
        return
    lenient = [s["raise_at"] for s in case["stages"] if s["behaviour"] in LENIENT]
    if (lenient and min(lenient) < items) or case.get("fsize_limit"):
        if error:
            assert isinstance(error[0], StageFailed), repr(error[0])
            return
    raises = [
        s["raise_at"] for s in case["stages"] if s["behaviour"] in ("raise", "raise_stopiteration")
    ]
    if stops_at is not None and stops_at < items and error:
        assert isinstance(error[0], StageFailed), repr(error[0])
        return
    exits = [s["raise_at"] for s in case["stages"] if s["behaviour"] == "exit"]
    if exits and min(exits) < items:
        # A process worker dies on that item every time (a thread stage's does not): its
        # failure, or every item where the stage ran in this process.
        if error:
            assert isinstance(error[0], StageFailed), repr(error[0])
            return
    if raises and min(raises) < items:
        assert error and isinstance(error[0], StageFailed), f"expected StageFailed: {error!r}"
        if ordered:
            assert received == list(range(min(raises))), received
        return
    assert not error, f"unexpected error: {''.join(traceback.format_exception(error[0]))}"
    assert sorted(received) == list(range(items)), (
        f"{items - len(set(received))} item(s) lost: got {len(received)} of {items}"
    )


def _wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _left_over(prefix: str) -> list[str]:
    """The pipeline's shared-memory files and processes still there: this process's
    descendants, and any process carrying the pipeline's mark (what a worker started)."""
    left = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(prefix)]
    mark = f"INTUNE_PIPELINE={prefix}".encode()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                left.append(f"child {child.pid} {child.name()}")
        except psutil.Error:
            pass
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as environ:
                    if mark in environ.read().split(b"\0"):
                        left.append(f"marked {name}")
            except OSError:
                pass
    return left


def wchans(pid: int) -> str:
    """The kernel wait channel of ``pid``'s threads and of its children's, for a hang's report."""
    lines = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/wchan") as f:
                    wchan = f.read()
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{p}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                lines.append(f"pid {p} tid {tid} {comm} {state} {wchan}")
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return "\n".join(lines)


def run_forked(fn, arg, bound_s: float, log_path: Path) -> tuple[str, float, str]:
    """Run ``fn(arg, log)`` in a forked child: ("ok" | "fail" | "hang", seconds, report)."""
    read_fd, write_fd = os.pipe()
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            with open(log_path, "w") as out:
                faulthandler.dump_traceback_later(bound_s, exit=True, file=out)
                log: list = []
                try:
                    fn(arg, log)
                    message = "ok " + " ".join(map(str, log))
                except BaseException:  # noqa: BLE001
                    code = 3
                    message = " ".join(map(str, log)) + "\n" + traceback.format_exc()
                faulthandler.cancel_dump_traceback_later()
            os.write(write_fd, message.encode()[-60000:])
        finally:
            os._exit(code)
    os.close(write_fd)
    report = b""
    status = None
    deadline = began + bound_s + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > began + bound_s - 1 and status is None:
            pass
        time.sleep(0.05)
    else:
        kernel = wchans(pid)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return "hang", time.monotonic() - began, kernel + "\n" + log_path.read_text()[-20000:]
    took = time.monotonic() - began
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        report += chunk
    os.close(read_fd)
    code = os.waitstatus_to_exitcode(status)
    text = report.decode(errors="replace")
    if code == 0:
        return "ok", took, text
    if code == 1 and not text:  # faulthandler's exit: the bound passed
        return "hang", took, log_path.read_text()[-20000:]
    return "fail", took, text + log_path.read_text()[-5000:]


def take_ctrl_c() -> None:
    """Take SIGINT as a script in a terminal does (``KeyboardInterrupt``): the cases send it to
    themselves as a Ctrl-C. A hunter started in the background (``cmd &`` from a script, or
    ``nohup``) starts with SIGINT ignored, which Python keeps and its children inherit: every
    case's Ctrl-C then did nothing, and a case that waits for one in a loop of timeouts (the
    loader hunter's "sigint" with a ``worker_init_fn`` that hangs) was reported as a hang
    (seeds 97018, 97033, 97102, 97117; none repeated when replayed in the foreground)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def hunt(generate, run_case, bound_s: float, name: str) -> None:
    """The hunters' command line: ``--cases N`` generated cases from ``--seed S`` (or
    ``--replay SEED``), each run forked under ``bound_s``; every case that failed or hung is
    printed with its report, and the tally is kept in ``var/hunt-{name}.json``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--replay", type=int, default=None)
    args = parser.parse_args()
    take_ctrl_c()
    out = Path(__file__).resolve().parents[3] / "var"
    out.mkdir(exist_ok=True)
    tally = {"cases": 0, "ok": 0, "fail": 0, "hang": 0, "longest_s": 0.0, "found": []}
    seeds = [args.replay] if args.replay is not None else [args.seed + k for k in range(args.cases)]
    for seed in seeds:
        case = generate(random.Random(seed))
        outcome, took, report = run_forked(
            run_case, case, bound_s, out / f"hunt-{name}-case-{os.getpid()}.log"
        )
        tally["cases"] += 1
        tally[outcome] += 1
        tally["longest_s"] = max(tally["longest_s"], round(took, 2))
        print(
            f"seed {seed}: {outcome} in {took:.1f}s",
            report.splitlines()[0][:200] if outcome == "ok" and report else "",
            flush=True,
        )
        if outcome != "ok":
            tally["found"].append({"seed": seed, "outcome": outcome, "case": case})
            print(json.dumps(case), "\n", report[-8000:], flush=True)
        (out / f"hunt-{name}.json").write_text(json.dumps(tally, indent=1) + "\n")
    print(json.dumps({k: v for k, v in tally.items() if k != "found"}))


def main() -> None:
    hunt(generate, run_case, CASE_BOUND_S, "pipeline")


if __name__ == "__main__":
    sys.exit(main())
