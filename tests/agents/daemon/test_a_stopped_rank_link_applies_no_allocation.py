"""A rank's link to the host agent applies nothing once stopped: an allocation read just before
its stop reaches no pipeline that is being stopped (which would raise, or resize a pipeline
whose workers are leaving), and no answer goes out on the closing connection."""

from __future__ import annotations

from agents.daemon.ranks import RankLink


class RecordingPipeline:
    def __init__(self) -> None:
        self.applied: list[dict] = []
        self.allocation = {"read": 1}

    def apply(self, workers: dict) -> None:
        self.applied.append(workers)
        self.allocation = dict(workers)


class RecordingLines:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, message: dict) -> None:
        self.sent.append(message)


def _link(pipeline: RecordingPipeline) -> RankLink:
    return RankLink(pipeline, 0, 1, "\0intune-test-unused", trainer_stats=dict)


def test_a_running_link_applies_an_allocation_and_answers():
    pipeline, lines = RecordingPipeline(), RecordingLines()
    link = _link(pipeline)
    link._handle(lines, {"type": "allocation", "generation": 1, "workers": {"read": 3}})
    assert pipeline.applied == [{"read": 3}]
    assert [m["type"] for m in lines.sent] == ["applied"]


def test_a_stopped_link_applies_nothing_and_answers_nothing():
    pipeline, lines = RecordingPipeline(), RecordingLines()
    link = _link(pipeline)
    link.stop()
    link._handle(lines, {"type": "allocation", "generation": 1, "workers": {"read": 3}})
    assert pipeline.applied == [] and lines.sent == []
    assert link.applied_total == 0
