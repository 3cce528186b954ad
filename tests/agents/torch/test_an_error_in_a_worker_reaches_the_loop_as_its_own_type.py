"""An error raised by the dataset, ``collate_fn`` or ``worker_init_fn`` in a worker reaches
the training loop as an error of its own type, as torch's DataLoader re-raises it, so that
``except KeyError:`` in the loop still catches it. It is a ``StageFailed`` too, naming the
stage and holding the worker's traceback. Before, it was only a ``StageFailed`` (a
``RuntimeError``), and every generated case with a fault differed from torch's."""

import pytest
import torch
import torch.utils.data as tud

from agents.pipeline import StageFailed
from agents.torch import DataLoader


class Refused(Exception):
    pass


class NeedsTwoArguments(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


ERRORS = [KeyError("row 3"), ValueError("bad row"), OSError(5, "disk"), Refused("no"),
          NeedsTwoArguments(7, "why"), IndexError("out")]  # fmt: skip


class FailsAt(tud.Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 3:
            raise self.error
        return torch.tensor(i)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_a_worker_is_raised_as_its_own_type_and_as_stagefailed(error, num_workers):
    loader = DataLoader(FailsAt(error), batch_size=2, num_workers=num_workers)
    try:
        batches = iter(loader)
        assert next(batches).tolist() == [0, 1]
        with pytest.raises(type(error)) as caught:
            next(batches)
        assert isinstance(caught.value, StageFailed)
        if num_workers:  # torch's words for a worker's error; the stage an attribute
            assert str(caught.value).startswith(f"Caught {type(error).__name__} in DataLoader")
        else:  # the error's own message first, as torch's raises it; then where it was
            assert "in stage 'fetch+collate', batch 1" in str(caught.value)
        assert caught.value.stage == "fetch+collate" and caught.value.seq == 1
        assert type(error).__name__ in caught.value.traceback_text
        if isinstance(error, OSError):  # as torch's, built from the message: no errno
            assert caught.value.errno is None and caught.value.filename is None
        with pytest.raises(type(error)):  # torch raises its own; the types agree
            list(tud.DataLoader(FailsAt(error), batch_size=2))
        assert next(batches).tolist() == [4, 5], "the epoch goes on after the failed batch"
    finally:
        loader.close()
