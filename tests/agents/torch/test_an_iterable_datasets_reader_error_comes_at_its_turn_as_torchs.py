"""An IterableDataset reader's error (in its rows, its ``__iter__`` or the ``collate_fn`` of its
batch) reaches the loop at that reader's turn, as torch's worker's does.

torch asks its workers for batches round-robin and, with ``in_order=True``, yields their
outcomes in that order: a worker's error is raised when that worker's turn comes. Ours put
the readers' batches back in torch's turns, but raised a failed batch as it came (it carried
no seed, so no reader): a reader that ran ahead of a slower one raised its error before the
slower one's batches of the turns before it (the parity hunter's seed 2110: the error after
row 14 where torch's came after row 19). Every batch still came once and the error was of
torch's type; only its place differed. A loop that counts the batches before a failure, or
stops at the first one, saw another epoch than under torch.

Generated (3 examples besides the 3 explicit ones, to stay near 15 s at load 14): 2 or 3
readers, one of them slow; one reader fails at one of its rows (in the row, in ``__iter__``
or in ``collate_fn``); the outcomes of an epoch, batch by batch, must be torch's loader's
run the same way, on both of two epochs.
"""

import time

import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader

SLOW_S = 0.04


class Shares(tud.IterableDataset):
    """Worker ``w`` yields rows ``1000 * w + i`` for ``i < rows``; worker ``slow`` sleeps
    before each row; worker ``failing`` fails at its row ``at`` (``where``: in the row, in
    ``__iter__``, or in the collate of the batch holding that row)."""

    def __init__(self, rows: int, slow: int, failing: int, at: int, where: str) -> None:
        self.rows, self.slow, self.failing, self.at, self.where = rows, slow, failing, at, where

    def __iter__(self):
        worker = tud.get_worker_info().id
        if worker == self.failing and self.where == "iter":
            raise KeyError(f"reader {worker} cannot open its share")
        return self._rows(worker)

    def _rows(self, worker: int):
        for i in range(self.rows):
            if worker == self.slow:
                time.sleep(SLOW_S)
            if worker == self.failing and i == self.at and self.where == "row":
                raise ValueError(f"reader {worker} cannot read row {i}")
            yield 1000 * worker + i if not (worker == self.failing and i == self.at) else -1


def refuses_the_marked_row(batch):
    if any(row == -1 for row in batch):
        raise LookupError("collate refuses the marked row")
    return torch.tensor(batch)


def outcomes(loader) -> list:
    """Each ``next()`` of an epoch: the batch as a list, or the error's type (torch's message
    says "Caught ValueError in DataLoader worker process 0", ours names the stage)."""
    out: list = []
    iterator = iter(loader)
    while len(out) < 60:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - compared with torch's
            out.append(type(exc).__name__)
            continue
        out.append(batch.tolist())
    return out


# Three explicit cases and one generated, for the suite's time (46 s with three generated in
# the clean-clone run of 15:40); the parity hunter draws the rest.
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@example(readers=2, batch_size=1, slow=1, failing=0, at=3, where="row", persistent=True)
@example(readers=2, batch_size=2, slow=1, failing=0, at=4, where="collate", persistent=False)
@example(readers=3, batch_size=1, slow=0, failing=2, at=0, where="iter", persistent=True)
@given(
    readers=st.integers(2, 3),
    batch_size=st.integers(1, 2),
    slow=st.integers(0, 2),
    failing=st.integers(0, 2),
    at=st.integers(0, 5),
    where=st.sampled_from(["row", "iter", "collate"]),
    persistent=st.booleans(),
)
def test_a_readers_error_is_raised_at_its_turn_as_torchs(
    readers, batch_size, slow, failing, at, where, persistent
):
    dataset = Shares(6, slow % readers, failing % readers, at, where)
    args = dict(batch_size=batch_size, num_workers=readers, collate_fn=refuses_the_marked_row)
    expected = outcomes(tud.DataLoader(dataset, **args))
    # torch's worker whose __iter__ raised has no fetcher: each of its later turns raises
    # UnboundLocalError, for ever; ours ends that reader's share after its error, by design
    # (test_an_iterable_dataset_that_cannot_start_ends_its_epoch.py). Its first turn holds.
    expected = [outcome for outcome in expected if outcome != "UnboundLocalError"]
    ours = DataLoader(dataset, persistent_workers=persistent, **args)
    try:
        for epoch in range(2):
            got = outcomes(ours)
            assert got == expected, f"epoch {epoch}: ours {got}\n torch's {expected}"
    finally:
        ours.close()
