"""A child forked from a training script (``os.fork()``; a ``multiprocessing`` fork) leaves the
parent's epoch alone, and the loader works in it as a fresh copy. Before: the child's exit
(its ``atexit``) stopped the copies of the parent's running pipelines, killing the parent's
workers through inherited pidfds and removing their shared memory, so the parent's epoch
failed ("No such file or directory: '/dev/shm/intune-...'"); ``iter(loader)`` in the child
stopped the parent's epoch the same way, and with persistent workers waited for ever."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from agents.pipeline.pipeline import _stop_running
from agents.torch import DataLoader
from tests.support.processes import exit_code_within


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.005)  # batches in flight when the child is forked
        return torch.full((20_000,), float(i))  # 80 kB a sample: batches in shared memory


def in_child(body) -> int:
    """Run ``body`` in a forked child, then what a child's exit runs of ours (``atexit``);
    its exit status, or a failure after 30 s (the child killed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = body()
        finally:
            try:
                _stop_running()
            finally:
                os._exit(code)
    code = exit_code_within(pid, 30)
    if code is None:
        pytest.fail("the forked child did not end within 30 s")
    return code


def rows_of(batches) -> list[int]:
    return [int(row) for batch in batches for row in batch[:, 0]]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("child_reads", [False, True])
def test_a_child_forked_mid_epoch_leaves_the_parents_epoch_whole(persistent, child_reads, caplog):
    caplog.set_level(logging.WARNING)
    loader = DataLoader(Rows(), batch_size=8, num_workers=2, persistent_workers=persistent)
    try:
        epoch = iter(loader)
        first = rows_of([next(epoch)])

        def child() -> int:
            if not child_reads:
                return 0
            return 0 if sorted(rows_of(loader)) == list(range(64)) else 3

        assert in_child(child) == 0
        assert first + rows_of(epoch) == list(range(64))
        assert rows_of(loader) == list(range(64))  # and the next epoch
        killed = [r.getMessage() for r in caplog.records if "was killed" in r.getMessage()]
        assert killed == [], "the child killed the parent's workers"
    finally:
        loader.close()
