"""Datasets for the DataLoader tests, and a strict comparison of batches."""

from __future__ import annotations

import time
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

Sample = namedtuple("Sample", ["features", "label"])


class Squares(Dataset):
    """Item i: (tensor [i, i*i] of float32, int label i % 3)."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([float(i), float(i * i)]), i % 3


class Rows(Dataset):
    """Item i: a named tuple holding 20 KB of features (batches go through shared memory)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Sample:
        return Sample(torch.full((5000,), float(i)), {"id": i, "name": f"row{i}"})


class Counting(IterableDataset):
    """0 .. n-1, split between workers as torch's documentation shows (by get_worker_info)."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.tensor([i, -i])


def skip_errors_epoch(
    loader, bound_s: float, what: str = "the epoch", max_errors: int | None = None
) -> tuple[list[int], list[RuntimeError]]:
    """One epoch through the loop a user writes to skip failed batches (``except
    RuntimeError: continue``): the first column of every batch's rows, and the errors. Fails
    the test when the epoch has not ended within ``bound_s`` (each ``next()`` is bounded by the
    loader's own ``timeout``) or gave more than ``max_errors`` errors."""
    rows: list[int] = []
    errors: list[RuntimeError] = []
    iterator = iter(loader)
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            rows += next(iterator)[:, 0].tolist()
        except StopIteration:
            return rows, errors
        except RuntimeError as exc:
            errors.append(exc)
            if max_errors is not None:
                assert len(errors) <= max_errors, f"{what}: errors without end: {exc!r}"
    pytest.fail(f"{what} never ended: {len(rows)} rows, {len(errors)} errors")


def assert_same(ours, theirs, where: str = "batch") -> None:
    """Equal values, dtypes and container types, all the way down."""
    assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert torch.equal(ours, theirs), f"{where}: {ours} != {theirs}"
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, list | tuple):
        assert len(ours) == len(theirs), f"{where}: {len(ours)} items, torch's {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def assert_same_epoch(ours, theirs) -> None:
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs), f"{len(ours)} batches, torch gave {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_same(a, b, f"batch {i}")


@pytest.fixture
def same():
    """``same(ours, theirs)``: assert two batches, or two epochs (iterables), are equal."""
    return assert_same


@pytest.fixture
def same_epoch():
    return assert_same_epoch


@pytest.fixture
def datasets():
    """The datasets above: ``datasets.Squares(n)``, ``Rows()``, ``Counting(n)``, ``Sample``."""
    return SimpleNamespace(Squares=Squares, Rows=Rows, Counting=Counting, Sample=Sample)
