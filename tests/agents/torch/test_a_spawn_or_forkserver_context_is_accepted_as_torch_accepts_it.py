"""``multiprocessing_context="spawn"`` (or ``"forkserver"``, or such a context object), which
training scripts pass for CUDA's sake, is accepted as torch accepts it: the loader's workers
fork from its launcher, a process that runs no thread, whatever the argument names. Before,
the constructor raised ``ValueError`` ("use None or 'fork'"): the script could not change one
import and run."""

import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader

from agents.torch import DataLoader


class Local(torch.utils.data.Dataset):
    """Made in the test (a lambda inside): spawn could not pickle it; a fork needs not."""

    def __init__(self) -> None:
        self.square = lambda i: i * i

    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int):
        return torch.tensor([i, self.square(i)])


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork", "spawn-object"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_spawn_or_forkserver_context_gives_torchs_batches(context, persistent):
    if context == "spawn-object":
        context = multiprocessing.get_context("spawn")
    loader = DataLoader(Local(), batch_size=2, num_workers=2, multiprocessing_context=context,
                        persistent_workers=persistent)  # fmt: skip
    try:
        for _ in range(2):
            ours = [batch.tolist() for batch in loader]
            assert ours == [batch.tolist() for batch in TorchLoader(Local(), batch_size=2)]
    finally:
        loader.close()


def test_a_context_without_workers_is_refused_as_torch_refuses_it():
    with pytest.raises(ValueError, match="multi-process loading"):
        DataLoader(Local(), multiprocessing_context="spawn")
