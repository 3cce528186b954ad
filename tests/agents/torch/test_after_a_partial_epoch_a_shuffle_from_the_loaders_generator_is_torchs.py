"""Known difference, left open: after an epoch left early, the next epoch's shuffle (drawn
from the loader's ``generator``) is torch's only where both read the sampler equally far.

torch reads the sampler ``prefetch_factor * num_workers`` batches ahead of the training loop
(none with ``num_workers=0``); ours reads as far as its queues allow. A ``RandomSampler``
draws once more from the generator when it is exhausted (torch's sampler.py), so a short
epoch left near its end has drawn that extra number in ours and not in torch's, and the
next epoch's order differs. Matching it means drawing the sampler in the training loop's
thread at torch's points, which caps the batches in flight at torch's prefetch: against
the point of resizing the stages. The generated parity test does not generate it (see
``loader_cases.cases``); this test shows it, and fails (strict) once it is fixed."""

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader


class Items(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return i


def two_epochs(loader_class) -> list[list[int]]:
    loader = loader_class(Items(), batch_size=None, shuffle=True,
                          generator=torch.Generator().manual_seed(1159))  # fmt: skip
    first = iter(loader)
    partial = [next(first) for _ in range(5)]
    whole = list(loader)
    if hasattr(loader, "close"):
        loader.close()
    return [partial, whole]


# Not strict: how far ahead of the loop the pipeline has read the sampler when the epoch is left
# depends on timing; where it happens to have read no further than torch, the orders agree (the
# clean-clone CI of 2026-11-24 07:41 saw it pass once, and a strict xfail failed the suite).
@pytest.mark.xfail(strict=False, reason="ours may read the sampler further ahead than torch")
def test_after_a_partial_epoch_the_next_shuffle_is_torchs():
    assert two_epochs(DataLoader) == two_epochs(tud.DataLoader)
