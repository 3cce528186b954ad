"""The loader holds its epoch's iterator weakly, as torch's does: a ``for`` loop left by an
exception drops the iterator, whose collection stops the epoch's workers at once, instead of
leaving them running (and holding their memory) until the next epoch or ``close()``."""

from __future__ import annotations

import gc
import time

import psutil
import pytest
import torch

from agents.torch import DataLoader


class Boom(Exception):
    pass


def _workers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def _train(loader: DataLoader) -> None:
    for step, _ in enumerate(loader):
        if step == 3:
            raise Boom("the training step failed")


def test_a_loop_left_by_an_exception_leaves_no_worker_running():
    before = {p.pid for p in _workers()}
    loader = DataLoader(torch.arange(1000.0), batch_size=10, num_workers=2)
    with pytest.raises(Boom):
        _train(loader)
    gc.collect()  # the traceback's frames held the iterator until the exception was dropped
    deadline = time.monotonic() + 5
    while {p.pid for p in _workers()} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not ({p.pid for p in _workers()} - before), "the epoch's workers outlived its loop"
    assert list(loader)[0].tolist() == list(range(10))  # the loader iterates again
    loader.close()
