"""A worker_init_fn (or a library it loads) that kills every worker: each batch raises a
``RuntimeError`` (torch's type for a dead worker), and after a few deaths in a row an item
is no longer retried on another worker: a loop that skips failed batches paid three deaths
per batch before (100 batches: 50 s on 2 busy cores), now about one (the first few in a row
are retried as before)."""

import os
import time

from agents.torch import DataLoader

BATCHES = 24


def exits(worker_id: int) -> None:
    os._exit(5)


def test_a_worker_init_fn_that_exits_fails_every_batch_without_three_deaths_each():
    loader = DataLoader(list(range(2 * BATCHES)), batch_size=2, num_workers=2,
                        worker_init_fn=exits, persistent_workers=True)  # fmt: skip
    errors, began = [], time.monotonic()
    try:
        iterator = iter(loader)
        while time.monotonic() - began < 120:
            try:
                next(iterator)
            except StopIteration:
                break
            except RuntimeError as exc:
                errors.append(exc)
        died = loader.pipeline._pools[0].died
    finally:
        loader.close()
    assert len(errors) == BATCHES, f"{len(errors)} errors for {BATCHES} batches"
    assert all("died" in str(e) for e in errors), str(errors[0])
    # One per batch, and the retries of the first few in a row (3 per batch before: 72).
    assert died <= BATCHES + 12, f"{died} workers died for {BATCHES} batches (3 each before)"
