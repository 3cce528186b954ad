"""A ``KeyboardInterrupt`` or ``sys.exit()`` raised by ``__getitem__`` reaches the training
loop as torch gives it: with ``num_workers=0`` as itself (not caught by a loop's ``except
Exception``; ``sys.exit(3)`` ends the script with status 3), and the batches after it come
if the loop catches it; with workers as a ``RuntimeError`` (torch's worker dies of it and the
loop gets "exited unexpectedly").

The parity hunter found it (``--replay 2044``): ours raised a ``StageFailed`` (a
``RuntimeError``) whatever ``num_workers``, which a skip-bad-batches loop swallowed where
torch's loop stopped.
"""

from __future__ import annotations

import sys

import pytest
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader


class Raises(tud.Dataset):
    def __init__(self, at: int, what: str) -> None:
        self.at, self.what = at, what

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            if self.what == "interrupt":
                raise KeyboardInterrupt
            sys.exit(3 if self.what == "exit_code" else "bad row")
        return i


def outcomes(loader) -> list:
    got = []
    iterator = iter(loader)
    while True:
        try:
            got.append(("batch", next(iterator).tolist()))
        except StopIteration:
            return got
        except BaseException as exc:  # noqa: BLE001 - what the test compares
            code = exc.code if isinstance(exc, SystemExit) else None
            got.append(("error", type(exc).__name__, isinstance(exc, Exception), code))
        finally:
            if isinstance(loader, DataLoader) and len(got) > 8:
                raise AssertionError(f"no end: {got}")


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(at=st.integers(0, 5), what=st.sampled_from(["interrupt", "exit_code", "exit_message"]))
def test_with_no_workers_it_reaches_the_loop_as_itself(at, what):
    theirs = outcomes(tud.DataLoader(Raises(at, what), batch_size=2))
    loader = DataLoader(Raises(at, what), batch_size=2)
    try:
        ours = outcomes(loader)
    finally:
        loader.close()
    if what == "exit_message":  # torch's code is its message; ours names the stage too
        ours = [o[:3] if o[0] == "error" else o for o in ours]
        theirs = [o[:3] if o[0] == "error" else o for o in theirs]
    assert ours == theirs


@pytest.mark.parametrize("what", ["interrupt", "exit_code"])
def test_with_workers_it_is_a_runtime_error_as_a_dead_torch_worker_is(what):
    loader = DataLoader(Raises(2, what), batch_size=2, num_workers=1)
    try:
        ours = outcomes(loader)
    finally:
        loader.close()
    assert ours[0] == ("batch", [0, 1]) and ours[2:] == [("batch", [4, 5])], ours
    assert ours[1][:3] in (("error", "StageFailed", True), ("error", "RuntimeError", True)), ours
