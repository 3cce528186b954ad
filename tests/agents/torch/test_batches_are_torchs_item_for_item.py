"""agents.torch.DataLoader gives torch's batches, in torch's order, whatever its workers."""

from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    ("batch_size", "drop_last"), [(1, False), (7, False), (7, True), (64, False)]
)
def test_sequential_batches_are_torchs(datasets, same_epoch, num_workers, batch_size, drop_last):
    dataset = datasets.Squares(50)
    loader = DataLoader(
        dataset, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers
    )
    try:
        same_epoch(loader, tud.DataLoader(dataset, batch_size=batch_size, drop_last=drop_last))
    finally:
        loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_shuffled_batches_from_a_seeded_generator_are_torchs_epoch_after_epoch(
    datasets, same_epoch, persistent
):
    dataset = datasets.Squares(60)
    ours = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2,
                      persistent_workers=persistent, generator=torch.Generator().manual_seed(11))  # fmt: skip
    theirs = tud.DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2,
                            persistent_workers=persistent, generator=torch.Generator().manual_seed(11))  # fmt: skip
    try:
        for _ in range(3):
            same_epoch(ours, theirs)
    finally:
        ours.close()


def test_shuffling_from_the_global_seed_is_torchs(datasets, same_epoch):
    dataset = datasets.Squares(40)
    ours = DataLoader(dataset, batch_size=5, shuffle=True, num_workers=1)
    theirs = tud.DataLoader(dataset, batch_size=5, shuffle=True, num_workers=1)
    try:
        for seed in (1, 2):
            torch.manual_seed(seed)
            mine = list(ours)
            after_ours = torch.rand(1)
            torch.manual_seed(seed)
            same_epoch(mine, list(theirs))
            assert torch.equal(after_ours, torch.rand(1)), "the global RNG advanced as torch's does"
    finally:
        ours.close()


def test_a_sampler_and_a_batch_sampler_of_ones_own_give_torchs_batches(datasets, same_epoch):
    dataset = datasets.Squares(30)
    weights = torch.linspace(0.1, 1.0, 30)

    def weighted():
        return tud.WeightedRandomSampler(weights, 45, generator=torch.Generator().manual_seed(3))

    ours = DataLoader(dataset, batch_size=4, sampler=weighted(), num_workers=2)
    try:
        same_epoch(ours, tud.DataLoader(dataset, batch_size=4, sampler=weighted()))
    finally:
        ours.close()
    batches = [[3, 1], [29, 0, 7], [5], [2, 2, 2]]
    ours = DataLoader(dataset, batch_sampler=batches, num_workers=2)
    try:
        same_epoch(ours, tud.DataLoader(dataset, batch_sampler=batches))
    finally:
        ours.close()


def test_without_auto_batching_each_sample_is_converted_as_torchs(datasets, same_epoch):
    dataset = datasets.Squares(12)
    ours = DataLoader(dataset, batch_size=None, num_workers=2)
    try:
        same_epoch(ours, tud.DataLoader(dataset, batch_size=None))
    finally:
        ours.close()


def test_named_tuples_and_dicts_keep_their_types_through_shared_memory(datasets, same, same_epoch):
    dataset = datasets.Rows()
    ours = DataLoader(dataset, batch_size=8, num_workers=2)
    try:
        batches = list(ours)
        same_epoch(batches, tud.DataLoader(dataset, batch_size=8))
        assert type(batches[0]) is datasets.Sample
        assert batches[0].features.nbytes > 64 * 1024, "big enough to travel by shared memory"
    finally:
        ours.close()


class WithGetitems(tud.Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        raise AssertionError("torch fetches a batch with __getitems__ when the dataset has it")

    def __getitems__(self, indices):
        return [torch.tensor(i * 10) for i in indices]


def test_a_dataset_with_getitems_is_fetched_by_it(same_epoch):
    ours = DataLoader(WithGetitems(), batch_size=6, num_workers=2)
    try:
        same_epoch(ours, tud.DataLoader(WithGetitems(), batch_size=6))
    finally:
        ours.close()


def double(sample):
    features, label = sample
    return features * 2, label


def shift(sample):
    features, label = sample
    return features + 1, label + 10


def scale(batch):
    features, labels = batch
    return {"features": features / 4, "labels": labels}


class Transformed(tud.Dataset):
    """What a torch user writes: the per-sample transforms inside the dataset."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return shift(double(self.dataset[i]))


def collate_then_scale(samples):
    return scale(tud.default_collate(samples))


@pytest.mark.parametrize("fuse", ["auto", None])
def test_transforms_as_stages_give_the_batches_of_transforms_in_the_dataset(
    datasets, same_epoch, fuse
):
    dataset = datasets.Squares(33)
    ours = DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True,
                      generator=torch.Generator().manual_seed(5), transforms=[double, shift],
                      batch_transforms=[scale], fuse=fuse)  # fmt: skip
    theirs = tud.DataLoader(Transformed(dataset), batch_size=4, shuffle=True,
                            generator=torch.Generator().manual_seed(5),
                            collate_fn=collate_then_scale)  # fmt: skip
    try:
        expected = {"auto": ["fetch+double+shift+collate", "scale"],
                    None: ["fetch", "double", "shift", "collate", "scale"]}  # fmt: skip
        assert ours.stage_names == expected[fuse]
        same_epoch(ours, theirs)
    finally:
        ours.close()


@pytest.mark.parametrize(("batch_size", "drop_last"), [(5, False), (5, True), (None, False)])
def test_an_iterable_dataset_is_read_once_as_torch_reads_it_without_workers(
    datasets, same_epoch, batch_size, drop_last
):
    dataset = datasets.Counting(23)
    ours = DataLoader(dataset, batch_size=batch_size, drop_last=drop_last, num_workers=0,
                      transforms=[torch.neg])  # fmt: skip
    negated = tud.DataLoader(dataset, batch_size=batch_size, drop_last=drop_last,
                             collate_fn=_negated_collate(batch_size))  # fmt: skip
    try:
        assert ours.stage_names == ["read+neg+collate"]
        for _ in range(2):
            same_epoch(ours, negated)
    finally:
        ours.close()


def _negated_collate(batch_size):
    if batch_size is None:
        return lambda sample: tud.default_convert(torch.neg(sample))
    return lambda samples: tud.default_collate([torch.neg(s) for s in samples])


Point = namedtuple("Point", ["x", "y"])


class Containers(tud.Dataset):
    """Samples in containers the runtime's shared memory does not rebuild by itself."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        counts = defaultdict(int, {"i": i})
        return Point(torch.full((3000,), i), OrderedDict(size=torch.Size([i, 2]), counts=counts))


def as_list(samples):
    return samples


@pytest.mark.parametrize("fuse", ["auto", None])
def test_samples_keep_their_container_types_from_stage_to_stage(same_epoch, fuse):
    ours = DataLoader(Containers(), batch_size=6, num_workers=2, collate_fn=as_list,
                      transforms=[lambda sample: sample], fuse=fuse)  # fmt: skip
    try:
        batches = list(ours)
        same_epoch(batches, tud.DataLoader(Containers(), batch_size=6, collate_fn=as_list))
        point = batches[1][2]
        assert type(point) is Point and point.y["counts"]["missing"] == 0
        assert point.y["size"] == torch.Size([8, 2]) and type(point.y["size"]) is torch.Size
    finally:
        ours.close()
