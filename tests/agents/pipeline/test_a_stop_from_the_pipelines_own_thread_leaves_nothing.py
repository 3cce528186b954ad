"""``stop()`` called from one of the pipeline's own threads (a thread stage's function; the
garbage collection of a dropped DataLoader, which runs in whichever thread allocates) returns
within its bound and leaves no process behind. Before, it raised "cannot join current thread"
half-way, and the launcher and its workers ran on (a second stop() did nothing)."""

import faulthandler
import itertools
import sys
import time

import psutil
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, PipelineStopped, Stage
from tests.agents.pipeline.stress import STOP_BOUND_S

CASE_BOUND_S = 30.0


class StopsItsPipeline:
    """A thread stage's function that stops its own pipeline at item ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.pipeline: Pipeline | None = None
        self.took: float | None = None
        self.error: BaseException | None = None

    def __call__(self, x: int) -> int:
        if x == self.at and self.took is None:
            began = time.monotonic()
            try:
                self.pipeline.stop()
            except BaseException as exc:  # noqa: BLE001 - looked at by the test
                self.error = exc
            self.took = time.monotonic() - began
        return x


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    at=st.integers(0, 8),
    before=st.lists(st.sampled_from(["thread", "process"]), max_size=1),
    after=st.lists(st.sampled_from(["thread", "process"]), max_size=2),
)
def test_a_stage_that_stops_its_own_pipeline_ends_it_whole(at, before, after):
    known = _children()
    stopper = StopsItsPipeline(at)
    stages = [Stage(f"b{k}", abs, kind=kind) for k, kind in enumerate(before)]
    stages.append(Stage("stopper", stopper, kind="thread"))
    stages += [Stage(f"a{k}", abs, kind=kind) for k, kind in enumerate(after)]
    pipeline = Pipeline(itertools.count(), stages, stop_timeout_s=1.0, queue_size=4)
    stopper.pipeline = pipeline
    faulthandler.dump_traceback_later(CASE_BOUND_S, exit=True, file=sys.stderr)
    try:
        pipeline.start()
        try:
            for _ in pipeline:
                pass
        except PipelineStopped:
            pass
        deadline = time.monotonic() + STOP_BOUND_S
        while stopper.took is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        pipeline.stop()
        faulthandler.cancel_dump_traceback_later()
    assert stopper.error is None, repr(stopper.error)
    assert stopper.took is not None and stopper.took < STOP_BOUND_S
    left = [psutil.Process(pid) for pid in _children() - known if psutil.pid_exists(pid)]
    _, alive = psutil.wait_procs(left, timeout=3.0)
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"
