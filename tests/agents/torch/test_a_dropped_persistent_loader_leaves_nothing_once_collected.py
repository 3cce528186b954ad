"""A persistent loader the script drops (with its iterator: the two refer to each other, so the
garbage collector frees them) leaves no worker process and no thread once collected, whether
the epoch ran to its end, was left mid-way, or failed in ``worker_init_fn``.

Before, the pipeline's source thread still held the last epoch's items, which held the loader:
the loader stayed reachable from that thread, was never collected, and its workers ran on for
good (the generated loader cases: a persistent loader whose ``worker_init_fn`` raises, dropped,
left its threads and processes in 5 runs of 6)."""

from __future__ import annotations

import gc
import threading
import time

import psutil
import pytest

from agents.torch import DataLoader

GONE_S = 10.0  # for the workers and threads to leave once collected, on a loaded 2-core host


def _raises(worker_id: int) -> None:
    raise ValueError(f"worker {worker_id} cannot start")


def _ours() -> tuple[set[int], set[threading.Thread]]:
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    threads = {t for t in threading.enumerate() if t.name.startswith(("intune-", "dataloader-"))}
    return children, threads


@pytest.mark.parametrize("ending", ["whole epoch", "left mid-epoch", "worker_init_fn raises"])
def test_a_dropped_persistent_loader_leaves_no_worker_or_thread(ending):
    children_before, threads_before = _ours()
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
    assert _ours()[0] - children_before, "the loader started no worker: the test shows nothing"
    del loader, batches
    gc.collect()
    deadline = time.monotonic() + GONE_S
    while True:
        children, threads = _ours()
        left = (children - children_before, threads - threads_before)
        if not any(left) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not any(left), f"left {GONE_S} s after the collection: processes, threads {left}"
