"""A batch whose first sample is a tensor and a later one is not (a ``ConcatDataset`` of a
namedtuple dataset and a tensor one, a dataset that returns a number now and then) fails in
a worker with torch's error: ``AttributeError: 'Pair' object has no attribute 'numel'``,
where torch's worker sizes its shared segment, not ``stack``'s ``TypeError`` (the parity
hunter's seed 2201: ``python -m tests.agents.torch.parity_hunt --replay 2201``).

Generated: the other samples (a namedtuple, a number, a numpy array, a string, a list, an
object with a ``numel``) and where they stand in the batch; each batch goes through torch's
loader and ours, one worker each.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

Pair = namedtuple("Pair", ["x", "i"])


class Sized:
    """Not a tensor, but with a ``numel``: torch's worker goes on to ``stack`` it."""

    def numel(self) -> int:
        return 2


OTHERS = {
    "namedtuple": lambda i: Pair(torch.tensor(float(i)), i),
    "int": lambda i: i,
    "float": lambda i: i / 2,
    "numpy": lambda i: np.arange(2, dtype=np.float32),
    "string": lambda i: f"row-{i}",
    "list": lambda i: [i, -i],
    "sized": lambda i: Sized(),
}


class Mixed(torch.utils.data.Dataset):
    """Tensors, but the rows in ``odd`` are of ``kind``."""

    def __init__(self, n: int, kind: str, odd: frozenset[int]) -> None:
        self.n, self.kind, self.odd = n, kind, odd

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i in self.odd:
            return OTHERS[self.kind](i)
        return torch.tensor([float(i), -float(i)])


def _outcomes(loader_class, dataset, batch_size: int) -> list:
    loader = loader_class(dataset, batch_size=batch_size, num_workers=1, timeout=60)
    got = []
    iterator = iter(loader)
    try:
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001 - compared with torch's
                got.append((type(exc).__name__, str(exc).strip().splitlines()[-1]))
                continue
            got.append(("batch", len(batch)))
    finally:
        del iterator
        if hasattr(loader, "close") and loader_class is DataLoader:
            loader.close()
    return got


@settings(max_examples=4, deadline=None)
@given(
    kind=st.sampled_from(sorted(OTHERS)),
    batch_size=st.integers(2, 4),
    odd=st.frozensets(st.integers(1, 7), min_size=1, max_size=3),
)
def test_its_error_is_torchs_workers_error(kind, batch_size, odd):
    dataset = Mixed(8, kind, odd - {0, 4})  # rows 0 and 4 open a batch (sizes 2 and 4)
    ours = _outcomes(DataLoader, dataset, batch_size)
    torchs = _outcomes(torch.utils.data.DataLoader, dataset, batch_size)
    assert ours == torchs


@pytest.mark.parametrize("kind", ["namedtuple", "numpy"])
def test_the_hunters_case_fails_with_attributeerror_as_torchs(kind):
    dataset = Mixed(4, kind, frozenset({1}))
    expected = {"namedtuple": "'Pair' object", "numpy": "'numpy.ndarray' object"}[kind]
    assert _outcomes(DataLoader, dataset, 2) == [
        ("AttributeError", f"AttributeError: {expected} has no attribute 'numel'"),
        ("batch", 2),
    ]
