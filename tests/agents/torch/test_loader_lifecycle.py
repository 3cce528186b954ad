"""Epochs, workers, errors and waits of agents.torch.DataLoader, as torch's DataLoader has them."""

import os
import time

import numpy as np
import psutil
import pytest
import torch
import torch.utils.data as tud

from agents.pipeline import StageFailed
from agents.torch import DataLoader


class Slow(tud.Dataset):
    """Item i after ``ms`` milliseconds (``stall_at``: that item takes ``stall_s`` instead)."""

    def __init__(self, n=40, ms=5.0, stall_at=None, stall_s=0.0, fail_at=None):
        self.n, self.ms, self.fail_at = n, ms, fail_at
        self.stall_at, self.stall_s = stall_at, stall_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"no row {i}")
        time.sleep(self.stall_s if i == self.stall_at else self.ms / 1000)
        return torch.tensor(i)


def slow_double(batch):
    time.sleep(0.01)
    return batch * 2


def negate_features(batch):
    features, labels = batch
    return -features, labels


class RecordInit:
    """A worker_init_fn that appends who called it to a file."""

    def __init__(self, path):
        self.path = path

    def __call__(self, worker_id):
        info = tud.get_worker_info()
        line = f"{os.getpid()} {worker_id} {info.id} {info.num_workers} {type(info.dataset).__name__}\n"
        with open(self.path, "a") as handle:
            handle.write(line)


def children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_len_is_torchs(datasets):
    for kwargs in ({"batch_size": 7}, {"batch_size": 7, "drop_last": True}, {"batch_size": None}):
        for dataset in (datasets.Squares(50), datasets.Counting(23)):
            assert len(DataLoader(dataset, **kwargs)) == len(tud.DataLoader(dataset, **kwargs))


class Served:
    """A batch transform that notes which process ran it, then doubles the batch."""

    def __init__(self, path):
        self.path = path

    def __call__(self, batch):
        with open(self.path, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return slow_double(batch)


class ServedSlow(Slow):
    """Slow, noting which process fetched each item."""

    def __init__(self, path, n):
        super().__init__(n)
        self.path = path

    def __getitem__(self, i):
        with open(self.path, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return super().__getitem__(i)


def test_worker_init_fn_runs_once_in_each_worker_process_with_its_worker_info(tmp_path):
    """Every worker process that serves a batch ran worker_init_fn first, once, with its own
    id. A worker that never gets a batch (one of the four, now and then, on a loaded host: the
    batches go to whichever worker is free) never runs it: setup comes before a worker's first
    item (``WorkerSetup``); torch's workers run it when they start (docs/reliability.md)."""
    record, served = tmp_path / "init.txt", tmp_path / "served.txt"
    loader = DataLoader(ServedSlow(served, 40), batch_size=4, num_workers=2,
                        worker_init_fn=RecordInit(record), batch_transforms=[Served(served)])  # fmt: skip
    try:
        assert [int(b[0]) for b in loader] == list(range(0, 80, 8))
        calls = [line.split() for line in record.read_text().splitlines()]
        serving = {int(line) for line in served.read_text().splitlines()}
    finally:
        loader.close()
    pids = [int(c[0]) for c in calls]
    assert len(pids) == len(set(pids)) <= 4, f"at most one call a worker of 2 stages x 2: {calls}"
    assert serving <= set(pids), "a worker served a batch without running worker_init_fn"
    assert len(serving) >= 2, "each of the two stages has a worker that served"
    assert os.getpid() not in pids
    ids = sorted(int(c[1]) for c in calls)
    assert len(set(ids)) == len(ids) and set(ids) <= {0, 1, 2, 3}, "ids of their own"
    assert all(c[1] == c[2] and c[3] == "2" and c[4] == "ServedSlow" for c in calls)


class Random(tud.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([torch.rand(1).item(), float(np.random.rand())])


def test_workers_draw_different_random_numbers_as_torchs_are_seeded_apart():
    loader = DataLoader(Random(), batch_size=4, num_workers=2)
    try:
        values = torch.cat(list(loader)).flatten().tolist()
    finally:
        loader.close()
    assert len(set(values)) == len(values), "two workers repeated each other's random numbers"


def test_a_wait_past_timeout_raises_torchs_error():
    # The timeout bounds each wait, the first batch's too (as torch's does): 2 s leaves a
    # loaded machine room to start the worker (0.5 s failed once in CI at load 11).
    loader = DataLoader(
        Slow(20, ms=1, stall_at=9, stall_s=8.0), batch_size=4, num_workers=1, timeout=2.0
    )
    batches = iter(loader)
    try:
        assert int(next(batches)[0]) == 0
        assert int(next(batches)[0]) == 4
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=r"DataLoader timed out after 2.0 seconds"):
            next(batches)
        assert 2.0 <= time.monotonic() - began < 5.0
    finally:
        loader.close()


def test_a_failing_sample_raises_naming_the_stage_and_the_error():
    loader = DataLoader(Slow(20, ms=0, fail_at=6), batch_size=4, num_workers=2)
    got = []
    with pytest.raises(
        StageFailed,
        match=r"(?s)^Caught KeyError in DataLoader worker process \d.*KeyError: 'no row 6'$",
    ) as caught:
        for batch in loader:
            got.append(batch)
    assert isinstance(caught.value, RuntimeError)
    assert caught.value.stage == "fetch+collate"
    assert [int(b[0]) for b in got] == [0], "the batches before the failing one were delivered"
    loader.close()


def next_or_error(iterator):
    """The next batch's first index, or the error's type name; None at the end."""
    try:
        return int(next(iterator)[0])
    except StopIteration:
        return None
    except Exception as exc:  # torch raises its own wrapper; compare the kind, not the class
        return "error" if isinstance(exc, (KeyError, RuntimeError)) else type(exc).__name__


@pytest.mark.parametrize("num_workers", [1, 2])
def test_after_a_failing_batch_the_epoch_goes_on_as_torchs_does(num_workers):
    """torch's iterator raises for the failed batch and goes on with the next ones; cutting
    the epoch there would lose every later batch of a loop that skips bad batches."""
    kwargs = {"batch_size": 4, "num_workers": num_workers}
    ours = iter(DataLoader(Slow(20, ms=0, fail_at=6), **kwargs))
    theirs = iter(tud.DataLoader(Slow(20, ms=0, fail_at=6), **kwargs))
    got_ours = [next_or_error(ours) for _ in range(7)]
    got_theirs = [next_or_error(theirs) for _ in range(7)]
    assert got_ours == got_theirs == [0, "error", 8, 12, 16, None, None]
    ours.loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_leaving_an_epoch_early_then_starting_again_gives_a_whole_epoch(
    datasets, same_epoch, persistent
):
    dataset = datasets.Squares(60)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=persistent)
    try:
        for taken, _batch in enumerate(loader):
            if taken == 2:
                break
        same_epoch(loader, tud.DataLoader(dataset, batch_size=4))
        first = iter(loader)
        next(first)
        same_epoch(iter(loader), tud.DataLoader(dataset, batch_size=4))
        if not persistent:
            # Each iterator has its own workers, as torch's: the first goes on with its epoch.
            assert float(next(first)[0][0, 0]) == 4.0
            return
        # With persistent workers, as torch's: iter() handed out the same iterator, reset,
        # which same_epoch read to its end (test_a_persistent_loaders_iter_hands_out_one_
        # iterator_as_torchs.py compares the two). Before, it raised RuntimeError.
        assert iter(loader) is first
        first = iter(loader)
        assert float(next(first)[0][0, 0]) == 0.0
    finally:
        loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_no_worker_process_outlives_close(datasets, persistent):
    before = children()
    loader = DataLoader(datasets.Squares(400), batch_size=4, num_workers=2, persistent_workers=persistent,
                        batch_transforms=[negate_features])  # fmt: skip
    batches = iter(loader)
    next(batches)
    assert len(children() - before) >= 4, "two stages of two workers were running"
    loader.close()
    assert wait_until(lambda: not (children() - before)), f"left behind: {children() - before}"
    assert len(list(loader)) == 100, "a closed loader iterates again"
    loader.close()


def test_non_persistent_workers_end_with_their_epoch(datasets):
    before = children()
    loader = DataLoader(datasets.Squares(40), batch_size=4, num_workers=2)
    assert len(list(loader)) == 10
    assert wait_until(lambda: not (children() - before)), "the epoch's workers were stopped"


def test_pinning_without_an_accelerator_changes_nothing(datasets, same_epoch):
    dataset = datasets.Squares(20)
    loader = DataLoader(dataset, batch_size=4, num_workers=1, pin_memory=True)
    try:
        batches = list(loader)
        same_epoch(batches, tud.DataLoader(dataset, batch_size=4))
        if torch.cuda.is_available():
            assert batches[0][0].is_pinned()
    finally:
        loader.close()
