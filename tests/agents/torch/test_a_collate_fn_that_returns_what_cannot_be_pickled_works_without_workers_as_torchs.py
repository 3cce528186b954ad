"""With ``num_workers=0``, a ``collate_fn`` may return what cannot be pickled (a generator, an
object of a class defined in a function, one holding a lock), as torch's single-process
loader collates in the training process.

Ours runs the loader in worker processes even with ``num_workers=0`` (so that it can be
resized live), and such a batch failed: "TypeError: cannot pickle 'generator' object" for
every batch (the parity hunter's seed 6026: ``collate_fn`` returning a generator). Now the
worker sends the samples back and the training process collates them, as torch's does.
Batches that can be pickled still come collated from the worker.
"""

import threading
from dataclasses import dataclass

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader


def as_generator(batch):
    return (x * 2 for x in batch)


def with_a_lock(batch):
    return {"rows": torch.tensor(batch), "lock": threading.Lock()}


def of_a_local_class(batch):
    @dataclass
    class Local:
        rows: list

    return Local(batch)


def read(batch):
    if isinstance(batch, dict):
        return batch["rows"].tolist()
    if hasattr(batch, "rows"):
        return batch.rows
    return list(batch)


@pytest.mark.parametrize("collate_fn", [as_generator, with_a_lock, of_a_local_class])
@pytest.mark.parametrize("persistent", [False, True])
def test_an_unpicklable_batch_comes_as_torchs_with_num_workers_0(collate_fn, persistent):
    data = list(range(7))
    expected = [read(b) for b in tud.DataLoader(data, batch_size=3, collate_fn=collate_fn)]
    ours = DataLoader(data, batch_size=3, collate_fn=collate_fn, num_workers=0)
    try:
        for _ in range(2):
            assert [read(b) for b in ours] == expected
    finally:
        ours.close()
