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
