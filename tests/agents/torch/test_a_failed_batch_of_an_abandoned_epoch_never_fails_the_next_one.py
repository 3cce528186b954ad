"""A persistent loader feeds ahead of its consumer: when an epoch is left early (``break``,
``del`` of its iterator), a batch of it that failed may still be on its way. It is dropped
with the rest of that epoch. Before, a failure carried no epoch, so the next epoch raised
the last one's error first (found by the generated parity test: an ``IterableDataset`` that
raises mid-way, ``persistent_workers``, an epoch dropped before its first batch)."""

import time

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader

from .loader_cases import Case, Fault, bounded


class FailsAt(tud.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        if i == 1:
            raise KeyError(f"no row {i}")
        return torch.tensor(i)


class BreaksAt(tud.IterableDataset):
    def __iter__(self):
        for i in range(10):
            if i == 1:
                raise ValueError("the stream broke at 1")
            yield torch.tensor(i)


def outcomes(iterator, limit: int = 30) -> list:
    got = []
    while len(got) < limit:
        try:
            got.append(int(bounded(CASE, "next()", next, iterator)))
        except StopIteration:
            return got
        except Exception as exc:  # noqa: BLE001 - compared with torch's
            got.append(type(exc).__name__)
    raise AssertionError(f"no end of the epoch after {limit} batches and errors: {got}")


CASE = Case("map", 0, "tiny", "tensor", False, {}, Fault(), "sequential")  # names a hang


@pytest.mark.parametrize("leave", ["break", "del"])
@pytest.mark.parametrize("dataset", [FailsAt, BreaksAt])
def test_an_epoch_left_before_its_failed_batch_leaves_that_failure_behind(dataset, leave):
    loader = DataLoader(dataset(), batch_size=None, num_workers=1, persistent_workers=True)
    theirs = tud.DataLoader(dataset(), batch_size=None)
    try:
        first = iter(loader)
        assert int(bounded(CASE, "next()", next, first)) == 0
        time.sleep(0.5)  # the failed batch 1 is read ahead meanwhile
        if leave == "del":
            del first
        for _ in range(2):  # every epoch after it is torch's
            assert outcomes(iter(loader)) == outcomes(iter(theirs))
    finally:
        bounded(CASE, "close()", loader.close)
