"""An IterableDataset's readers keep torch's turns however slow one of them is.

torch's iterator gives each worker at most ``prefetch_factor`` indices ahead of the training
loop, so a fast worker waits for the slow one and the batches come in turns. Our readers
read on, their batches waited in the training process for their turn, and past a bound (4 x
the loader's queue) the batch held longest went out of turn: with reader 0 10 ms a row
slower, 2 workers of 120 rows and batches of 4, torch's order held up to batch 6 of 60. Now a
reader ``prefetch_factor`` batches ahead of the consumer answers its ticks with ``Skipped``
(``agents.torch.steps.Read``), and the order is torch's, batch for batch.
"""

from __future__ import annotations

import time

import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

BOUND_S = 60.0


class Uneven(tud.IterableDataset):
    """Worker ``w`` yields ``sizes[w]`` rows ``1000 * w + i``, each after ``delays_ms[w]``."""

    def __init__(self, sizes: list[int], delays_ms: list[float]) -> None:
        self.sizes, self.delays_ms = sizes, delays_ms

    def __iter__(self):
        info = tud.get_worker_info()
        w = 0 if info is None else info.id
        for i in range(self.sizes[w]):
            if self.delays_ms[w]:
                time.sleep(self.delays_ms[w] / 1000)
            yield 1000 * w + i


def epochs(cls, dataset, count: int = 1, **kwargs) -> list[list]:
    loader = cls(dataset, **kwargs)
    began = time.monotonic()
    try:
        out = []
        for _ in range(count):
            out.append([b.tolist() for b in loader])
            assert time.monotonic() - began < BOUND_S, "the epochs took too long"
        return out
    finally:
        if hasattr(loader, "close"):
            loader.close()


def test_the_upstream_case_two_readers_one_10_ms_a_row_slower():
    dataset = Uneven([120, 120], [10.0, 0.0])
    args = dict(batch_size=4, num_workers=2)
    (theirs,) = epochs(tud.DataLoader, dataset, **args)
    (ours,) = epochs(DataLoader, dataset, timeout=BOUND_S, **args)
    assert len(ours) == len(theirs) == 60
    first = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
    assert first is None, f"torch's order up to batch {first} of 60 only"


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    workers=st.integers(2, 3),
    batch_size=st.integers(1, 4),
    prefetch=st.sampled_from([None, 1, 3]),
    persistent=st.booleans(),
    fuse=st.sampled_from(["auto", None]),
)
def test_whatever_the_slow_reader_and_the_sizes_the_order_is_torchs(
    data, workers, batch_size, prefetch, persistent, fuse
):
    sizes = data.draw(st.lists(st.integers(0, 60), min_size=workers, max_size=workers))
    slow = data.draw(st.integers(0, workers - 1))
    delays = [0.0] * workers
    delays[slow] = data.draw(st.sampled_from([2.0, 5.0, 10.0]))
    dataset = Uneven(sizes, delays)
    args = dict(batch_size=batch_size, num_workers=workers, prefetch_factor=prefetch)
    (theirs,) = epochs(tud.DataLoader, dataset, **args)
    ours = epochs(DataLoader, dataset, count=2, timeout=BOUND_S, persistent_workers=persistent,
                  fuse=fuse, **args)  # fmt: skip
    for epoch, got in enumerate(ours):
        assert got == theirs, f"epoch {epoch}: sizes {sizes}, reader {slow} slow"


def test_a_reader_ahead_skips_within_its_bounds_and_forgives_a_count_that_never_comes(
    monkeypatch,
):
    """Each skip waits at most ``SKIP_WAIT_S``; after ``SKIP_LIMIT_S`` of skipping the reader
    forgives itself the excess and reads on once, and skips again past ``ahead`` more: a
    count the consumer never sends (a batch it could not tell whose it was) costs one
    ``SKIP_LIMIT_S``, not one per batch, nor the rule for the rest of the epoch."""
    import multiprocessing

    from agents.torch import steps

    monkeypatch.setattr(steps, "SKIP_LIMIT_S", 0.3)
    handed = multiprocessing.get_context("fork").RawArray("q", 3)
    handed[0] = 1  # epoch 1, nothing handed out
    read = steps.Read(Uneven([10, 10], [0, 0]), 2, False, None, readers=2, handed=handed,
                      ahead=2)  # fmt: skip
    read._produced = 5  # 5 batches ahead of the consumer
    began = time.monotonic()
    skips = 0
    while read._ahead_of_consumer(1, 0):
        skips += 1
        assert time.monotonic() - began < 5, "skipped past SKIP_LIMIT_S"
    took = time.monotonic() - began
    assert 0.3 <= took < 2.0, took
    assert skips >= 1
    assert read._lead(1, 0) == 1, "the excess was not forgiven"
    assert not read._ahead_of_consumer(1, 0)  # below ahead now: reads
    read._produced += 1
    began = time.monotonic()
    assert read._ahead_of_consumer(1, 0), "the rule did not hold again"
    assert time.monotonic() - began <= steps.SKIP_WAIT_S + 0.05
    handed[1] += 1  # the consumer hands one out: the reader reads at once
    assert not read._ahead_of_consumer(1, 0)
