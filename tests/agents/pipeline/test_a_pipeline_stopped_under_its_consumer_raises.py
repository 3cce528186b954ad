"""A pipeline stopped from another thread while its consumer iterates raises
``PipelineStopped`` in the consumer's loop. Before, the loop simply ended: a training loop
took the rest of its epoch as read and went on (a checkpoint, the next epoch), data lost
without a word. ``consume_until`` (the agent's and the CLI's drain) ends quietly when the
stop was asked for, and raises when it was not.

Generated cases (hypothesis) with both cores kept busy, each under a watchdog that dumps every
thread's stack and fails rather than hang."""

import faulthandler
import itertools
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, PipelineStopped, Stage, consume_until
from tests.agents.pipeline.stress import STOP_BOUND_S, Burner, bounded

CASE_BOUND_S = 30.0
TAKE_BOUND_S = 10.0


def _inc(x):
    return x + 1


class Source:
    """``n`` items, then endless ones (``flowing``) or a wait for ``release`` (blocked)."""

    def __init__(self, n: int, flowing: bool, release: threading.Event):
        self.n, self.flowing, self.release = n, flowing, release

    def __call__(self):
        yield from range(self.n)
        if self.flowing:
            yield from itertools.count(self.n)
        self.release.wait(60)


@pytest.fixture(scope="module")
def busy_cores():
    burners = [Burner(), Burner()]
    for burner in burners:
        burner.set(True)
    yield
    for burner in burners:
        burner.set(False)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a hang is reported, not shrunk
)
@given(
    n=st.integers(0, 6),
    flowing=st.booleans(),
    kinds=st.lists(st.sampled_from(["thread", "process"]), min_size=1, max_size=2),
    how=st.sampled_from(["loop", "consume_until unasked", "consume_until asked"]),
    slow=st.booleans(),  # the consumer takes its time per item (a training step)
)
def test_a_stop_from_another_thread_raises_in_the_consumer_unless_it_asked(
    busy_cores, n, flowing, kinds, how, slow
):
    release = threading.Event()
    pipeline = Pipeline(
        Source(n, flowing, release),
        [Stage(f"s{k}", _inc, kind=kind) for k, kind in enumerate(kinds)],
        stop_timeout_s=1.0,
        queue_size=4,
    ).start()
    faulthandler.dump_traceback_later(CASE_BOUND_S, exit=True, file=sys.stderr)
    asked = threading.Event()
    outcome: dict = {"taken": []}
    first = threading.Event()

    def each(item):
        outcome["taken"].append(item)
        first.set()
        if slow:
            time.sleep(0.01)

    def consume():
        try:
            if how == "loop":
                for item in pipeline:
                    each(item)
            else:
                consume_until(pipeline, asked, each)
            outcome["ended"] = "quietly"
        except PipelineStopped as exc:
            outcome["ended"] = exc

    try:
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        if n:
            assert first.wait(TAKE_BOUND_S), "no item reached the consumer"
        else:
            time.sleep(0.2)  # the consumer waits on the blocked (or flowing) source
        if how == "consume_until asked":
            asked.set()
        bounded("stop", STOP_BOUND_S, pipeline.stop)
        consumer.join(TAKE_BOUND_S)
        assert not consumer.is_alive(), "the consumer was still waiting after stop()"
    finally:
        release.set()
        pipeline.stop()
        faulthandler.cancel_dump_traceback_later()
    taken = outcome["taken"]
    assert taken == [i + len(kinds) for i in range(len(taken))]  # in order, none lost before
    if how == "consume_until asked":
        assert outcome["ended"] == "quietly"
    else:
        error = outcome["ended"]
        assert isinstance(error, PipelineStopped), error
        assert f"after its consumer took {len(taken)} item(s)" in str(error)
        assert "dropped" in str(error)


def test_a_loop_started_on_a_stopped_pipeline_raises_rather_than_ending_empty():
    pipeline = Pipeline(itertools.count(), [Stage("s", _inc, kind="thread")]).start()
    pipeline.stop()
    with pytest.raises(PipelineStopped, match="was stopped"):
        next(iter(pipeline))


def test_a_pipeline_that_ran_to_its_end_still_ends_quietly():
    with Pipeline(range(5), [Stage("s", _inc, kind="thread")]) as pipeline:
        assert list(pipeline) == [1, 2, 3, 4, 5]
        assert list(pipeline) == []  # looped again after its end: ends at once, as before
