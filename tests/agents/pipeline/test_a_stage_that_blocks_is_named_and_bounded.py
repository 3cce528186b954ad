"""A stage function that blocks (a read with no timeout, a lock never released) is the hang a
user meets most. The pipeline says where the items stand while the consumer waits, and with
``item_timeout_s`` the iterator raises ``PipelineStalled`` within its bound, the stage named;
``stop()`` then returns within its own bound.

Each case consumes the pipeline in a thread joined with a bound, so a hang fails the test
rather than stalling the suite.
"""

import logging
import os
import signal
import threading
import time

import pytest

from agents.pipeline import Pipeline, PipelineStalled, Stage

BOUND_S = 20.0


def consume(pipeline: Pipeline) -> dict:
    """Iterate in a thread, joined with a bound; what it got and how it ended."""
    result = {"items": [], "error": None}

    def run():
        try:
            for item in pipeline:
                result["items"].append(item)
        except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"the consumer still waited after {BOUND_S} s"
    result["took_s"] = time.monotonic() - started
    return result


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_item_timeout_names_the_stage_that_blocks(kind):
    release = threading.Event()

    def parse(x):
        if x == 3:
            # A thread worker waits here until released; a process worker never is (the event
            # is its own copy), as a read with no timeout would.
            release.wait(60)
        return x

    pipeline = Pipeline(
        range(10),
        [
            Stage("read", lambda x: x, workers=1),
            Stage("parse", parse, workers=1, kind=kind),
            Stage("collate", lambda x: x, workers=1),
        ],
        queue_size=2,
        item_timeout_s=1.5,
    )
    with pipeline:
        result = consume(pipeline)
        stopping = time.monotonic()
        release.set()
    assert result["items"] == [0, 1, 2]
    error = result["error"]
    assert isinstance(error, PipelineStalled), error
    assert isinstance(error, TimeoutError)
    # Raised after the bound, not long after it (the queue is polled every 0.5 s).
    assert 1.5 <= result["took_s"] < 1.5 + 3.0, result["took_s"]
    message = str(error)
    assert "no item for" in message and "'parse'" in message, message
    # Items stand in front of parse (its queue) while nothing is ready for the consumer.
    assert "ready for the consumer 0" in message, message
    assert time.monotonic() - stopping < pipeline.stop_timeout_s + 3.0


def test_a_long_wait_is_logged_where_the_items_stand_and_the_pipeline_goes_on(caplog):
    release = threading.Event()

    def parse(x):
        if x == 2:
            release.wait(30)
        return x

    def release_later():
        time.sleep(2.0)
        release.set()

    pipeline = Pipeline(
        range(6),
        [Stage("read", lambda x: x, workers=1), Stage("parse", parse, workers=1, kind="thread")],
        queue_size=2,
        stall_warning_s=0.6,
    )
    caplog.set_level(logging.WARNING, logger="agents.pipeline")
    threading.Thread(target=release_later, daemon=True).start()
    with pipeline:
        result = consume(pipeline)
    # No timeout set: the consumer waited, was told why, and got every item once released.
    assert result["error"] is None, result["error"]
    assert result["items"] == list(range(6))
    warnings = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert warnings, [r.getMessage() for r in caplog.records]
    assert all("'parse'" in w for w in warnings), warnings


@pytest.mark.parametrize("option", ["item_timeout_s", "stall_warning_s"])
@pytest.mark.parametrize("value", [0, -1.0])
def test_a_timeout_that_is_not_positive_is_refused(option, value):
    with pytest.raises(ValueError, match=option):
        Pipeline(range(3), [Stage("a", lambda x: x)], **{option: value})


def _numbered(x: int) -> int:
    time.sleep(0.005)
    return x


@pytest.mark.timeout(60)
def test_a_worker_stopped_by_a_signal_is_named_where_the_consumer_waits():
    # A SIGSTOPped worker looks alive and keeps its items: nothing the pipeline can end by
    # itself. Before, the stall said only "'slow' 8 item(s) waiting, 2 worker(s)".
    pipeline = Pipeline(
        range(10**6), [Stage("slow", _numbered, workers=2)], item_timeout_s=2.0, queue_size=4
    )
    with pipeline:
        items = iter(pipeline)
        next(items)
        stopped = pipeline._pools[0].processes()[0].pid
        os.kill(stopped, signal.SIGSTOP)
        try:
            with pytest.raises(PipelineStalled) as stalled:
                for _ in range(10**6):
                    next(items)
            assert f"pid {stopped} stopped by a signal" in str(stalled.value)
            assert "kill -CONT" in str(stalled.value)
        finally:
            os.kill(stopped, signal.SIGCONT)
