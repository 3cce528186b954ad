"""The readers of an IterableDataset hand out their batches in turns, as torch's workers do.

torch's iterator asks its workers for batches round-robin and, with ``in_order=True`` (the
default), yields them in that order: worker 0's first batch, worker 1's first, ..., worker 0's
second; a worker whose share ended drops out of the turns. agents.torch.DataLoader yielded
the readers' batches as they came, so the epoch held torch's batches in another order, which
changed from run to run (torch's test_multi_epochs_reproducibility and
test_in_order_iterable_ds failed on it). Now the consumer puts them back in torch's turns.

A batch that is not its reader's turn waits in the training process; past a bound (four times
the loader's queue), a reader has fallen far behind and the batch held longest goes out of
turn, rather than the epoch piling up in memory.
"""

import math
import time

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader
from agents.torch.loader import _ReaderTurns
from agents.torch.steps import fold


class Shares(tud.IterableDataset):
    """Worker ``w`` reads ``sizes[w]`` rows ``1000 * w + i``; ``slow`` workers sleep before
    their first row (a reader that starts late)."""

    def __init__(self, sizes, slow=(), sleep_s=0.3):
        self.sizes = sizes
        self.slow = slow
        self.sleep_s = sleep_s

    def __iter__(self):
        info = tud.get_worker_info()
        worker = 0 if info is None else info.id
        if worker in self.slow:
            time.sleep(self.sleep_s)
        return iter(range(1000 * worker, 1000 * worker + self.sizes[worker]))


def as_lists(batches):
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batches]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    data=st.data(),
    num_workers=st.integers(2, 3),
    batch_size=st.one_of(st.none(), st.integers(1, 4)),
    drop_last=st.booleans(),
    persistent=st.booleans(),
)
def test_an_epoch_yields_torchs_batches_in_torchs_order(
    data, num_workers, batch_size, drop_last, persistent
):
    sizes = data.draw(st.lists(st.integers(0, 9), min_size=num_workers, max_size=num_workers))
    slow = data.draw(st.sets(st.integers(0, num_workers - 1), max_size=1))
    dataset = Shares(sizes, slow)
    args = dict(batch_size=batch_size, num_workers=num_workers)
    if batch_size is not None:
        args["drop_last"] = drop_last
    expected = as_lists(tud.DataLoader(dataset, **args))
    ours = DataLoader(dataset, persistent_workers=persistent, **args)
    try:
        for epoch in range(2):
            assert as_lists(ours) == expected, f"epoch {epoch}"
    finally:
        ours.close()


def test_torchs_own_in_order_case_a_slow_row_mid_share():
    """torch's test_in_order_iterable_ds: worker 0 reads 0..4, worker 1 5..9 and sleeps 1 s
    before row 5; torch yields 0, 5, 1, 6, ... whatever the sleep."""

    class Halves(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            per = math.ceil(10 / info.num_workers)
            for row in range(info.id * per, min(info.id * per + per, 10)):
                if row == 5:
                    time.sleep(1.0)
                yield info.id, row

    ours = DataLoader(Halves(), num_workers=2)
    try:
        rows = [(int(w), int(r)) for w, r in ours]
    finally:
        ours.close()
    assert rows == [(0, 0), (1, 5), (0, 1), (1, 6), (0, 2), (1, 7), (0, 3), (1, 8), (0, 4), (1, 9)]


@st.composite
def deliveries(draw):
    """Each reader's batches (its number, its place), and an order the pipeline could hand
    them in: each reader's in its own order, the readers interleaved anyhow; a reader's end
    after its last batch."""
    readers = draw(st.integers(2, 4))
    counts = draw(st.lists(st.integers(0, 8), min_size=readers, max_size=readers))
    queues = [[("batch", r, j) for j in range(n)] + [("end", r, n)] for r, n in enumerate(counts)]
    order = []
    while any(queues):
        r = draw(st.sampled_from([r for r, q in enumerate(queues) if q]))
        order.append(queues[r].pop(0))
    return readers, counts, order


def torchs_turns(counts):
    """The order torch yields: round-robin over the workers whose share has not ended."""
    taken, out, active = [0] * len(counts), [], list(range(len(counts)))
    while active:
        for r in list(active):
            if taken[r] == counts[r]:
                active.remove(r)
            else:
                out.append((r, taken[r]))
                taken[r] += 1
    return out


def run_turns(readers, order, most_held, epoch_seed=12345):
    """Feed ``order`` to a _ReaderTurns as the consumer does; what it hands out, and the most
    batches it held at once."""
    turns = _ReaderTurns(readers, epoch_seed, most_held)
    out, most = [], 0
    for kind, r, j in order:
        if kind == "end":
            turns.reader_ended(r)
        else:
            turns.add(fold(epoch_seed, r, j), 1, (r, j))
        most = max(most, sum(len(h) for h in turns._held))
        while (ready := turns.next_batch()) is not None:
            out.append(ready[1])
    assert turns.ended()
    return out, most


@settings(max_examples=300, deadline=None)
@given(deliveries())
def test_whatever_the_interleaving_the_batches_come_in_torchs_turns(case):
    readers, counts, order = case
    out, _ = run_turns(readers, order, most_held=10_000)
    assert out == torchs_turns(counts)


@settings(max_examples=300, deadline=None)
@given(deliveries(), st.integers(1, 6))
def test_past_its_bound_a_batch_goes_out_of_turn_and_nothing_is_lost(case, most_held):
    readers, counts, order = case
    out, most = run_turns(readers, order, most_held)
    assert sorted(out) == sorted(torchs_turns(counts))
    for r in range(readers):
        assert [j for q, j in out if q == r] == list(range(counts[r])), "a reader's order"
    assert most <= most_held + 1


def test_a_failed_batch_shifts_its_readers_seeds_and_the_turns_still_hold():
    """A batch that raised was counted by its reader: its next batch carries the seed after
    the failed one's, and is still recognised as that reader's."""
    seed = 99
    turns = _ReaderTurns(2, seed, 100)
    turns.add(fold(seed, 1, 0), 1, "r1b0")
    assert turns.next_batch() is None  # reader 0's turn
    turns.add(fold(seed, 0, 1), 1, "r0b1")  # reader 0's batch 0 failed (raised at once)
    assert turns.next_batch() == (1, "r0b1")
    assert turns.next_batch() == (1, "r1b0")
