"""The loader ``intune-run`` puts in place of torch's for an ``IterableDataset`` read by several
workers (``agents.torch.observed``) loads exactly what torch's loads, in torch's order, with
torch's workers; and it reports what the agent reads: one stage of ``num_workers`` workers with
every figure a pipeline reports, the training loop's samples and waiting, and a refusal of any
other number of workers that changes nothing. Generated: workers, items, batch size, drop_last,
persistence, what an item is, an early break."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info

from agents.pipeline.errors import AllocationError
from agents.torch.observed import STAGE, ObservedDataLoader

_TORCH = torch.utils.data.DataLoader
KEYS = {
    "name", "workers", "items_per_s", "busy_fraction", "in_queue", "out_queue",
    "queue_capacity", "cpu_percent", "fn_cpu_percent", "runqueue_percent", "rss_mb",
}  # fmt: skip


class Shards(IterableDataset):
    def __init__(self, items: int, kind: str) -> None:
        self.items, self.kind = items, kind

    def __iter__(self):
        info = get_worker_info()
        me, every = (info.id, info.num_workers) if info else (0, 1)
        for i in range(me, self.items, every):
            if self.kind == "tensor":
                yield torch.tensor([i, i * i])
            elif self.kind == "dict":
                yield {"i": i, "x": torch.full((3,), float(i))}
            elif self.kind == "tuple":
                yield (i, torch.tensor(float(i)))
            else:
                yield i


def _plain(batch):
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_plain(v) for v in batch]
    return batch


def _run(cls, options, epochs, stop_at):
    loader = cls(Shards(options.pop("items"), options.pop("kind")), **options)
    seen = []
    for _ in range(epochs):
        for n, batch in enumerate(loader):
            seen.append(_plain(batch))
            if n + 1 == stop_at:
                break
    return loader, seen


@pytest.mark.timeout(300)
@settings(max_examples=8, deadline=None)
@given(
    workers=st.integers(2, 4),
    items=st.integers(0, 120),
    batch_size=st.sampled_from([None, 1, 4, 16]),
    drop_last=st.booleans(),
    persistent=st.booleans(),
    kind=st.sampled_from(["tensor", "dict", "tuple", "int"]),
    epochs=st.integers(1, 2),
    stop_at=st.sampled_from([None, 1, 3]),
)
def test_it_loads_what_torch_loads_and_reports_its_workers(
    workers, items, batch_size, drop_last, persistent, kind, epochs, stop_at
):
    options = {
        "items": items, "kind": kind, "batch_size": batch_size, "num_workers": workers,
        "persistent_workers": persistent,
    }  # fmt: skip
    if batch_size is not None:
        options["drop_last"] = drop_last
    _, expected = _run(_TORCH, dict(options), epochs, stop_at)
    loader, got = _run(ObservedDataLoader, dict(options), epochs, stop_at)
    assert got == expected
    assert isinstance(loader, _TORCH)

    [row] = loader.metrics()
    assert set(row) == KEYS and row["name"] == STAGE and row["workers"] == workers
    assert row["rss_mb"] >= 0 and 0 <= row["busy_fraction"] <= 1
    stats = loader.consumer_stats()
    if got:
        assert stats["throughput"] > 0
    assert 0.0 <= stats["idle_fraction"] <= 1.0
    assert loader.stage_names == [STAGE] and loader.allocation == {STAGE: workers}
    assert loader.check({STAGE: workers}) == []
    loader.apply({STAGE: workers})
    with pytest.raises(AllocationError, match=f"keeps its num_workers={workers} workers"):
        loader.apply({STAGE: workers - 1})
    assert loader.allocation == {STAGE: workers}


def test_its_workers_figures_are_read_from_torchs_workers_while_it_loads():
    """Mid-epoch the stage shows torch's workers busy (they compute each item) and the batches
    the loop took; the training loop's samples are the batches' first dimension."""

    class Busy(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            for i in range(info.id, 100_000, info.num_workers):
                x = torch.full((64,), float(i))
                for _ in range(50):
                    x = x.sin()
                yield x

    loader = ObservedDataLoader(Busy(), batch_size=8, num_workers=2)
    loader.metrics()
    loader.consumer_stats()
    iterator = iter(loader)
    taken = 0
    for _ in range(60):
        next(iterator)
        taken += 1
    [row] = loader.metrics()
    stats = loader.consumer_stats()
    del iterator
    assert row["cpu_percent"] > 0 and row["items_per_s"] > 0
    assert stats["throughput"] > 0 and stats["step_ms"] >= 0
    assert stats["throughput"] == pytest.approx(8 * row["items_per_s"], rel=0.5)


def test_it_is_copied_and_pickled_as_torchs_loader_is():
    """torch's loader of a stream pickles and copies; so does the observed one (its figures
    start anew in the copy, which loads what the original loads)."""
    import copy
    import pickle

    loader = ObservedDataLoader(Shards(40, "int"), batch_size=4, num_workers=2)
    for other in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert [_plain(b) for b in other] == [_plain(b) for b in loader]
        assert other.metrics()[0]["workers"] == 2 and other._observed is not loader._observed
