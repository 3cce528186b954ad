"""A pipeline stops at once while a pipeline started after it still runs, in either order.

A launcher leaves when its pipeline closes its end of their socket; the launcher of a
pipeline started later was forked with a copy of that end, so the first pipeline's stop
waited its whole 2 s for its launcher to leave, then killed it. A training script with two
persistent loaders exited 3.0 s after a Ctrl-C where torch's took 0.8 s (the exit hunter,
seed 1012). Now every process forked from the pipelines' process closes those ends."""

import time

import psutil

from agents.pipeline import Pipeline, Stage

PROMPT_S = 1.0  # a stop of idle workers, on a loaded 2-core machine (2.0 s and more before)


def double(x: int) -> int:
    return 2 * x


def started() -> Pipeline:
    pipeline = Pipeline(range(10**6), [Stage("double", double, workers=1)], queue_size=2)
    pipeline.start()
    next(iter(pipeline))
    return pipeline


def test_the_first_of_two_running_pipelines_stops_at_once():
    first, second = started(), started()
    try:
        launcher = psutil.Process(first._zygote.pid)
        start = time.monotonic()
        first.stop()
        took = time.monotonic() - start
        assert took < PROMPT_S, f"the stop took {took:.2f} s"
        assert not launcher.is_running() or launcher.status() == psutil.STATUS_ZOMBIE
        assert first._zygote.exit_code == 0, "the launcher was killed, not left by itself"
    finally:
        first.stop()
        second.stop()
