"""An IterableDataset whose ``__iter__`` raises gives its error once per epoch and reader
(``num_workers`` readers, as torch's workers each raise their own), then the epoch's end: a training loop that skips failed batches (``except Exception: continue``)
ends the epoch. Before, every ``next()`` raised again, for ever: that loop never ended."""

import faulthandler
import sys

import pytest
from torch.utils.data import IterableDataset

from agents.pipeline import StageFailed
from agents.torch import DataLoader

BOUND_S = 30.0


class CannotStart(IterableDataset):
    def __iter__(self):
        raise OSError("the shard list could not be read")


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_an_iterable_dataset_that_cannot_start_fails_once_and_ends_each_epoch(
    num_workers, persistent
):
    loader = DataLoader(
        CannotStart(), batch_size=2, num_workers=num_workers, persistent_workers=persistent
    )
    faulthandler.dump_traceback_later(BOUND_S, exit=True, file=sys.stderr)
    try:
        for _ in range(2):  # each epoch alike
            errors, batches = [], 0
            epoch = iter(loader)
            while len(errors) <= 8:  # a bound of the test's own, far above the one expected
                try:
                    next(epoch)
                    batches += 1
                except StopIteration:
                    break
                except StageFailed as exc:
                    errors.append(exc)
            assert batches == 0
            readers = max(1, num_workers)
            assert len(errors) == readers, f"{len(errors)} errors and no end of the epoch"
            assert "shard list" in str(errors[0])
    finally:
        faulthandler.cancel_dump_traceback_later()
        loader.close()
