"""A pipeline its user dropped without ``stop()`` (built per epoch and only iterated, or left
early by ``break``) stops: its launcher, workers, threads and shared memory go, as torch's
DataLoader ends an epoch's workers. Before, each such pipeline kept 3 processes and 5 threads
until the interpreter's exit (5 epochs: 15 processes, 26 threads)."""

import gc
import itertools
import os
import threading
import time

import psutil
import pytest

from agents.pipeline import Pipeline, Stage


def square(x: int) -> int:
    return x * x


def big(x: int) -> bytes:
    return bytes(200_000)  # through shared memory


def _made(prefixes: list[str], *args, **kwargs) -> Pipeline:
    """A pipeline, its shared-memory prefix noted in ``prefixes``: the files checked are those of
    the test's own pipelines, not another test process's on this host (pytest -n)."""
    pipeline = Pipeline(*args, **kwargs)
    prefixes.append(pipeline._prefix)
    return pipeline


def _ours(prefixes: list[str]) -> tuple[int, int, list[str]]:
    """This process's children, its threads, and the shared-memory files of the pipelines
    whose prefixes are in ``prefixes``."""
    files = [f for f in os.listdir("/dev/shm") if f.startswith(tuple(f"{p}-" for p in prefixes))]
    return len(psutil.Process().children(recursive=True)), threading.active_count(), files


def _settles(
    before: tuple[int, int, list[str]], prefixes: list[str], bound_s: float = 10.0
) -> tuple:
    """What is left once nothing is above ``before`` (at most ``bound_s``): ``before``
    itself when the test's pipelines left nothing. Fewer children or threads than before
    count as nothing left: an earlier test's pipeline, still ending when ``before`` was
    taken, may end meanwhile (the baseline held it: 3 children and 4 threads, once)."""
    deadline = time.monotonic() + bound_s
    while True:
        gc.collect()
        now = _ours(prefixes)
        if now[0] <= before[0] and now[1] <= before[1] and set(now[2]) <= set(before[2]):
            return before
        if time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["process", "thread"])
def test_pipelines_built_per_epoch_and_only_iterated_leave_nothing(kind):
    prefixes: list[str] = []
    before = _ours(prefixes)
    for epoch in range(4):
        got = list(_made(prefixes, range(40), [Stage("sq", square, workers=2, kind=kind)]))
        assert got == [i * i for i in range(40)], epoch
    assert _settles(before, prefixes) == before


@pytest.mark.timeout(90)
def test_pipelines_left_early_with_their_source_unread_leave_nothing():
    prefixes: list[str] = []
    before = _ours(prefixes)
    for _ in range(4):
        # An endless source, a stage whose results go through shared memory, the consumer
        # leaves after 3: the source thread waits for room, the collector for the consumer.
        pipeline = _made(
            prefixes,
            itertools.count(),
            [Stage("a", square, workers=2), Stage("b", big, workers=1)],
            queue_size=2,
        )
        for n, _ in enumerate(pipeline):
            if n == 2:
                break
        del pipeline
    assert len(prefixes) == 4 and _settles(before, prefixes) == before


@pytest.mark.timeout(60)
def test_a_pipeline_still_referenced_keeps_running():
    pipeline = Pipeline(range(1000), [Stage("sq", square, workers=2)], queue_size=2)
    iterator = iter(pipeline)
    assert next(iterator) == 0
    gc.collect()
    time.sleep(0.5)  # its threads wait for room, holding it weakly
    assert list(iterator) == [i * i for i in range(1, 1000)]
    pipeline.stop()
