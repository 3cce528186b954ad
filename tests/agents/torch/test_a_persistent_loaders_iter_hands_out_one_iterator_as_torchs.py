"""With ``persistent_workers=True`` every ``iter()`` of a loader hands out the same iterator,
reset to a new epoch, as torch's ``DataLoader.__iter__`` does (``self._iterator._reset``):
``zip(loader, loader)`` takes one epoch's batches by turns, a peek ``next(iter(loader))``
starts an epoch that the next loop starts again. Before, the older iterator raised
``RuntimeError`` ("ended by a newer iter()") at its next ``next()``.

Generated sequences of ``iter()``, ``next()`` on any iterator handed out so far, ``zip`` and
whole loops run on torch's loader and on ours, with the same outcomes.
"""

from __future__ import annotations

import time

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info

from agents.torch import DataLoader

BOUND_S = 60.0


class Rows(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        for row in range(k, self.n, of):
            yield torch.tensor([row])


OPS = st.lists(
    st.one_of(
        st.just(("iter",)),
        st.tuples(st.just("next"), st.integers(0, 3), st.integers(1, 4)),
        st.just(("zip",)),
        st.just(("loop",)),
        st.tuples(st.just("loop_break"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=8,
)


def play(loader, ops: list) -> list:
    """The outcomes of ``ops`` on ``loader``: batches as lists, "stop", identities."""
    handed: list = []
    outcomes: list = []
    began = time.monotonic()
    for op in ops:
        assert time.monotonic() - began < BOUND_S, f"ops past {BOUND_S} s: {ops}"
        if op[0] == "iter":
            handed.append(iter(loader))
            outcomes.append(("same as", [k for k, it in enumerate(handed) if it is handed[-1]]))
        elif op[0] == "next":
            if not handed:
                handed.append(iter(loader))
            it = handed[op[1] % len(handed)]
            for _ in range(op[2]):
                try:
                    outcomes.append(next(it).tolist())
                except StopIteration:
                    outcomes.append("stop")
        elif op[0] == "zip":
            outcomes.append(
                [(a.tolist(), b.tolist()) for a, b in zip(loader, loader, strict=False)]
            )
        elif op[0] == "loop":
            outcomes.append([batch.tolist() for batch in loader])
        else:
            got = []
            for k, batch in enumerate(loader):
                got.append(batch.tolist())
                if k >= op[1]:
                    break
            outcomes.append(got)
    return outcomes


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS,
    iterable=st.booleans(),
    workers=st.integers(1, 2),
    n=st.integers(0, 14),
)
def test_a_persistent_loaders_iter_hands_out_one_iterator_reset_as_torchs(
    ops, iterable, workers, n
):
    # Not shuffled: an epoch left early leaves a shuffle's generator where torch's is only
    # if both read the sampler equally far (a known difference: test_after_a_partial_epoch_
    # a_shuffle_from_the_loaders_generator_is_torchs.py).
    def run(cls, **extra):
        dataset = Rows(n) if iterable else list(range(n))
        loader = cls(dataset, batch_size=2, num_workers=workers, persistent_workers=True,
                     **extra)  # fmt: skip
        try:
            return play(loader, ops)
        finally:
            if hasattr(loader, "close"):
                loader.close()

    theirs = run(tud.DataLoader)
    ours = run(DataLoader, timeout=BOUND_S)
    assert ours == theirs, f"ops {ops}:\n ours   {ours}\n torch's {theirs}"


def test_zip_of_a_persistent_loader_with_itself_gives_torchs_pairs():
    def pairs(cls, **extra):
        # Shuffled: the first epoch left at once is read no further than torch reads it
        # (its queues hold fewer than its 100 batches), so the permutations are torch's.
        loader = cls(list(range(400)), batch_size=4, shuffle=True, num_workers=2,
                     persistent_workers=True, generator=torch.Generator().manual_seed(3),
                     **extra)  # fmt: skip
        try:
            return [
                [(a.tolist(), b.tolist()) for a, b in zip(loader, loader, strict=False)]
                for _ in range(2)
            ]
        finally:
            if hasattr(loader, "close"):
                loader.close()

    ours, theirs = pairs(DataLoader, timeout=BOUND_S), pairs(tud.DataLoader)
    assert len(ours[0]) == 50
    assert ours == theirs
