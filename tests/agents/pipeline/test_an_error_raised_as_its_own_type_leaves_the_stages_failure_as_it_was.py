"""``as_raised_type`` makes a new error of the stage's failure and leaves the failure as it was:
it set the failure's ``where`` (torch's "in DataLoader worker process N" words) in place, so a
failure raised again elsewhere, or kept as another error's cause, changed its message."""

from __future__ import annotations

import pytest

from agents.pipeline.errors import RAISED_HERE, StageFailed, as_raised_type


class NeedsTwo(Exception):
    """An error type that cannot be built from a message alone."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


@pytest.mark.parametrize(
    "error_type",
    [
        "builtins:KeyError",  # a type of both (StageFailed and KeyError)
        "builtins:RuntimeError",  # StageFailed is one already
        "",  # the runtime's own failure: no type
        "no.such.module:Error",  # a type this process does not have
        f"{__name__}:NeedsTwo",  # built neither way: the StageFailed
    ],
)
@pytest.mark.parametrize("in_worker", [None, False, True])
def test_the_failure_given_is_left_as_it_was(error_type: str, in_worker: bool | None) -> None:
    cause = ValueError("the cause")
    failure = StageFailed("read+collate", 3, "KeyError: 'x'", "Traceback ...\nKeyError: 'x'\n",
                          error_type, source_seq=5, worker=1)  # fmt: skip
    failure.__cause__ = cause
    message = str(failure)
    raised = as_raised_type(failure, in_worker=in_worker)
    assert raised is not failure
    assert failure.where == "" and str(failure) == message
    assert failure.__cause__ is cause
    assert isinstance(raised, StageFailed) or isinstance(raised.__cause__, StageFailed)
    made = raised if isinstance(raised, StageFailed) else raised.__cause__
    where = {None: "", False: RAISED_HERE, True: "in DataLoader worker process 1"}[in_worker]
    assert made.where == where
    assert (made.stage, made.seq, made.source_seq, made.worker) == ("read+collate", 3, 5, 1)
