"""Generated pipelines driven from several threads at once, as a training script and its agent
drive one: resizes, relayouts, measurements, SIGKILL, SIGSTOP and SIGCONT of worker processes
each from a thread of its own, one to three consumer threads, and a stop from yet another
thread at a generated moment (or after the source's end, or no stop: the pipeline dropped
and collected). Every call returns within its bound, the consumers share the items each once
and in order per consumer (or end with ``PipelineStopped``), the stop keeps its bound even
with a worker left stopped, and nothing is left: no process, thread or shared-memory file.

``stress.py`` drives its operations one at a time from the test's thread; these cases are
the interleavings it cannot make. The short form runs in ``make test``, the long one in
``make soak``. Found with these: ``metrics(by_unit=True)`` raised during a relayout, and
every consumer thread but one waited for ever at the source's end.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import threading
import time
from dataclasses import dataclass

import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.pipeline import LayoutBusy, Pipeline, PipelineStopped, Stage

CALL_BOUND_S = 12.0  # one apply, relayout or metrics call (a launcher request is 10 s at most)
STOP_TIMEOUT_S = 1.0
STOP_BOUND_S = STOP_TIMEOUT_S + 3.0
CONSUMER_BOUND_S = 60.0
NAMES = ["a", "b", "c", "d"]


def step(item: tuple[int, int]) -> tuple[int, int]:
    """Pass the item's number on, after a millisecond's sleep."""
    time.sleep(0.001)
    return item


@dataclass(frozen=True)
class Case:
    kinds: tuple[str, ...]
    items: int
    queue_size: int
    consumers: int
    drivers: tuple[str, ...]  # the operations, each run in a thread of its own
    stop_after_s: float | None  # None: stop once the consumers are done
    seed: int
    dropped: bool = False  # with stop_after_s None: dropped, not stopped (collected instead)


@st.composite
def cases(draw) -> Case:
    n = draw(st.integers(1, 4))
    return Case(
        kinds=tuple(draw(st.lists(st.sampled_from(["process", "thread"]), min_size=n, max_size=n))),
        items=draw(st.integers(0, 400)),
        queue_size=draw(st.integers(1, 6)),
        consumers=draw(st.integers(1, 3)),
        drivers=tuple(
            draw(
                st.lists(
                    st.sampled_from(["apply", "relayout", "signal", "metrics"]),
                    min_size=1,
                    max_size=4,
                    unique=True,
                )
            )
        ),
        stop_after_s=draw(st.none() | st.floats(0.05, 2.0)),
        seed=draw(st.integers(0, 2**16)),
        dropped=draw(st.booleans()),
    )


def _layouts(names: list[str], rng: random.Random) -> str:
    groups, current = [], [names[0]]
    for name in names[1:]:
        if rng.random() < 0.5:
            groups.append("+".join(current))
            current = [name]
        else:
            current.append(name)
    groups.append("+".join(current))
    return ",".join(groups)


def _drive(kind: str, pipeline: Pipeline, names: list[str], seed: int, done, stalls) -> None:
    """Run one operation over and over until ``done``; a call past its bound is a stall."""
    rng = random.Random(f"{kind}-{seed}")
    stopped: list[int] = []
    while not done.is_set():
        began = time.monotonic()
        try:
            if kind == "apply":
                pipeline.apply({s: rng.randint(1, 4) for s in pipeline.stage_names})
            elif kind == "relayout":
                pipeline.relayout(_layouts(names, rng), timeout_s=1.0)
            elif kind == "metrics":
                rows = pipeline.metrics(by_unit=True)
                assert [r["name"] for r in rows] == names
                pipeline.consumer_stats()
            elif kind == "signal":
                workers = [p.pid for pool in list(pipeline._pools) for p in pool.processes()]
                if workers:
                    pid = rng.choice(workers)
                    sent = rng.choice([signal.SIGKILL, signal.SIGSTOP])
                    os.kill(pid, sent)
                    if sent == signal.SIGSTOP:
                        stopped.append(pid)
                # Most stopped workers go on again; one may be left stopped for the stop.
                if stopped and rng.random() < 0.7:
                    os.kill(stopped.pop(0), signal.SIGCONT)
        except (LayoutBusy, PipelineStopped, ProcessLookupError):
            pass
        took = time.monotonic() - began
        if took > CALL_BOUND_S:
            stalls.append(f"{kind} took {took:.1f} s")
        time.sleep(rng.uniform(0.0, 0.05))
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def run_case(case: Case) -> None:
    names = NAMES[: len(case.kinds)]
    stages = [Stage(n, step, kind=k, max_workers=4) for n, k in zip(names, case.kinds, strict=True)]
    pipeline = Pipeline(
        ((i, i) for i in range(case.items)),
        stages,
        queue_size=case.queue_size,
        max_item_retries=50,  # kills are random: an item may be unlucky a few times
        stop_timeout_s=STOP_TIMEOUT_S,
    )
    threads_before = threading.active_count()
    # Processes the session had before the case (a session fixture's server, say) are not its.
    children_before = {c.pid for c in psutil.Process().children(recursive=True)}
    done, stalls, outcomes = threading.Event(), [], []
    taken: list[list[int]] = [[] for _ in range(case.consumers)]

    def consume(mine: list[int]) -> None:
        try:
            for number, _ in pipeline:
                mine.append(number)
            outcomes.append("end")
        except PipelineStopped:
            outcomes.append("stopped")
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcomes.append(repr(exc))

    pipeline.start()
    prefix = pipeline._prefix
    consumers = [threading.Thread(target=consume, args=(m,), daemon=True) for m in taken]
    drivers = [
        threading.Thread(
            target=_drive, args=(k, pipeline, names, case.seed, done, stalls), daemon=True
        )
        for k in case.drivers
    ]
    try:
        for thread in consumers + drivers:
            thread.start()
        if case.stop_after_s is not None:
            time.sleep(case.stop_after_s)
        else:
            for thread in consumers:
                thread.join(CONSUMER_BOUND_S)
            assert not any(t.is_alive() for t in consumers), "a consumer never ended"
        done.set()
        for thread in drivers:
            thread.join(CALL_BOUND_S + 1)
        assert not any(t.is_alive() for t in drivers), f"a driver never returned: {stalls}"
        if case.dropped and case.stop_after_s is None:
            # As a loop over a pipeline built per epoch leaves it: the consumers and drivers
            # have ended, this was the last reference; collected, it stops (checked below).
            del pipeline
            gc.collect()
        else:
            began = time.monotonic()
            pipeline.stop()
            took = time.monotonic() - began
            assert took < STOP_BOUND_S, f"stop took {took:.1f} s"
        for thread in consumers:
            thread.join(5)
        assert not any(t.is_alive() for t in consumers), "a consumer outlived the stop"
    finally:
        done.set()
        if "pipeline" in locals():
            pipeline.stop()
    assert not stalls, stalls
    assert all(o in ("end", "stopped") for o in outcomes), outcomes
    if case.stop_after_s is None:
        assert outcomes == ["end"] * case.consumers
    every = sorted(n for mine in taken for n in mine)
    assert len(every) == len(set(every)), "an item was delivered twice"
    for mine in taken:
        assert mine == sorted(mine), "a consumer got items out of order"
    if "end" in outcomes:
        assert every == list(range(case.items)), "an item was lost"
    else:
        assert every == list(range(len(every))), "an item was lost before the stop"
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and (
        _new_children(children_before) or threading.active_count() > threads_before
    ):
        time.sleep(0.05)
    assert not _new_children(children_before), "a process outlived the stop"
    assert threading.active_count() <= threads_before, "a thread outlived the stop"
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(prefix)], "a file was left"


RUNS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def _new_children(before: set[int]) -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if c.pid not in before]


@pytest.mark.timeout(300)
@settings(RUNS, max_examples=6)
@given(case=cases())
def test_operations_from_several_threads_finish_in_bounds_and_keep_every_item(case):
    run_case(case)


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)
@settings(RUNS, max_examples=300)
@given(case=cases())
def test_many_generated_interleavings_never_hang(case):
    run_case(case)
