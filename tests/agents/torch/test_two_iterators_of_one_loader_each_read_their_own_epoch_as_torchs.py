"""Two iterators of one loader at once (``zip(loader, loader)``, a peek with
``next(iter(loader))`` kept while looping) each read their own epoch, as torch's do: without
persistent workers each ``iter()`` starts its own pipeline. Before, the newer ``iter()`` ended
the older one, and its first ``next()`` raised ``RuntimeError``.
"""

from __future__ import annotations

import time

import psutil
import torch
import torch.utils.data as tud

from agents.torch import DataLoader
from tests.agents.torch.conftest import Counting, Squares, assert_same

BOUND_S = 30


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_zip_of_a_loader_with_itself_gives_torchs_pairs():
    def pairs(loader_class, **extra):
        loader = loader_class(Squares(40), batch_size=4, shuffle=True, num_workers=2,
                              generator=torch.Generator().manual_seed(3), **extra)  # fmt: skip
        try:
            return list(zip(loader, loader, strict=True))
        finally:
            if hasattr(loader, "close"):
                loader.close()

    ours, theirs = pairs(DataLoader, timeout=BOUND_S), pairs(tud.DataLoader)
    assert len(ours) == len(theirs) == 10
    # The first iterator's epoch is torch's, batch for batch: its base seed and permutation
    # are drawn in iter(), in this thread, before the second's.
    assert_same([a for a, _ in ours], [a for a, _ in theirs], "the first iterator's batches")
    # The second's is a whole epoch of its own. Its order is torch's unless the first
    # iterator's feeder reached the end of its sampler before the second iter() drew: torch's
    # RandomSampler draws once more from the shared generator as it ends, and ours reads the
    # sampler further ahead than torch's (docs/reliability.md, Known gaps; CI saw it once).
    second = sorted(int(row) for _, b in ours for row in b[0][:, 0].tolist())
    assert second == sorted(int(row) for _, b in theirs for row in b[0][:, 0].tolist())
    # Two epochs, each shuffled its own way (each iterator drew its own permutation).
    assert [a[1].tolist() for a, _ in ours] != [b[1].tolist() for _, b in ours]


def test_each_side_of_an_iterable_datasets_zip_reads_the_whole_dataset():
    # Readers interleave as they are ready: each side's rows, sorted, are torch's.
    def sides(loader_class, **extra):
        loader = loader_class(Counting(23), batch_size=3, num_workers=2, **extra)
        try:
            pairs = list(zip(loader, loader, strict=True))
        finally:
            if hasattr(loader, "close"):
                loader.close()
        return [sorted(torch.cat([pair[side] for pair in pairs])[:, 0].tolist()) for side in (0, 1)]

    ours, theirs = sides(DataLoader, timeout=BOUND_S), sides(tud.DataLoader)
    assert ours == theirs == [list(range(23))] * 2


def test_both_iterations_are_resized_and_close_stops_both():
    before = children()
    loader = DataLoader(Squares(200), batch_size=4, num_workers=1, timeout=BOUND_S)
    first, second = iter(loader), iter(loader)
    try:
        next(first), next(second)
        loader.apply({"fetch+collate": 2})
        assert (
            first.receiver.pipeline.allocation
            == second.receiver.pipeline.allocation
            == {"fetch+collate": 2}
        )
        assert len(list(first)) == len(list(second)) == 49
    finally:
        loader.close()
    deadline = time.monotonic() + 10
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children() - before, "a worker outlived close()"
