"""A loader dropped in a reference cycle (a loop left by an exception keeps its iterator in
the traceback's frames) is collected wherever the garbage collector next runs: inside the
next loader's ``Pipeline.start()``, it stopped its own pipeline there, waited 1 to 2 s with
the other's start half-done, and that one's workers were SIGKILLed under it: its epoch never
came (``timeout=20``: "timed out"). The loader's finalizers now stop their pipeline in a
thread of their own.

The collection is made to happen inside the start (``psutil.Process``, which the start calls
for every new worker, runs ``gc.collect()`` first): where a real one falls is up to the
allocator; probes saw it inside ``psutil.Process`` and ``threading.Thread`` of the start.

The test records in which thread each stop of a collected loader's pipeline ran, rather than
timing the epoch: the loader's and its iterator's finalizers both ran in the collection, and
the second one's ``stop()`` waited 2 s in the start for the first one's, in its own thread,
to finish (11 runs in 12); a bound on the epoch's wall time (5 s) caught it, and failed at
load 15 without it too.
"""

import gc
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import Dataset

from agents.pipeline import Pipeline
from agents.torch import DataLoader


class RaisesAtTwo(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 2:
            raise ValueError("item 2 is refused")
        return torch.tensor([i])


@pytest.mark.timeout(120)
def test_a_loader_collected_inside_another_loaders_start_leaves_that_one_working(monkeypatch):
    real, real_stop = psutil.Process, Pipeline.stop
    stops: list[tuple[str, str]] = []  # (whose pipeline, the thread its stop() ran in)

    def recorded_stop(self):
        whose = getattr(self, "whose", "the new loader's")
        stops.append((whose, threading.current_thread().name))
        return real_stop(self)

    monkeypatch.setattr(Pipeline, "stop", recorded_stop)
    for _ in range(3):
        stops.clear()
        dropped = DataLoader(RaisesAtTwo(), batch_size=2, num_workers=2)
        iterator = iter(dropped)
        with pytest.raises(ValueError):
            for _batch in iterator:
                pass
        dropped.pipeline.whose = "the collected loader's"
        cycle: list = [dropped, iterator]
        cycle.append(cycle)  # only the collector frees it, as a traceback's frames do
        del dropped, iterator, cycle

        def collecting(*args, **kwargs):
            gc.collect()
            return real(*args, **kwargs)

        monkeypatch.setattr(psutil, "Process", collecting)
        loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, timeout=20)
        began = time.monotonic()
        try:
            batches = [batch.tolist() for batch in loader]
        finally:
            monkeypatch.setattr(psutil, "Process", real)
            loader.close()
        took = time.monotonic() - began
        assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
        deadline = time.monotonic() + 10  # its stop is called at once, in a thread of its own
        while not (collected := [t for whose, t in stops if whose == "the collected loader's"]):
            assert time.monotonic() < deadline, f"the collected loader was never stopped: {stops}"
            time.sleep(0.05)
        here = threading.current_thread().name
        assert here not in collected, (
            f"the collected loader's stop ran in the thread of the collection, inside the other "
            f"loader's start (its stops ran in {collected}; the epoch took {took:.1f} s)"
        )
