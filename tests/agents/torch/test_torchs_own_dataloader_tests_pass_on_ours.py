"""A curated, fast part of torch's own DataLoader tests, run on the loader ``intune-run`` puts in
torch's place (``AutoDataLoader``: ours for ``num_workers`` above 0, torch's for 0).

Each test is named after the test of torch's ``test/test_dataloader.py`` whose checks it makes
(written anew here: the project ships none of torch's test code, and needs neither the
network nor torch's source tree). The whole file, run against ours with ``intune-run``'s
patch, and how to repeat it: docs/reliability.md, "torch's own DataLoader tests"; the torch
tests left out of this file, each with its reason, are listed there too.
"""

import functools
import itertools
import math
import multiprocessing
import operator
import os
import time
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import ChainDataset, Dataset, IterableDataset, TensorDataset

from agents.torch import auto
from agents.torch.auto import AutoDataLoader as DataLoader


@pytest.fixture(autouse=True)
def no_control_plane(monkeypatch):
    """No loader here is attached to a control plane (under intune-run the largest is, when
    the first iteration starts): the loaders are the test's, not a training script's."""
    monkeypatch.setattr(auto._tuned, "decided", True)


@pytest.fixture(scope="module")
def tensors():
    torch.manual_seed(0)
    data = torch.randn(100, 2, 3, 5)
    labels = torch.randperm(50).repeat(2)
    return data, labels, TensorDataset(data, labels)


def stop(loader):
    """Stop the loader's workers: ours has close(); torch's, which intune-run builds for
    ``num_workers=0`` and for an iterable dataset read by several workers, has none."""
    if hasattr(loader, "close"):
        loader.close()


def read(loader):
    """Every batch of one epoch, the loader's workers stopped after it."""
    try:
        return list(loader)
    finally:
        stop(loader)


# --------------------------------------------------------------- map-style datasets


@pytest.mark.parametrize(("batch_size", "prefetch_factor"), [(1, None), (2, None), (2, 3)])
def test_torchs_test_sequential_workers(tensors, batch_size, prefetch_factor):
    """test_sequential_workers, test_seqential_batch_workers(_prefetch)."""
    data, labels, dataset = tensors
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=4,
                        prefetch_factor=prefetch_factor)  # fmt: skip
    batches = read(loader)
    assert len(batches) == math.ceil(100 / batch_size)
    for i, (sample, target) in enumerate(batches):
        assert torch.equal(sample, data[i * batch_size : (i + 1) * batch_size])
        assert torch.equal(target, labels[i * batch_size : (i + 1) * batch_size])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_torchs_test_shuffle_workers(tensors, batch_size):
    """test_shuffle_workers, test_shuffle_batch_workers: every sample once, with its label."""
    data, labels, dataset = tensors
    seen = []
    for sample, target in read(DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                          num_workers=4)):  # fmt: skip
        for s, t in zip(sample, target, strict=True):
            index = next(i for i in range(100) if torch.equal(data[i], s))
            assert labels[index] == t
            seen.append(index)
    assert sorted(seen) == list(range(100))


def test_torchs_test_shuffle_reproducibility(tensors):
    _, _, dataset = tensors

    def epoch():
        generator = torch.Generator().manual_seed(42)
        return read(DataLoader(dataset, shuffle=True, num_workers=2, generator=generator))

    first, second = epoch(), epoch()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))


class NoItems(Dataset):
    """No ``__getitem__``: torch's Dataset raises NotImplementedError for each index."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


def test_torchs_test_error_workers():
    """Each batch raises NotImplementedError in the training loop, and the epoch ends."""
    loader = DataLoader(NoItems(41), batch_size=2, shuffle=True, num_workers=4)
    it, errors = iter(loader), 0
    try:
        while True:
            try:
                next(it)
            except NotImplementedError:
                errors += 1
            except StopIteration:
                break
    finally:
        stop(loader)
    assert errors == math.ceil(41 / 2)


class RaisesAtIter(IterableDataset):
    def __iter__(self):
        raise RuntimeError("Error in __iter__")


def raising_worker_init_fn(_):
    raise RuntimeError("Error in worker_init_fn")


def test_torchs_test_error_in_init(tensors):
    for num_workers in (0, 2):
        loader = DataLoader(RaisesAtIter(), num_workers=num_workers)
        with pytest.raises(RuntimeError, match="Error in __iter__"):
            read(loader)
    loader = DataLoader(tensors[2], num_workers=2, worker_init_fn=raising_worker_init_fn)
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        read(loader)


def test_torchs_test_invalid_ctor_args_combinations(tensors):
    dataset = tensors[2]
    cases = [
        (ValueError, "num_workers option should be non-negative", dict(num_workers=-1)),
        (ValueError, "timeout option should be non-negative", dict(num_workers=1, timeout=-1)),
        (ValueError, "should specify a valid start method",
         dict(num_workers=1, multiprocessing_context="bad")),
        (TypeError, "multiprocessing_context option should be a valid context",
         dict(num_workers=1, multiprocessing_context=object())),
        (ValueError, "sampler option is mutually exclusive with shuffle",
         dict(num_workers=1, sampler=tud.SequentialSampler(dataset), shuffle=True)),
        (ValueError, "batch_sampler option is mutually exclusive with",
         dict(num_workers=1, batch_size=11,
              batch_sampler=tud.BatchSampler(tud.SequentialSampler(dataset), 3, False))),
        (ValueError, "prefetch_factor option could only be specified in multiprocessing",
         dict(num_workers=0, prefetch_factor=2)),
    ]  # fmt: skip
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            DataLoader(dataset, **args)
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        DataLoader(CountingIterable(20), num_workers=1, shuffle=True)


def test_torchs_test_invalid_assign_after_init(tensors):
    loader = DataLoader(tensors[2], num_workers=1)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
        with pytest.raises(ValueError):
            setattr(loader, attr, {})


def test_torchs_test_builtin_collection_conversion():
    for collection in (list, tuple):
        fetched = collection(read(DataLoader(list(range(20)), batch_size=None, num_workers=1)))
        assert fetched == collection(range(20))
        fetched = collection(read(DataLoader(list(range(20)), batch_size=2, num_workers=1)))
        assert [b.tolist() for b in fetched] == [[i, i + 1] for i in range(0, 20, 2)]
        fetched = read(DataLoader(CountingIterable(20), batch_size=None, num_workers=1))
        assert collection(fetched) == collection(range(20))


@pytest.mark.parametrize("spawn", [False, True])
def test_torchs_test_sampler_and_test_batch_sampler(tensors, spawn):
    data, _, dataset = tensors
    context = dict(multiprocessing_context="spawn") if spawn else {}
    loader = DataLoader(dataset, sampler=range(2, 12), batch_size=2, num_workers=4, **context)
    assert len(loader) == 5
    for i, (sample, _) in enumerate(read(loader)):
        assert torch.equal(sample, data[i * 2 + 2 : i * 2 + 4])
    batches = [b for i in range(0, 20, 5) for b in (tuple(range(i, i + 2)),
                                                    tuple(range(i + 2, i + 5)))]  # fmt: skip
    loader = DataLoader(dataset, batch_sampler=batches, num_workers=4, **context)
    assert len(loader) == 8
    for (sample, _), indices in zip(read(loader), batches, strict=True):
        assert torch.equal(sample, data[list(indices)])


class BulkLoading(Dataset):
    def __len__(self):
        return 35

    def __getitem__(self, indices):
        assert isinstance(indices, list | tuple)
        return torch.as_tensor(indices)


def test_torchs_test_bulk_loading_nobatch():
    sampler = [x.tolist() for x in torch.randperm(35).split(4)]
    loader = DataLoader(BulkLoading(), num_workers=4, batch_size=None, sampler=sampler)
    assert not loader._auto_collation
    assert set(torch.cat(read(loader)).tolist()) == set(range(35))


def test_torchs_test_len(tensors):
    for batch_size, batches in ((2, 50), (3, 34)):
        loader = DataLoader(tensors[2], batch_size=batch_size, num_workers=1)
        assert len(loader) == batches == len(read(loader))


class Sleeps(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        time.sleep(3)
        return i


@pytest.mark.parametrize("persistent", [False, True])
def test_torchs_test_timeout(persistent):
    loader = DataLoader(Sleeps(), batch_size=2, num_workers=2, timeout=1,
                        persistent_workers=persistent)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        read(loader)


class Empty(Dataset):
    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        return torch.empty(0)


def test_torchs_test_large_sampler_indices():
    """An error raised in the loop over 245 batches of 40,960 indices leaves promptly."""
    loader = DataLoader(Empty(), batch_size=40960, num_workers=1)
    with pytest.raises(RuntimeError, match="My Error"):
        try:
            for batch in loader:
                assert batch.numel() == 0
                raise RuntimeError("My Error")
        finally:
            stop(loader)


# --------------------------------------------------------------- workers: seeds and info


class SeedsAfterBarrier(Dataset):
    """torch's SynchronizedSeedDataset: each of ``parties`` items waits for all of them to
    be in a worker (bounded here), then returns ``torch.initial_seed()``."""

    def __init__(self, parties):
        ctx = multiprocessing.get_context("fork")
        self.parties = parties
        self.count = ctx.Value("i", 0)
        self.gate = ctx.Semaphore(0)

    def __len__(self):
        return self.parties

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.parties:
                self.gate.release()
        assert self.gate.acquire(timeout=30), "the other workers never took their items"
        self.gate.release()
        return torch.initial_seed()


def test_torchs_test_worker_seed():
    loader = DataLoader(SeedsAfterBarrier(6), batch_size=1, num_workers=6)
    assert len({int(batch) for batch in read(loader)}) == 6


class ByWorker(IterableDataset):
    """torch's TestMultiEpochDataset: each worker yields its id ``length // num_workers``
    times."""

    def __init__(self, length):
        self.length = length

    def __iter__(self):
        info = tud.get_worker_info()
        return itertools.repeat(info.id, self.length // info.num_workers)


def test_torchs_test_multi_epochs_reproducibility():
    loader = DataLoader(ByWorker(20), batch_size=10, num_workers=2)
    try:
        for _ in range(3):
            for index, sample in enumerate(loader):
                assert sample.tolist() == [index % 2] * 10
    finally:
        stop(loader)


class WorkerInfoSeen(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor(self.value)


def check_worker_info(worker_id):
    info = tud.get_worker_info()
    assert worker_id == info.id < info.num_workers == 2
    assert info.seed == torch.initial_seed()
    assert isinstance(info.dataset, WorkerInfoSeen) and not hasattr(info.dataset, "value")
    for field in ("id", "num_workers", "seed", "dataset"):
        assert f"{field}=" in repr(info)
    info.dataset.value = [worker_id, os.getpid()]


def test_torchs_test_get_worker_info():
    """worker_init_fn sees its worker's info and dataset copy; the training process's dataset
    is left alone (torch's also compares pids with its iterator's ``_workers``: internal)."""
    assert tud.get_worker_info() is None
    dataset = WorkerInfoSeen()
    loader = DataLoader(dataset, batch_size=2, num_workers=2, worker_init_fn=check_worker_info)
    rows = torch.cat(read(loader)).tolist()
    assert {worker for worker, _ in rows} <= {0, 1}
    assert len({pid for _, pid in rows}) == len({worker for worker, _ in rows})
    assert tud.get_worker_info() is None and not hasattr(dataset, "value")


# --------------------------------------------------------------- iterable-style datasets


class CountingIterable(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class WorkerSpecific(IterableDataset):
    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        return iter(range(self.sizes[tud.get_worker_info().id]))

    def __len__(self):
        return sum(self.sizes)


def test_torchs_test_iterable_style_dataset():
    """Without its checks of the iterator's ``_workers`` (internal)."""
    sizes = [0, 4, 20]
    expected = sorted(functools.reduce(operator.iadd, (list(range(s)) for s in sizes), []))
    fetched = read(DataLoader(WorkerSpecific(sizes), num_workers=3, batch_size=None))
    assert all(isinstance(x, int) for x in fetched) and sorted(fetched) == expected
    batches = read(DataLoader(WorkerSpecific(sizes), num_workers=3, batch_size=7))
    assert {tuple(b.tolist()) for b in batches} == {
        tuple(range(4)),
        tuple(range(7)),
        tuple(range(7, 14)),
        tuple(range(14, 20)),
    }
    batches = read(DataLoader(WorkerSpecific(sizes), num_workers=3, batch_size=7,
                              drop_last=True))  # fmt: skip
    assert {tuple(b.tolist()) for b in batches} == {tuple(range(7)), tuple(range(7, 14))}
    # Past len(loader) (asked for), each batch warns; not before it is asked.
    loader = DataLoader(CountingIterable(20), num_workers=3)
    try:
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(40):
                next(it)
        assert len(loader) == 20
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(20):
                next(it)
        for _ in range(3):
            with pytest.warns(UserWarning, match=r"but [0-9]+ samples have been fetched\. For "
                                                 r"multiprocessing data-loading, this"):  # fmt: skip
                next(it)
    finally:
        stop(loader)


def test_torchs_test_chain_iterable_style_dataset():
    expected = list(range(20)) + list(range(15))
    for chained in (CountingIterable(20) + CountingIterable(15),
                    ChainDataset([CountingIterable(20), CountingIterable(15)])):  # fmt: skip
        fetched = read(DataLoader(chained, num_workers=1))
        assert [int(x) for x in fetched] == expected


def test_torchs_test_iterabledataset_len():
    for batch_size, drop_last, batches in ((1, False, 10), (2, True, 5), (3, False, 4),
                                           (3, True, 3)):  # fmt: skip
        loader = DataLoader(CountingIterable(10), batch_size=batch_size, drop_last=drop_last,
                            num_workers=1)  # fmt: skip
        assert len(loader) == batches == len(read(loader))


class SlowRow(IterableDataset):
    """torch's TestSlowIterableDataset: worker 0 reads 0..4, worker 1 5..9, row 5 late."""

    def __iter__(self):
        info = tud.get_worker_info()
        per = math.ceil(10 / info.num_workers)
        for row in range(info.id * per, min(info.id * per + per, 10)):
            if row == 5:
                time.sleep(1.0)
            yield info.id, row


def test_torchs_test_in_order_iterable_ds():
    rows = [(int(w), int(r)) for w, r in read(DataLoader(SlowRow(), num_workers=2))]
    assert rows == [(0, 0), (1, 5), (0, 1), (1, 6), (0, 2), (1, 7), (0, 3), (1, 8), (0, 4), (1, 9)]


# --------------------------------------------------------------- persistent workers, types


class StartChecked(Dataset):
    """torch's DummyDataset: its workers keep the copy of their first epoch."""

    def __init__(self):
        self.data = list(range(10))

    def __len__(self):
        return 10

    def __getitem__(self, i):
        assert self.start == 0, "a persistent worker's dataset was copied again"
        return self.data[i]


def test_torchs_test_dataset_not_reset():
    dataset = StartChecked()
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True)
    dataset.start = 0
    try:
        for epoch in range(4):
            assert [int(x) for x in loader] == list(range(10))
            dataset.start = epoch + 1
    finally:
        stop(loader)


class Dicts(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"a_tensor": torch.empty(4, 2).fill_(i), "another_dict": {"a_number": i}}


def test_torchs_test_sequential_batch_of_dicts_with_persistent_workers():
    """TestDictDataLoader.test_sequential_batch (persistent_workers=True, one worker)."""
    loader = DataLoader(Dicts(), batch_size=2, num_workers=1, persistent_workers=True)
    for i, sample in enumerate(read(loader)):
        assert set(sample) == {"a_tensor", "another_dict"}
        assert sample["a_tensor"].shape == (2, 4, 2)
        assert (sample["a_tensor"][0] == 2 * i).all() and (sample["a_tensor"][1] == 2 * i + 1).all()
        assert sample["another_dict"]["a_number"].tolist() == [2 * i, 2 * i + 1]


Batch = namedtuple("Batch", ["data", "label", "random_tensor"])
Data = namedtuple("Data", ["positive", "negative"])


class NamedTuples(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Batch(data=Data(positive=i, negative=-i), label=str(i), random_tensor=torch.randn(3))


def test_torchs_test_dataloader_with_namedtuple():
    for batch in read(DataLoader(NamedTuples(), batch_size=2, num_workers=1)):
        assert isinstance(batch, Batch) and isinstance(batch.data, Data)
        assert isinstance(batch.data.positive, torch.Tensor)
    for batch in read(DataLoader(NamedTuples(), batch_size=None, num_workers=1)):
        assert isinstance(batch, Batch) and not isinstance(batch.data.positive, torch.Tensor)


@pytest.mark.parametrize(
    ("dtype", "tensor_type"),
    [(np.float64, torch.DoubleTensor), (np.float16, torch.HalfTensor),
     (np.int32, torch.IntTensor), (np.uint8, torch.ByteTensor)],
)  # fmt: skip
def test_torchs_test_numpy_scalars(dtype, tensor_type):
    batch = read(DataLoader([dtype()] * 4, batch_size=2, num_workers=1))[0]
    assert isinstance(batch, tensor_type)


class Conv(Dataset):
    """torch's ConvDataset: a convolution in the training process, then in a worker."""

    def __init__(self):
        self.x = torch.ones(1, 1, 24000)
        self[0]

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


def test_torchs_test_conv_after_fork():
    for x in read(DataLoader(Conv(), num_workers=1)):
        assert x.shape == (1, 1, 1, 23999)


def test_torchs_test_typing():
    class SomeDataset(Dataset[list[torch.Tensor]]):
        pass

    def make(is_train: bool) -> DataLoader[list[torch.Tensor]]:
        pass

    assert make(True) is None


def test_torchs_test_excessive_thread_creation_warning(tensors):
    with pytest.warns(UserWarning, match="excessive worker creation might get DataLoader"):
        DataLoader(tensors[2], batch_size=2, num_workers=1000)
