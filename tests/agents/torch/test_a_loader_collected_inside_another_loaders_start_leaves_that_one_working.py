"""A loader dropped in a reference cycle (a loop left by an exception keeps its iterator in
the traceback's frames) is collected wherever the garbage collector next runs: inside the
next loader's ``Pipeline.start()``, it stopped its own pipeline there, waited 1 to 2 s with
the other's start half-done, and that one's workers were SIGKILLed under it: its epoch never
came (``timeout=20``: "timed out"). The loader's finalizers now stop their pipeline in a
thread of their own.

The collection is made to happen inside the start (``psutil.Process``, which the start calls
for every new worker, runs ``gc.collect()`` first): where a real one falls is up to the
allocator; probes saw it inside ``psutil.Process`` and ``threading.Thread`` of the start.
"""

import gc
import time

import psutil
import pytest
import torch
from torch.utils.data import Dataset

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
    real = psutil.Process
    for _ in range(3):
        dropped = DataLoader(RaisesAtTwo(), batch_size=2, num_workers=2)
        iterator = iter(dropped)
        with pytest.raises(ValueError):
            for _batch in iterator:
                pass
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
        assert took < 5.0, f"the epoch took {took:.1f} s: the collected loader's stop ran in it"
