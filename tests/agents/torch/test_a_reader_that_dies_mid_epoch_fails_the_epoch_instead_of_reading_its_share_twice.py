"""A reader of an IterableDataset killed mid-epoch: the epoch raises, and no row comes twice.

The runtime replaces a dead worker and hands its items to another; a reader's place in its
share of the dataset died with it, so the new one would read the share again from the start.
torch's DataLoader raises when a worker dies; so does this one, naming the reader.
"""

import os
import signal
import time

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from agents.pipeline import StageFailed
from agents.torch import DataLoader
from tests.agents.torch.conftest import skip_errors_epoch


class SlowShards(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for row in range(info.id, 400, info.num_workers):
            time.sleep(0.005)
            yield torch.tensor([row, os.getpid()])


def test_a_reader_killed_mid_epoch_fails_the_epoch_and_no_row_comes_twice():
    loader = DataLoader(SlowShards(), batch_size=5, num_workers=2, timeout=30)
    seen = []
    try:
        iterator = iter(loader)
        first = next(iterator)
        seen += first[:, 0].tolist()
        os.kill(int(first[0, 1]), signal.SIGKILL)
        deadline = time.monotonic() + 60
        with pytest.raises(
            StageFailed, match="reader process of the IterableDataset died mid-epoch"
        ):
            while time.monotonic() < deadline:
                seen += next(iterator)[:, 0].tolist()
        assert len(seen) == len(set(seen)), "a row came twice"
    finally:
        loader.close()


class ShardsOneReaderDiesIn(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for row in range(info.id, 40, info.num_workers):
            if row == 4 * info.num_workers:
                os._exit(4)  # reader 0, a third of the way through its share
            yield torch.tensor([row])


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_loop_that_skips_failed_batches_after_a_reader_died_ends_its_epoch(workers):
    # The dead reader's replacement starts in another slot of the runtime; it raised on every
    # tick for ever (an endless epoch of errors); now once, then its share ends, as torch's.
    loader = DataLoader(ShardsOneReaderDiesIn(), batch_size=2, num_workers=workers, timeout=30)
    try:
        rows, errors = skip_errors_epoch(loader, 30)
    finally:
        loader.close()
    assert len(errors) == 1 and "died mid-epoch" in str(errors[0])
    assert len(rows) == len(set(rows)), "a row came twice"
    assert {r for r in range(40) if r % workers != 0} <= set(rows)  # the others' shares
