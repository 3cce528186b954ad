"""An IterableDataset, or a sampler, whose ``__iter__`` resets its count and returns itself is
read through once per epoch, as torch's loader reads it.

torch's fetcher and sampler iterator call ``iter()`` once per epoch, then ``next()``. Ours took
each batch with ``itertools.islice``, which calls ``iter()`` on the iterator again: such a
dataset started over at every batch, and the epoch gave its first batch for ever (the parity
hunter's seed 5000: rows 0 to 12 without end, where torch's epoch had 4 batches); such a
batch sampler, resumed from a checkpoint, started over after the batches it skipped.
"""

import pytest
import torch.utils.data as tud

from agents.torch import DataLoader

LIMIT = 40  # batches: past it, the epoch does not end


class Restarts(tud.IterableDataset):
    """Rows ``k, k + of, ...`` below ``n`` for worker ``k`` of ``of``; ``__iter__`` returns
    itself, its count reset."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        info = tud.get_worker_info()
        k, of = (info.id, info.num_workers) if info is not None else (0, 1)
        row = k + self.i * of
        if row >= self.n:
            raise StopIteration
        self.i += 1
        return row


class RestartingBatches(tud.Sampler):
    """Batches ``[n - 1, n - 2]``, ... of indices; ``__iter__`` returns itself, its count
    reset."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.left = n

    def __len__(self) -> int:
        return (self.n + 1) // 2

    def __iter__(self):
        self.left = self.n
        return self

    def __next__(self):
        if self.left <= 0:
            raise StopIteration
        self.left -= 2
        return [i for i in (self.left + 1, self.left) if i >= 0]


def epoch(loader) -> list:
    out = []
    for batch in loader:
        out.append(batch if isinstance(batch, int) else batch.tolist())
        if len(out) >= LIMIT:
            break
    return out


@pytest.mark.parametrize(("num_workers", "batch_size"), [(0, 3), (2, 3), (2, None), (1, 1)])
def test_an_iterable_dataset_whose_iter_returns_itself_gives_torchs_epoch(num_workers, batch_size):
    args = dict(num_workers=num_workers, batch_size=batch_size)
    expected = epoch(tud.DataLoader(Restarts(11), **args))
    ours = DataLoader(Restarts(11), **args)
    try:
        assert epoch(ours) == expected
    finally:
        ours.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_sampler_whose_iter_returns_itself_resumes_a_checkpoint_as_torchs_epoch(
    num_workers,
):
    data = list(range(9))
    expected = epoch(tud.DataLoader(data, batch_sampler=RestartingBatches(9)))
    ours = DataLoader(data, batch_sampler=RestartingBatches(9), num_workers=num_workers)
    resumed = DataLoader(data, batch_sampler=RestartingBatches(9), num_workers=num_workers)
    try:
        iterator = iter(ours)
        first = [next(iterator).tolist() for _ in range(2)]
        resumed.load_state_dict(ours.state_dict())
        assert first + epoch(resumed) == expected
    finally:
        ours.close()
        resumed.close()
