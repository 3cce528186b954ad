"""The agent's sampler and its relayouts run in different threads: every sample taken while
the layout changes names the stages as written, and ``Pipeline.metrics(by_unit=True)`` never
mixes two layouts. Before, a relayout between the agent's look at the layout and its
measurement shipped rows named by group (``a+b``), and one inside ``metrics()`` raised
"zip() argument 2 is shorter than argument 1" (2 in 200 calls)."""

import itertools
import threading
import time

import pytest

from agents.daemon.agent import Agent, AgentConfig
from agents.pipeline import LayoutBusy, Pipeline, PipelineStopped, Stage

LAYOUTS = ["a,b,c", "a+b,c", "a,b+c", "a+b+c"]


def passed_on(x: int) -> int:
    return x


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_samples_taken_while_the_layout_changes_name_every_stage_as_written(kind):
    stages = [Stage(name, passed_on, kind=kind, max_workers=4) for name in "abc"]
    pipeline = Pipeline(itertools.count(), stages, queue_size=2)
    # Never started: take_sample() alone is called, with no control plane to reach.
    agent = Agent(pipeline, AgentConfig(url="http://127.0.0.1:9", host_id=1, token="ia_test"))
    done = threading.Event()
    changes = 0

    def relayouts() -> None:
        nonlocal changes
        for layout in itertools.cycle(LAYOUTS):
            if done.is_set():
                return
            try:
                pipeline.relayout(layout, timeout_s=0.5)
                changes += 1
            except LayoutBusy:
                pass

    def consume() -> None:
        try:
            for _ in pipeline:
                pass
        except PipelineStopped:
            pass  # stopped under it at the test's end

    with pipeline:
        threading.Thread(target=consume, daemon=True).start()
        changer = threading.Thread(target=relayouts, daemon=True)
        changer.start()
        try:
            deadline = time.monotonic() + 8.0
            samples = 0
            while time.monotonic() < deadline and (samples < 150 or changes < 20):
                sample = agent.take_sample()
                assert [s["name"] for s in sample["stages"]] == ["a", "b", "c"]
                rows = pipeline.metrics(by_unit=True)
                assert [r["name"] for r in rows] == ["a", "b", "c"]
                samples += 1
        finally:
            done.set()
            changer.join(5)
    assert changes >= 5, "the layout hardly changed: the race was not exercised"
