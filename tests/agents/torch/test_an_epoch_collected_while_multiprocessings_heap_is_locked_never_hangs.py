"""An epoch's iterator left in a reference cycle, collected by a garbage collection that runs
while multiprocessing's shared-memory heap is locked (a collection runs wherever an allocation
triggers it: inside ``RawArray`` while the next epoch starts), never hangs the training loop;
the loader goes on to its next epoch, and the agent's handle becomes the next epoch's pipeline.

Before, the collection's finalizer built the next epoch's pipeline in place, whose shared
counters asked the same heap for memory: its lock is not re-entrant, and the loop waited for
ever (found by the loader hunter, seed 95064: a loader dropped mid-epoch, its collection inside
the next ``iter()``). The collection is forced here with the heap's lock held, in a child
process under a hard bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import gc
    import time
    from multiprocessing import heap

    from agents.torch import DataLoader

    loader = DataLoader(list(range(40)), batch_size=4, num_workers={workers})
    it = iter(loader)
    next(it)
    finished = loader.pipeline
    cycle = [it]
    cycle.append(cycle)
    del it, cycle
    with heap.BufferWrapper._heap._lock:
        gc.collect()
    print("collected", flush=True)
    deadline = time.monotonic() + 20
    while loader.pipeline is finished and time.monotonic() < deadline:
        time.sleep(0.05)
    print("next pipeline", loader.pipeline is not finished, loader.pipeline._stopped, flush=True)
    print("epoch", sorted(x for batch in loader for x in batch.tolist()) == list(range(40)))
    loader.close()
    """
)


def _run(workers: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(workers=workers)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def test_an_epoch_collected_under_the_heaps_lock_lets_the_loop_go_on():
    for workers in (0, 2):
        done = _run(workers)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "collected" in done.stdout, done.stderr[-2000:]
        assert "next pipeline True False" in done.stdout, done.stdout
        assert "epoch True" in done.stdout, done.stdout
