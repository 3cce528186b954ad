"""Threads that call ``next()`` on one iterator at once each get the epoch's end as
``StopIteration``, and between them every batch of the epoch once, as torch's single-process
iterator gives them (torch's worker iterators hang there: seen, not ours to copy).

Found by the parity hunter (``python -m tests.agents.torch.parity_hunt --replay 7``): the
thread that met the epoch's end stopped the pipeline under the others, which raised
``PipelineStopped``; with persistent workers they waited on the next epoch (30 s to the
loader's timeout, for ever without one), then took its first batches from whoever iterated
it next.
"""

from __future__ import annotations

import threading

import torch.utils.data as tud
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

BOUND_S = 30.0


def threads_read(loader, threads: int) -> tuple[list, list, int]:
    """One epoch read by ``threads`` threads: the batches, the errors, the threads stuck."""
    iterator = iter(loader)
    batches, errors = [], []

    def pull() -> None:
        while True:
            try:
                batches.append(int(next(iterator)))
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - what the test reports
                errors.append(repr(exc)[:200])
                return

    pulling = [threading.Thread(target=pull, daemon=True) for _ in range(threads)]
    for thread in pulling:
        thread.start()
    for thread in pulling:
        thread.join(BOUND_S)
    return sorted(batches), errors, sum(t.is_alive() for t in pulling)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@example(n=9, num_workers=2, persistent=True, threads=3)  # the hunted case, the other way
@example(n=5, num_workers=0, persistent=False, threads=2)
@given(
    n=st.integers(0, 12),
    num_workers=st.integers(0, 2),
    persistent=st.booleans(),
    threads=st.integers(2, 4),
)
def test_next_from_several_threads_ends_the_epoch_for_each_as_torchs(
    n, num_workers, persistent, threads
):
    args = dict(batch_size=None, num_workers=num_workers)
    if num_workers:
        args["persistent_workers"] = persistent
        args["timeout"] = BOUND_S  # so that a thread left waiting raises rather than hangs
    # torch's reference: one process (its worker iterators hang under threads).
    theirs = threads_read(tud.DataLoader(list(range(n)), batch_size=None), threads)
    loader = DataLoader(list(range(n)), **args)
    try:
        for epoch in range(2):
            ours = threads_read(loader, threads)
            assert ours == theirs, f"epoch {epoch}: ours {ours}, torch's {theirs}"
    finally:
        loader.close()
