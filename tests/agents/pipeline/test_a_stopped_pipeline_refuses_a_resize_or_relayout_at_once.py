"""``apply()`` and ``relayout()`` on a stopped pipeline raise ``PipelineStopped`` at once and
say why, rather than record an allocation no worker will ever run."""

from __future__ import annotations

import time

import pytest

from agents.pipeline import Pipeline, PipelineStopped, Stage


def inc(x):
    return x + 1


def _pipeline() -> Pipeline:
    return Pipeline(
        range(100), [Stage("a", inc, kind="thread"), Stage("b", inc, kind="thread")], name="p"
    )


def test_a_resize_of_a_stopped_pipeline_raises_pipeline_stopped():
    pipeline = _pipeline().start()
    pipeline.stop()
    with pytest.raises(PipelineStopped, match="was stopped: it cannot apply"):
        pipeline.apply({"a": 2})
    assert pipeline.allocation == {"a": 1, "b": 1}


def test_a_relayout_of_a_stopped_pipeline_raises_at_once_instead_of_waiting():
    pipeline = _pipeline().start()
    pipeline.stop()
    began = time.monotonic()
    with pytest.raises(PipelineStopped, match="cannot change its layout"):
        pipeline.relayout("a+b", timeout_s=5.0)
    assert time.monotonic() - began < 0.5
    assert pipeline.layout == [["a"], ["b"]]


def test_an_unstarted_pipeline_still_takes_a_resize_for_its_start():
    pipeline = _pipeline()
    pipeline.apply({"a": 2})
    assert pipeline.allocation == {"a": 2, "b": 1}
