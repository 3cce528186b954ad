"""A persistent loader the script drops (with its iterator: the two refer to each other, so the
garbage collector frees them) leaves no worker process and no thread once collected, whether
the epoch ran to its end, was left mid-way, or failed in ``worker_init_fn``.

Before, the pipeline's source thread still held the last epoch's items, which held the loader:
the loader stayed reachable from that thread, was never collected, and its workers ran on for
good (the generated loader cases: a persistent loader whose ``worker_init_fn`` raises, dropped,
left its threads and processes in 5 runs of 6)."""

from __future__ import annotations

import gc

import pytest

from agents.torch import DataLoader
from tests.support.processes import loader_leftovers, loader_processes_and_threads

GONE_S = 10.0  # for the workers and threads to leave once collected, on a loaded 2-core host


def _raises(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


@pytest.mark.parametrize("ending", ["whole epoch", "left mid-epoch", "worker_init_fn raises"])
def test_a_dropped_persistent_loader_leaves_no_worker_or_thread(ending):
    before = loader_processes_and_threads()
    loader = DataLoader(
        list(range(40)),
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=_raises if ending == "worker_init_fn raises" else None,
    )
    batches = iter(loader)
    if ending == "whole epoch":
        assert len(list(batches)) == 20
    elif ending == "left mid-epoch":
        next(batches), next(batches)
    else:
        with pytest.raises(ValueError, match="cannot start"):
            next(batches)
    assert loader_processes_and_threads()[0] - before[0], (
        "the loader started no worker: the test shows nothing"
    )
    del loader, batches
    gc.collect()
    left = loader_leftovers(before, GONE_S)
    assert not any(left), f"left {GONE_S} s after the collection: processes, threads {left}"
