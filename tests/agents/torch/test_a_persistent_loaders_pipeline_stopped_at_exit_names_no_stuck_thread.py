"""A persistent loader's pipeline stopped without ``close()`` (at the interpreter's exit after
Ctrl-C, where ``atexit`` stops the pipelines still running) stops at once and names no thread
of its own as stuck. Before: its feeder, waiting for the next epoch in 2.5 s slices, outlived
the stop's 0.5 s join; every Ctrl-C of a training script with ``persistent_workers=True``
printed "pipeline 'dataloader' stopped, leaving 1 thread(s) still inside user code:
dataloader-source", 0.5 s late."""

from __future__ import annotations

import logging
import time

import torch

from agents.pipeline.pipeline import _stop_running
from agents.torch import DataLoader


def test_the_stop_at_exit_of_a_persistent_loader_mid_epoch_names_no_stuck_thread(caplog):
    caplog.set_level(logging.WARNING)
    # The exit's stop marks the process as exiting for good; tests/conftest.py unmarks it for
    # the next test of this process.
    dataset = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2))
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)
    try:
        epoch = iter(loader)
        next(epoch)
        time.sleep(0.5)  # every batch fed: the feeder waits for the next epoch
        _stop_running()  # what the interpreter's exit runs
        stuck = [r.getMessage() for r in caplog.records if "still inside" in r.getMessage()]
        assert stuck == []
    finally:
        loader.close()
