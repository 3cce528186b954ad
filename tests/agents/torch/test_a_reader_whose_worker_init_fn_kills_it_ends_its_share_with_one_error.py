"""A reader of an IterableDataset whose worker_init_fn kills its process: one error, then the
epoch ends after the other readers' shares.

Every replacement of that reader ran worker_init_fn again and died before recording that it
began the epoch, so each tick failed (WorkerDied) and no reader lived to end the dead one's
share: a loop that skips failed batches never ended its epoch. torch raises once, the epoch
ends.
"""

import os

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from agents.torch import DataLoader
from tests.agents.torch.conftest import skip_errors_epoch


class Shards(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        for row in range(info.id, 40, info.num_workers):
            yield torch.tensor([row])


def exit_in_reader_0(worker_id):
    if worker_id == 0:
        os._exit(3)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_loop_that_skips_failed_batches_ends_its_epoch_when_worker_init_fn_kills_a_reader(
    workers, persistent
):
    loader = DataLoader(
        Shards(),
        batch_size=2,
        num_workers=workers,
        timeout=20,
        worker_init_fn=exit_in_reader_0,
        persistent_workers=persistent,
    )
    try:
        for epoch in range(2):
            rows, errors = skip_errors_epoch(loader, 30, f"epoch {epoch}", max_errors=5)
            assert len(errors) == 1, (epoch, errors)
            assert "reader 0" in str(errors[0])
            assert len(rows) == len(set(rows)), "a row came twice"
            assert set(rows) == {r for r in range(40) if r % workers != 0}  # the others' shares
    finally:
        loader.close()
