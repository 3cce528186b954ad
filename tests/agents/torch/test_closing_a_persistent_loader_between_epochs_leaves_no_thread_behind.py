"""A persistent loader closed between epochs stops its source at once.

Its source thread waited up to 2.5 s for the next epoch's plan, and the pipeline's stop
waits 0.5 s for it: every close (or a loader dropped at the end of a script) warned "leaving
1 thread(s) still inside user code: dataloader-source" and left the thread running.
"""

import logging
import time

import torch
from torch.utils.data import TensorDataset

from agents.torch import DataLoader


def test_close_between_epochs_is_quick_and_names_no_stuck_thread(caplog):
    loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=8, num_workers=1,
                        persistent_workers=True)  # fmt: skip
    assert sum(len(b[0]) for b in loader) == 40
    time.sleep(0.2)  # the source is waiting for the next epoch
    with caplog.at_level(logging.WARNING):
        start = time.monotonic()
        loader.close()
        took = time.monotonic() - start
    assert "still inside user code" not in caplog.text
    assert took < 2.0, f"close took {took:.2f} s"
