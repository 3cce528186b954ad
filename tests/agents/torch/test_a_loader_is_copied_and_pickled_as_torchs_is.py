"""A loader can be deep-copied and pickled as torch's can (``copy.deepcopy(loader)`` to make
a validation loader, a loader handed to ``torch.multiprocessing.spawn``): the copy gives
torch's batches, starts workers of its own and keeps the allocation; the original goes on.
Before, both raised (``RuntimeError: Synchronized objects should only be shared between
processes through inheritance``, then a lock that cannot be pickled)."""

import copy
import pickle

import pytest
import torch.utils.data as tud

from agents.torch import DataLoader
from tests.agents.pipeline import stress
from tests.agents.torch.conftest import Counting, Squares, assert_same_epoch
from tests.agents.torch.loader_cases import CALL_BOUND_S


def _copy(how, loader):
    if how == "deepcopy":
        return copy.deepcopy(loader)
    return pickle.loads(pickle.dumps(loader))


def _epoch(loader):
    value, _ = stress.bounded("an epoch", CALL_BOUND_S, lambda: list(loader))
    return value


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize(
    "kind, options",
    [
        ("map", {"batch_size": 4, "num_workers": 2, "drop_last": True}),
        ("map", {"batch_size": 3, "num_workers": 1, "persistent_workers": True,
                 "multiprocessing_context": "spawn"}),
        ("iterable", {"batch_size": 5, "num_workers": 2}),
    ],
)  # fmt: skip
def test_a_copy_gives_torchs_batches_and_the_original_goes_on(how, kind, options):
    def dataset():
        return Squares(21) if kind == "map" else Counting(17)

    def kwargs():
        return dict(options)

    # torch's, copied at the same point (one batch in: the generator has drawn that epoch's
    # seeds), in one process (its persistent iterator cannot be copied).
    single = {
        k: v
        for k, v in kwargs().items()
        if k not in ("persistent_workers", "multiprocessing_context")
    }
    reference = tud.DataLoader(dataset(), **{**single, "num_workers": 0})
    next(iter(reference))
    reference = _copy(how, reference)
    theirs = [list(reference), list(reference)]
    ours = DataLoader(dataset(), **kwargs())
    try:
        first = iter(ours)
        next(first)  # the original is mid-epoch when copied
        ours.apply({name: 1 for name in ours.allocation})
        twin = _copy(how, ours)
        try:
            assert twin.allocation == ours.allocation
            if kind == "map":
                assert_same_epoch(_epoch(twin), theirs[0])
                assert_same_epoch(_epoch(twin), theirs[1])
            else:  # several readers: their batches interleave as they are ready
                got = sorted(int(x) for batch in _epoch(twin) for x in batch[:, 0])
                assert got == list(range(17))
        finally:
            twin.close()
        rest, _ = stress.bounded("the original's epoch", CALL_BOUND_S, lambda: list(first))
        assert len(rest) == len(theirs[0]) - 1
    finally:
        ours.close()
