"""A resize or relayout cut midway by Ctrl-C (or a SIGTERM handler's ``SystemExit``) loses
no item: the consumer that goes on gets every item, once, in order.

``apply()`` and ``relayout()`` start workers in the caller's thread, a training script's main
thread, where a signal's exception is raised wherever it is, ``Thread.start()`` included (it
waits for the new thread to run). Cut between a process worker's two relays, the worker had
its feeding relay running and no reading one, and was in none of the pool's lists: it took
two items and answered them into a pipe nobody read; the ordered consumer waited for them for
ever. Found by the hunter (``tests/agents/pipeline/hunt.py``, Ctrl-C during a burst of resizes
while the launcher was stopped: no item for 25 s, every queue empty, 1 run in 3).

The generated case cuts a chosen relay's start deterministically (the exception is raised
just after the thread was created, or just before, as a signal landing in ``start()`` does);
the second test sends real SIGINTs at generated moments of a burst of resizes.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline import LayoutBusy, Pipeline, Stage, shm

ITEMS = 60


def _slow(x: int) -> int:
    time.sleep(0.002)
    return x


def _build(kinds: list[str]) -> Pipeline:
    stages = [
        Stage(f"s{k}", _slow, kind=kind, workers=1, max_workers=4) for k, kind in enumerate(kinds)
    ]
    return Pipeline(range(ITEMS), stages, queue_size=4, name="cut", item_timeout_s=15)


class _CutStart:
    """Make the ``nth`` start of a thread whose name ends in ``suffix`` raise
    ``KeyboardInterrupt``, after the thread was created (``after``) or before."""

    def __init__(self, suffix: str, nth: int, after: bool) -> None:
        self.suffix, self.nth, self.after = suffix, nth, after
        self.seen = 0
        self.cut = False
        self.real = threading.Thread.start

    def __enter__(self) -> _CutStart:
        cutter = self

        def start(thread: threading.Thread) -> None:
            if not cutter.cut and thread.name.endswith(cutter.suffix):
                cutter.seen += 1
                if cutter.seen == cutter.nth:
                    cutter.cut = True
                    if cutter.after:
                        cutter.real(thread)
                    raise KeyboardInterrupt
            cutter.real(thread)

        threading.Thread.start = start  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        threading.Thread.start = self.real  # type: ignore[method-assign]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(["process", "process", "thread"]), min_size=1, max_size=3),
    suffix=st.sampled_from(["-in", "-out", ""]),
    nth=st.integers(1, 3),
    after=st.booleans(),
    operation=st.sampled_from(["apply", "relayout"]),
    taken_before=st.integers(0, 20),
)
def test_a_worker_start_cut_midway_loses_no_item(
    kinds, suffix, nth, after, operation, taken_before
):
    pipeline = _build(kinds)
    names = [f"s{k}" for k in range(len(kinds))]
    try:
        pipeline.start()
        items = iter(pipeline)
        got = [next(items) for _ in range(taken_before)]
        with _CutStart(suffix, nth, after) as cut:
            try:
                if operation == "relayout" and len(names) > 1:
                    pipeline.relayout("+".join(names), {"+".join(names): 3}, timeout_s=2.0)
                else:
                    pipeline.apply({name: 4 for name in pipeline.stage_names})
            except KeyboardInterrupt:
                assert cut.cut
            except LayoutBusy:
                pass
        # The loop goes on, as a notebook's does after a Ctrl-C, and resizes again.
        pipeline.apply({name: 2 for name in pipeline.stage_names})
        got += list(items)
        assert got == list(range(ITEMS))
    finally:
        pipeline.stop()
    left = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(pipeline._prefix)]
    assert not left


@pytest.mark.parametrize("delay_s", [0.0, 0.002, 0.01, 0.03])
def test_ctrl_c_during_a_burst_of_resizes_loses_no_item(delay_s):
    pipeline = _build(["process", "process"])
    try:
        pipeline.start()
        items = iter(pipeline)
        got = [next(items) for _ in range(5)]
        for round_ in range(6):
            timer = threading.Timer(delay_s + 0.001 * round_, os.kill, (os.getpid(), signal.SIGINT))
            try:
                timer.start()
                for count in (4, 1, 3, 1, 4, 2):
                    pipeline.apply({"s0": count, "s1": 5 - count})
                timer.join(5)
                time.sleep(0.1)  # the Ctrl-C lands by now, if not in the resizes
            except KeyboardInterrupt:
                timer.join(5)
            got.append(next(items))
        got += list(items)
        assert got == list(range(ITEMS))
    finally:
        pipeline.stop()
