"""Tensors a process worker returned stay readable after that worker is gone.

torch's own pickling for processes (``ForkingPickler`` with torch's reductions) sends a
tensor as a file descriptor the receiver fetches from the sending process when it unpickles;
a worker retired by a live resize, or killed, has left by then, and the item failed with
``ConnectionRefusedError``. Items of both sizes are checked: under ``shm_min_bytes`` they
travel by pickle, over it through shared memory.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from agents.pipeline import Pipeline, Stage  # noqa: E402

ITEMS = 240


def small_tensors(i: int) -> dict:
    """A few small tensors (about 1 kB in all), as a collated batch of a tiny dataset."""
    return {
        "i": torch.tensor([i]),
        "x": torch.full((4, 16), float(i)),
        "pair": (torch.arange(8) + i, torch.zeros(3, dtype=torch.bool)),
    }


def big_tensors(i: int) -> dict:
    """Tensors over the shared-memory threshold, with a view of another among them."""
    x = torch.full((256, 128), float(i))
    return {"i": torch.tensor([i]), "x": x, "row": x[3]}


def _check(item: dict, i: int) -> None:
    assert int(item["i"][0]) == i
    assert bool((item["x"] == float(i)).all())


def _drain_after(pipeline: Pipeline, act, wait_s: float) -> list[int]:
    """Let results pile up in the queues, act on the producing workers, then read them all."""
    received = []
    iterator = iter(pipeline)
    first = next(iterator)
    received.append(int(first["i"][0]))
    deadline = time.monotonic() + 10
    while pipeline._pools[0].totals()[0] < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    act(pipeline)
    time.sleep(wait_s)  # long enough for the retired or killed workers to have left
    for item in iterator:
        _check(item, len(received))
        received.append(int(item["i"][0]))
    return received


def _shrink(pipeline: Pipeline) -> None:
    pipeline.apply({"make": 1})


def _kill_all_but_one(pipeline: Pipeline) -> None:
    workers = [w for w in pipeline._pools[0].active if w.pid is not None and not w.ended]
    for worker in workers[1:]:
        pid = worker.pid
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("make", [small_tensors, big_tensors], ids=["small", "big"])
def test_tensors_arrive_after_a_resize_retired_the_workers_that_made_them(make):
    stages = [Stage("make", make, workers=4, max_workers=4), Stage("pass", _identity)]
    with Pipeline(range(ITEMS), stages, queue_size=64) as pipeline:
        received = _drain_after(pipeline, _shrink, wait_s=1.0)
    assert received == list(range(ITEMS))


@pytest.mark.parametrize("make", [small_tensors, big_tensors], ids=["small", "big"])
def test_tensors_arrive_after_the_workers_that_made_them_were_killed(make):
    stages = [Stage("make", make, workers=4, max_workers=4)]
    with Pipeline(range(ITEMS), stages, queue_size=64) as pipeline:
        received = _drain_after(pipeline, _kill_all_but_one, wait_s=0.5)
    assert received == list(range(ITEMS))


def _identity(item):
    return item
