"""A stage's error crosses process boundaries (a rank's trainer, a DDP worker, a test's child
process): ``StageFailed``, and the error of the stage's own type that ``as_raised_type`` makes
of it, pickle and unpickle as themselves, fields included."""

from __future__ import annotations

import pickle

from agents.pipeline.errors import (
    LayoutBusy,
    PipelineStalled,
    PipelineStopped,
    StageFailed,
    as_raised_type,
)


def _failure(error_type: str = "") -> StageFailed:
    return StageFailed("parse", 7, "KeyError: 'x'", "Traceback ...", error_type, source_seq=9)


def test_a_stage_failed_pickles_and_unpickles_with_its_fields():
    failure = pickle.loads(pickle.dumps(_failure()))
    assert type(failure) is StageFailed
    assert (failure.stage, failure.seq, failure.error, failure.source_seq) == (
        "parse", 7, "KeyError: 'x'", 9
    )  # fmt: skip
    assert str(failure) == str(_failure())


def test_the_stages_own_error_type_pickles_and_unpickles_as_both_types():
    raised = as_raised_type(_failure("builtins:KeyError"))
    assert isinstance(raised, KeyError) and isinstance(raised, StageFailed)
    again = pickle.loads(pickle.dumps(raised))
    assert isinstance(again, KeyError) and isinstance(again, StageFailed)
    assert (again.stage, again.seq, again.traceback_text, again.source_seq) == (
        "parse", 7, "Traceback ...", 9
    )  # fmt: skip
    assert str(again) == str(raised)


def test_an_oserror_of_a_stage_pickles_and_unpickles():
    again = pickle.loads(pickle.dumps(as_raised_type(_failure("builtins:FileNotFoundError"))))
    assert isinstance(again, FileNotFoundError) and again.stage == "parse"


def test_the_pipelines_other_errors_pickle_and_unpickle():
    for error in (PipelineStopped("stopped"), PipelineStalled("stalled"), LayoutBusy("busy")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
