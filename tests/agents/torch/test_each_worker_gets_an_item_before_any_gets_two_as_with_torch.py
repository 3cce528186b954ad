"""Each worker of a stage gets an item before any gets a second, as torch's round-robin gives.

torch's test_worker_seed reads a dataset whose items wait for each other across workers: a
barrier of ``num_workers`` items, one per worker. Our workers were fed two items ahead, so the
first ones started took two each and the last ones none: the barrier never filled and the
epoch waited for ever (our run of torch's suite stopped there at its 120 s limit). Now a
worker takes a second item only while every worker of the stage holds one.

The barrier here has a bound (a hang fails the item, then the test), as every wait must.
"""

import multiprocessing

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

BARRIER_S = 30.0


class Barrier(tud.Dataset):
    """``parties`` items, each returned only once ``parties`` workers hold one: the worker's
    id and process come back with it."""

    def __init__(self, parties, items):
        ctx = multiprocessing.get_context("fork")
        self.parties = parties
        self.items = items
        self.count = ctx.Value("i", 0)
        self.gate = ctx.Semaphore(0)

    def __len__(self):
        return self.items

    def __getitem__(self, i):
        if i < self.parties:
            with self.count.get_lock():
                self.count.value += 1
                if self.count.value == self.parties:
                    self.gate.release()
            if not self.gate.acquire(timeout=BARRIER_S):
                raise TimeoutError(f"item {i}: the other workers never took their items")
            self.gate.release()
        return torch.tensor([i, tud.get_worker_info().id])


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(num_workers=st.integers(2, 5), extra=st.integers(0, 6), persistent=st.booleans())
def test_items_that_wait_for_one_another_across_the_workers_all_come(
    num_workers, extra, persistent
):
    dataset = Barrier(num_workers, num_workers + extra)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers,
                        persistent_workers=persistent, timeout=2 * BARRIER_S)  # fmt: skip
    try:
        rows = [row.tolist() for row in loader]
    finally:
        loader.close()
    assert [i for i, _ in rows] == list(range(num_workers + extra))
    assert len({w for i, w in rows if i < num_workers}) == num_workers
