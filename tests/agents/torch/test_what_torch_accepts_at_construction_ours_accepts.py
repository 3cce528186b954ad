"""What torch's DataLoader accepts, ours accepts too (found by torch's own DataLoader tests).

- ``DataLoader[Batch]``: torch's loader is generic in what it yields, and an annotation such
  as ``def make() -> DataLoader[Batch]`` runs when its module is imported (without ``from
  __future__ import annotations``). Ours was not generic: under ``intune-run`` that import
  raised ``TypeError: ... is not a generic class`` (torch's test_typing).
- ``num_workers`` past a stage's most (128): torch warns that it is excessive and starts them;
  our constructor raised ``ValueError`` (torch's test_excessive_thread_creation_warning).
- A dataset that returns ``torch.initial_seed()``: our per-batch seeds reached 2**64 - 1, and
  collating one into an int64 tensor raised "Overflow when unpacking long long" in the worker
  (torch's test_worker_init_fn); torch's worker seeds stay below 2**63, and so do ours.
"""

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agents.torch.auto as auto
from agents.pipeline.stage import HARD_MAX_WORKERS
from agents.torch import DataLoader


def test_the_loader_is_generic_in_what_it_yields_as_torchs_is(monkeypatch):
    def annotated(loader: DataLoader[list[torch.Tensor]]) -> auto.AutoDataLoader[int]:
        return loader

    monkeypatch.setattr(auto._tuned, "decided", True)  # the test's loader: no control plane
    assert DataLoader[int].__origin__ is DataLoader
    assert auto.AutoDataLoader[int].__origin__ is auto.AutoDataLoader
    loader = auto.AutoDataLoader[int](list(range(4)), batch_size=2, num_workers=1)
    try:
        assert isinstance(loader, tud.DataLoader)
        assert [b.tolist() for b in annotated(loader)] == [[0, 1], [2, 3]]
    finally:
        loader.close()


def test_more_workers_than_a_stage_may_have_start_each_stage_at_its_most():
    args = dict(batch_size=2, num_workers=HARD_MAX_WORKERS + 872)
    for dataset in (list(range(8)), [[i] for i in range(8)]):
        loader = DataLoader(dataset, **args)
        assert set(loader.allocation.values()) == {HARD_MAX_WORKERS}
    assert loader.allocation == {"fetch+collate": HARD_MAX_WORKERS}


class Seeds(tud.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.initial_seed()


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**63 - 1), num_workers=st.integers(1, 2))
def test_a_dataset_that_returns_torchs_initial_seed_is_collated_as_with_torch(seed, num_workers):
    loader = DataLoader(Seeds(), batch_size=4, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    try:
        seeds = torch.cat(list(loader))
    finally:
        loader.close()
    assert seeds.dtype == torch.int64 and len(seeds) == 16
    assert (seeds >= 0).all()
