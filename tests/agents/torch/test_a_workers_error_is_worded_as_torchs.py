"""An error raised in a loader's worker reaches the training loop worded as torch's
DataLoader words it: "Caught KeyError in DataLoader worker process 0.", then "Original
Traceback (most recent call last):" and the worker's traceback, the original error last (the
words scripts and log searches look for); the stage and batch are the error's attributes. Without workers torch
raises the error itself, and ours reads as that error, its frames in the process that ran the
batch indented under its first line.

Before: "stage 'fetch+collate' failed on item 1: ValueError: row 13 is bad" and "--- traceback
in the worker ---" (found by the exit hunter, seeds 7112 and 7122, 2026-11-29)."""

from __future__ import annotations

import pickle
import re
import traceback

import pytest
import torch

from agents.torch import DataLoader


class Odd(OSError):
    pass


class Rows(torch.utils.data.Dataset):
    def __init__(self, kind: type[Exception]) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        if i == 7:
            raise self.kind(f"row {i} is bad")
        return i


def _first_error(loader_class, kind, workers: int) -> BaseException:
    loader = loader_class(Rows(kind), batch_size=2, num_workers=workers)
    with pytest.raises(kind) as raised:
        for _ in loader:
            pass
    return raised.value


def _shape(message: str) -> list[str]:
    """The lines that must match torch's: the first two, and the original error's."""
    lines = message.splitlines()
    last = next(line for line in reversed(lines) if "row 7 is bad" in line)
    return [re.sub(r"\d+", "N", lines[0]), lines[1], last]


@pytest.mark.parametrize("kind", [KeyError, Odd])
def test_a_workers_error_reads_as_torchs(kind):
    torchs = _first_error(torch.utils.data.DataLoader, kind, 2)
    ours = _first_error(DataLoader, kind, 2)
    assert _shape(str(ours)) == _shape(str(torchs)), str(ours)
    assert str(ours).startswith(f"Caught {kind.__name__} in DataLoader worker process ")
    assert str(ours).splitlines()[-1] == str(torchs).splitlines()[-1]  # the original error
    assert (ours.stage, ours.seq) == ("fetch+collate", 3)
    again = pickle.loads(pickle.dumps(ours))  # a rank's or a child's error crosses processes
    assert type(again).__name__ == kind.__name__ and str(again) == str(ours)


@pytest.mark.parametrize("kind", [ValueError, KeyError, Odd])
def test_without_workers_the_error_reads_as_torchs_raised_itself(kind):
    # torch's loader without workers raises the dataset's error itself: a script that dies of
    # it ends its stderr with "ValueError: row 7 is bad". Ours starts with the same line, and
    # its frames in the process that ran the batch follow, indented: no second "Traceback"
    # or error line at the margin (the exit hunter's seed 9106 counted two of each).
    torchs = _first_error(torch.utils.data.DataLoader, kind, 0)
    ours = _first_error(DataLoader, kind, 0)
    torchs_line = traceback.format_exception_only(torchs)[0].rstrip()
    ours_lines = "".join(traceback.format_exception_only(ours)).rstrip().splitlines()
    assert ours_lines[0] == torchs_line
    assert all(line.startswith(" ") for line in ours_lines[1:]), ours_lines
    assert "in __getitem__" in str(ours) and "DataLoader worker process" not in str(ours)
    assert (ours.stage, ours.seq) == ("fetch+collate", 3)
    again = pickle.loads(pickle.dumps(ours))
    assert type(again).__name__ == kind.__name__ and str(again) == str(ours)


class Shards(torch.utils.data.IterableDataset):
    """Each worker reads its share; worker 1 fails at its second row."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for k, i in enumerate(range(worker, 12, workers)):
            if worker == 1 and k == 1:
                raise KeyError(f"row {i} is bad")
            yield i


def test_an_iterable_readers_error_names_that_reader_as_torchs():
    def first(loader_class) -> str:
        with pytest.raises(KeyError) as raised:
            for _ in loader_class(Shards(), batch_size=None, num_workers=2):
                pass
        return str(raised.value)

    torchs, ours = first(torch.utils.data.DataLoader), first(DataLoader)
    assert torchs.startswith("Caught KeyError in DataLoader worker process 1.")
    assert ours.splitlines()[:2] == torchs.splitlines()[:2], ours
    assert ours.splitlines()[-1] == torchs.splitlines()[-1], ours
