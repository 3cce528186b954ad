"""A sampler (or batch sampler) that raises mid-epoch fails the batch it was to give, as
torch's iterator raises the sampler's error; the epoch then ends, and the next epoch runs
(persistent workers too). Before, its error ended the loader's pipeline: every ``next()``
after it raised ``PipelineStopped`` and never ``StopIteration`` (a loop that skips failed
batches never ended), and a persistent loader failed every later epoch. Found by the
generated parity test (a ``sampler`` fault)."""

import pytest
import torch.utils.data as tud

from agents.torch import DataLoader

from .loader_cases import Case, Fault, ListSampler, MapItems, bounded, index_of

CASE = Case("map", 10, "tiny", "tensor", False, {}, Fault("sampler", 4), "sampler")


def epoch(loader) -> list:
    """Each batch's first item, or the error's type; the end within a bound of the test's."""
    got = []
    batches = bounded(CASE, "iter()", iter, loader)
    while len(got) < 20:
        try:
            got.append(index_of(bounded(CASE, "next()", next, batches)))
        except StopIteration:
            return got
        except Exception as exc:  # noqa: BLE001 - compared with torch's
            got.append(type(exc).__name__)
    raise AssertionError(f"the epoch did not end: {got}")


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("batch_sampler", [False, True])
def test_a_sampler_that_raises_fails_one_batch_then_the_epoch_ends(persistent, batch_sampler):
    dataset = MapItems(10, "tiny", "tensor", Fault())
    if batch_sampler:
        batches = [[2 * k, 2 * k + 1] for k in range(5)]
        kwargs = {"batch_sampler": ListSampler(batches, Fault("sampler", 2, "KeyError"))}
    else:
        kwargs = {"sampler": ListSampler(list(range(10)), Fault("sampler", 4, "KeyError")),
                  "batch_size": 2}  # fmt: skip
    loader = DataLoader(dataset, num_workers=1, persistent_workers=persistent, **kwargs)
    theirs = tud.DataLoader(dataset, **kwargs)
    try:
        for _ in range(2):
            assert epoch(loader) == epoch(theirs) == [0, 2, "KeyError"]
    finally:
        bounded(CASE, "close()", loader.close)
