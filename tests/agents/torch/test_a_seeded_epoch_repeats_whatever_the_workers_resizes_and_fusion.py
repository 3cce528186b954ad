"""Randomness drawn in a dataset or a transform repeats under one seed (steps.py, "Repeatable
randomness"): the same ``torch.manual_seed`` before the loop gives the same epoch, tensor for
tensor, with 0 to 3 workers, with the stages resized live mid-epoch, fused or split, per-epoch
or persistent workers; another seed gives another epoch. ``worker_init_fn`` still sees torch's
seed for its worker (``base_seed + id``), and an ``IterableDataset``'s readers repeat too.

Before (batches seeded only by the worker that happened to take them) two runs of one seeded
loader with 2 workers gave different epochs, and with 0 or 1 worker differed from 3 workers.
"""

from __future__ import annotations

import os
import random
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

BOUND_S = 30  # the loader's timeout: a lost batch fails the test rather than hanging it


class Noisy(tud.Dataset):
    """Item i: [i, a draw from torch, one from random, one from numpy's global generator]."""

    def __init__(self, n: int = 48) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)  # batches are still in flight when the loop resizes the stages
        return torch.tensor([float(i), torch.rand(()).item(), random.random(), np.random.rand()])


def augment(sample: torch.Tensor) -> torch.Tensor:
    """A per-sample transform that draws (as an augmentation does)."""
    return torch.cat([sample, torch.rand(1), torch.tensor([np.random.rand()])])


def negatives(batch: torch.Tensor) -> torch.Tensor:
    """A batch transform that draws (as negative sampling does)."""
    return torch.cat([batch, torch.randint(0, 1000, (len(batch), 1)).float()], dim=1)


def epochs(seed: int, epochs: int = 2, resizes: tuple = (), **options) -> list[torch.Tensor]:
    """Every batch of ``epochs`` epochs of a loader built after ``torch.manual_seed(seed)``,
    each epoch as one tensor; ``resizes``: (after batch k, workers) applied to every stage."""
    torch.manual_seed(seed)
    loader = DataLoader(Noisy(), batch_size=4, shuffle=True, transforms=[augment],
                        batch_transforms=[negatives], timeout=BOUND_S, **options)  # fmt: skip
    try:
        got = []
        for _ in range(epochs):
            batches = []
            for k, batch in enumerate(loader):
                batches.append(batch)
                for after, workers in resizes:
                    if k == after:
                        loader.apply({name: workers for name in loader.stage_names})
            got.append(torch.cat(batches))
        return got
    finally:
        loader.close()


_reference: dict[tuple[int, bool], list[torch.Tensor]] = {}


def reference(seed: int, persistent: bool) -> list[torch.Tensor]:
    """The epochs of one worker per stage, everything fused, no resize."""
    key = (seed, persistent)
    if key not in _reference:
        _reference[key] = epochs(seed, num_workers=1, persistent_workers=persistent)
    return _reference[key]


# Each case starts real processes: no deadline, and a failure is reported as found (its blob
# reproduces it) rather than shrunk, which took minutes of real processes.
RUNS = settings(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
LOADERS = {
    "seed": st.sampled_from([3, 4]),
    "num_workers": st.integers(0, 3),
    "fuse": st.sampled_from(["auto", None, "fetch+augment,collate+negatives"]),
    "persistent": st.booleans(),
    "resizes": st.lists(st.tuples(st.integers(0, 11), st.integers(1, 3)), max_size=3),
}


@settings(RUNS, max_examples=6)
@given(**LOADERS)
def test_one_seed_gives_one_epoch_whatever_the_workers_resizes_and_fusion(
    seed, num_workers, fuse, persistent, resizes
):
    same_epochs_as_one_worker(seed, num_workers, fuse, persistent, resizes)


@pytest.mark.soak
@pytest.mark.timeout(3600)
@settings(RUNS, max_examples=100)
@given(**LOADERS)
def test_one_seed_gives_one_epoch_in_many_generated_loaders(
    seed, num_workers, fuse, persistent, resizes
):
    same_epochs_as_one_worker(seed, num_workers, fuse, persistent, resizes)


def same_epochs_as_one_worker(seed, num_workers, fuse, persistent, resizes):
    """Two epochs of the loader equal, tensor for tensor, one worker's without resizes."""
    if num_workers == 0 and persistent:
        persistent = False  # torch refuses persistent workers without workers
    expected = reference(seed, persistent)
    got = epochs(seed, resizes=tuple(resizes), num_workers=num_workers, fuse=fuse,
                 persistent_workers=persistent)  # fmt: skip
    for epoch, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(mine, theirs), (epoch, mine[:3], theirs[:3])
    # The epochs themselves differ: a persistent pipeline's second epoch does not replay its
    # first (same base seed, its own epoch seed).
    assert not torch.equal(got[0][:, 1:], got[1][:, 1:])


def test_two_runs_with_two_workers_give_one_epoch_and_another_seed_another():
    first = epochs(7, epochs=1, num_workers=2)[0]
    again = epochs(7, epochs=1, num_workers=2, resizes=((2, 3), (6, 1)))[0]
    other = epochs(8, epochs=1, num_workers=2)[0]
    assert torch.equal(first, again)
    assert not torch.equal(first[:, 1:], other[:, 1:])
    # Each generator draws its own numbers (numpy's legacy seeding is torch's mt19937 init:
    # given one 32-bit seed, both draw from one stream; checked by hand, numpy's 32-bit words
    # interleave torch's).
    assert not torch.equal(first[:, 1], first[:, 3])


def test_the_loaders_generator_seeds_the_epoch_as_torch_draws_its_base_seed():
    def run(generator_seed):
        torch.manual_seed(0)  # the global seed is not the one that counts here
        loader = DataLoader(Noisy(), batch_size=4, num_workers=2, timeout=BOUND_S,
                            generator=torch.Generator().manual_seed(generator_seed))  # fmt: skip
        try:
            return torch.cat(list(loader))
        finally:
            loader.close()

    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))


def test_turned_off_the_draws_come_from_the_workers_own_streams():
    # repeatable=False: a worker's generators go on from torch's per-worker seed. With one
    # worker that is torch's stream for worker 0, which is what torch's one worker draws.
    torch.manual_seed(9)
    ours = DataLoader(Noisy(12), batch_size=4, num_workers=1, repeatable=False,
                      timeout=BOUND_S)  # fmt: skip
    try:
        mine = torch.cat(list(ours))
    finally:
        ours.close()
    torch.manual_seed(9)
    theirs = torch.cat(list(tud.DataLoader(Noisy(12), batch_size=4, num_workers=1)))
    assert torch.equal(mine, theirs)


class SeedsSeen:
    """A ``worker_init_fn`` that writes, per worker, what torch's seeding left it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        info = tud.get_worker_info()
        with open(os.path.join(self.folder, f"{worker_id}-{os.getpid()}"), "w") as out:
            out.write(f"{info.id} {torch.initial_seed()} {info.seed}")


def seeds_seen(loader_class, dataset, epochs: int = 2) -> list[set[tuple[str, ...]]]:
    """Per epoch, what each worker's ``worker_init_fn`` saw: (id, ``torch.initial_seed()``,
    ``get_worker_info().seed``), after ``torch.manual_seed(11)``."""
    torch.manual_seed(11)
    loader = loader_class(dataset, batch_size=4, num_workers=2, timeout=BOUND_S)
    seen = []
    try:
        for _ in range(epochs):
            with tempfile.TemporaryDirectory() as folder:
                loader.worker_init_fn = SeedsSeen(folder)
                assert len(list(loader)) > 0
                files = [os.path.join(folder, name) for name in os.listdir(folder)]
                seen.append({tuple(open(name).read().split()) for name in files})
    finally:
        if hasattr(loader, "close"):
            loader.close()
    return seen


@pytest.mark.parametrize("iterable", [False, True])
def test_worker_init_fn_sees_torchs_ids_and_seeds_epoch_after_epoch(iterable):
    # Each epoch's workers number from 0, as each of torch's iterators' workers do (a count
    # shared by the epochs gave the second epoch's workers ids 2 and 3, and seeds to match).
    dataset = Shards() if iterable else Noisy()
    ours = seeds_seen(DataLoader, dataset)
    theirs = seeds_seen(tud.DataLoader, dataset)
    for epoch, (mine, torchs) in enumerate(zip(ours, theirs, strict=True)):
        # A worker that took no batch never ran worker_init_fn (ours start on their first).
        assert mine and mine <= torchs, (epoch, mine, torchs)


class Shards(tud.IterableDataset):
    """Rows 0 .. 39 split between readers by ``get_worker_info()``, each with a draw from
    torch, ``random`` and numpy, as a reader of shards that samples negatives would, and an
    offset drawn when ``iter()`` is called (a shuffle of the shards' order would be)."""

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        offset = float(torch.randint(1000, ()))
        return (
            torch.tensor([i, offset, torch.rand(()).item(), random.random(), np.random.rand()])
            for i in range(start, 40, step)
        )


def read_epochs(
    seed: int, epochs: int = 1, resize: dict | None = None, **options
) -> list[list[tuple[float, ...]]]:
    """An iterable dataset's epochs, each one's rows sorted (readers interleave as they are
    ready); ``resize`` applied after the first batch."""
    torch.manual_seed(seed)
    loader = DataLoader(Shards(), batch_size=3, timeout=BOUND_S,
                        batch_transforms=[negatives], **options)  # fmt: skip
    try:
        got = []
        for _ in range(epochs):
            batches = []
            for batch in loader:
                if resize and not batches:
                    loader.apply(resize)
                batches.append(batch)
            got.append(sorted(tuple(row.tolist()) for row in torch.cat(batches)))
        return got
    finally:
        loader.close()


def test_an_iterable_dataset_repeats_whatever_the_fusion_and_the_resizes():
    expected = read_epochs(5, num_workers=2)
    assert len(expected[0]) == 40
    resize = {"collate": 3, "negatives": 2}
    assert read_epochs(5, num_workers=2, fuse=None, resize=resize) == expected
    assert read_epochs(6, num_workers=2) != expected


def test_a_persistent_iterable_datasets_epochs_repeat_fused_or_not():
    # The second epoch's iter() runs in the process that served the first: fused, after
    # collate's draws; split, after the reader's own.
    expected = read_epochs(5, epochs=2, num_workers=2, persistent_workers=True)
    assert expected[0] != expected[1]
    split = read_epochs(5, epochs=2, num_workers=2, persistent_workers=True, fuse=None)
    assert split == expected
