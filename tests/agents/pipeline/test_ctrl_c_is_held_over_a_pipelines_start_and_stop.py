"""Ctrl-C (SIGINT) in the main thread during a pipeline's start, stop or the take of an item
is held until that step is done, then raised as ``KeyboardInterrupt``: no launcher without its
threads, no item lost from under the consumer. Elsewhere than the main thread, ``deferred()``
does nothing."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from agents.pipeline import Pipeline, Stage
from agents.pipeline.signals import deferred


def inc(x):
    return x + 1


def test_a_ctrl_c_inside_a_deferred_block_is_raised_when_it_ends():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with deferred() as held:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, and only notes it
            assert held.pending
            reached.append("end of block")
    assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_deferred_is_a_no_op_outside_the_main_thread():
    seen = []

    def run():
        with deferred() as held:
            seen.append(held.pending)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(5)
    assert seen == [False]


def test_a_ctrl_c_during_a_start_is_raised_after_it_with_the_pipeline_whole(monkeypatch):
    pipeline = Pipeline(range(1000), [Stage("inc", inc, workers=2)], name="held")
    launch = pipeline._start_launcher

    def launch_then_interrupt():
        launch()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)

    monkeypatch.setattr(pipeline, "_start_launcher", launch_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            pipeline.start()
        # Started to its end: its threads run, and its items flow.
        assert all(t.is_alive() for t in pipeline._threads)
        assert list(zip(range(3), pipeline, strict=False)) == [(0, 1), (1, 2), (2, 3)]
    finally:
        pipeline.stop()
    assert pipeline._zygote is not None and not pipeline._zygote.alive()


def test_a_ctrl_c_while_the_consumer_waits_ends_the_wait_and_loses_no_item():
    gate = threading.Event()

    def source():
        yield from range(3)
        gate.wait(10)
        yield from range(3, 6)

    pipeline = Pipeline(source, [Stage("inc", inc, kind="thread")], name="wait")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        taken = []
        timer.start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            for item in pipeline:
                taken.append(item)
        assert time.monotonic() - began < 1.0  # the wait looks at the held Ctrl-C every 0.1 s
        gate.set()
        taken += list(pipeline)  # a loop run again goes on where the first left
        assert taken == [1, 2, 3, 4, 5, 6]
    finally:
        timer.cancel()
        gate.set()
        pipeline.stop()
