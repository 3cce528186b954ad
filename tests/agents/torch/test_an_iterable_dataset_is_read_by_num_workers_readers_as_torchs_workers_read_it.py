"""An IterableDataset is read by ``num_workers`` readers, each worker ``i`` of ``num_workers``.

A team's sharded dataset splits its files by ``get_worker_info()``; with torch's DataLoader
its ``num_workers`` read in parallel. agents.torch.DataLoader once read it with one worker,
worker 0 of 1 (three times slower on the sharded-CSV script of docs/benchmarks.md, "torch
DataLoader"). Now the epoch holds torch's batches: the same multiset, each reader's in its
order, and the readers stay at ``num_workers`` whatever allocation is applied.
"""

import os

import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info

from agents.torch import DataLoader


class Shards(IterableDataset):
    """Rows 0 .. n-1, row r in shard r % num_workers (split by worker, as teams do); each row
    carries the worker id and process that read it."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for row in range(start, self.n, step):
            yield torch.tensor([row, -1 if info is None else info.id, os.getpid()])


def rows(batches):
    return sorted(tuple(b[:, 0].tolist()) for b in batches)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    n=st.integers(0, 40),
    num_workers=st.integers(2, 4),
    batch_size=st.integers(1, 6),
    drop_last=st.booleans(),
    persistent=st.booleans(),
)
def test_the_epoch_holds_torchs_batches_read_by_num_workers_readers(
    n, num_workers, batch_size, drop_last, persistent
):
    dataset = Shards(n)
    ours = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                      drop_last=drop_last, persistent_workers=persistent)  # fmt: skip
    theirs = tud.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                            drop_last=drop_last)  # fmt: skip
    try:
        expected = rows(theirs)
        for _ in range(2):
            batches = list(ours)
            assert rows(batches) == expected
            for batch in batches:
                readers = set(batch[:, 1].tolist())
                assert len(readers) == 1, "a batch mixes samples of two readers"
                assert readers == {batch[0, 0].item() % num_workers}
            by_reader = {}
            for batch in batches:
                by_reader.setdefault(batch[0, 1].item(), []).extend(batch[:, 0].tolist())
            for reader, seen in by_reader.items():
                assert seen == sorted(seen), f"reader {reader}'s batches out of its order"
            processes = {batch[0, 2].item() for batch in batches}
            assert len(processes) == len(by_reader), "two readers shared a process"
    finally:
        ours.close()


@pytest.mark.parametrize(
    ("fuse", "stage", "rest"), [("auto", "read+collate", None), (None, "read", "collate")]
)
def test_an_allocation_keeps_the_readers_at_num_workers(fuse, stage, rest):
    ours = DataLoader(Shards(30), batch_size=4, num_workers=3, fuse=fuse)
    try:
        assert ours.allocation == {stage: 3, **({rest: 3} if rest else {})}
        asked = {stage: 1, **({rest: 1} if rest else {})}
        assert ours.check(asked) == []
        ours.apply(asked)
        assert ours.allocation == {stage: 3, **({rest: 1} if rest else {})}
        batches = list(ours)
        assert rows(batches) == rows(tud.DataLoader(Shards(30), batch_size=4, num_workers=3))
        assert len({b[0, 1].item() for b in batches}) == 3
    finally:
        ours.close()
