"""Per-stage metrics and consumer statistics measure what happened."""

import threading
import time

from agents.pipeline import Pipeline, Stage
from agents.pipeline.examples import Work

KEYS = {
    "name", "workers", "items_per_s", "busy_fraction", "in_queue", "out_queue",
    "queue_capacity", "cpu_percent", "fn_cpu_percent", "runqueue_percent", "rss_mb",
}  # fmt: skip


def _run_for(pipeline: Pipeline, seconds: float) -> int:
    taken = 0
    end = time.monotonic() + seconds
    for _ in pipeline:
        taken += 1
        if time.monotonic() > end:
            break
    return taken


def test_metrics_have_exactly_the_agreed_keys_for_every_stage():
    stages = [Stage("a", Work()), Stage("b", Work(), kind="thread")]
    with Pipeline(range(10**9), stages) as pipeline:
        _run_for(pipeline, 0.3)
        rows = pipeline.metrics()
    assert [row["name"] for row in rows] == ["a", "b"]
    assert all(set(row) == KEYS for row in rows)
    assert all(row["queue_capacity"] == 8 for row in rows)


def _in_queue_as_a_sampler_sees_it(pipeline: Pipeline, stage: int, seconds: float) -> list[int]:
    """The stage's ``in_queue`` read by a thread of its own every 37 ms while this thread keeps
    taking items, as the agent's sampler reads it: at moments not tied to the consumer's."""
    readings: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.037):
            readings.append(pipeline.metrics()[stage]["in_queue"])

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        _run_for(pipeline, seconds)
    finally:
        done.set()
        sampler.join(timeout=5)
    return readings


def test_a_sleeping_bottleneck_is_busy_and_its_input_queue_is_full():
    # The slow stage sleeps (50 ms an item, far longer than the fast stage needs even on a
    # loaded machine), so the figures hold on a shared machine as well.
    stages = [Stage("fast", Work()), Stage("slow", Work(ms=50), workers=2, kind="thread")]
    with Pipeline(range(10**9), stages, queue_size=4) as pipeline:
        _run_for(pipeline, 0.3)
        pipeline.metrics()
        _run_for(pipeline, 1.0)
        fast, slow = pipeline.metrics()
        # Not slow["in_queue"]: read right after the consumer's take, the queue is seen at the
        # instant the two slow workers, in step, have just taken their next items and the fast
        # process has yet to refill it (2 of 4, once in 15 runs with the 2 cores busy).
        in_queue = _in_queue_as_a_sampler_sees_it(pipeline, 1, 0.8)
    assert slow["busy_fraction"] > 0.8
    assert fast["busy_fraction"] < 0.5
    assert len(in_queue) >= 5
    assert sorted(in_queue)[len(in_queue) // 2] >= 3, in_queue  # full most of the time
    assert 25 < slow["items_per_s"] < 45  # two workers at 50 ms: at most 40 items/s
    assert slow["rss_mb"] == 0.0  # threads share the consumer's memory


_held: list[bytes] = []


def holding_8_mb(x: int) -> int:
    if not _held:
        _held.append(b"\x01" * (8 << 20))  # written, so resident
    return x


def test_a_process_stage_shows_the_memory_its_workers_hold_of_their_own():
    stages = [Stage("holds", holding_8_mb, workers=2), Stage("b", Work(), kind="thread")]
    with Pipeline(range(10**9), stages) as pipeline:
        _run_for(pipeline, 0.5)
        holds, b = pipeline.metrics()
    assert 8 <= holds["rss_mb"] < 2 * (8 + 48), holds  # one or both workers ran
    assert b["rss_mb"] == 0.0


def test_a_spinning_process_stage_shows_its_cpu_use():
    with Pipeline(range(10**9), [Stage("spin", Work(ms=5, spin=True))]) as pipeline:
        _run_for(pipeline, 0.2)
        pipeline.metrics()
        _run_for(pipeline, 1.0)
        (row,) = pipeline.metrics()
    assert row["cpu_percent"] > 25  # one spinning worker; the machine may be shared


def test_consumer_stats_say_the_consumer_waited_for_a_slow_pipeline():
    stages = [Stage("slow", Work(ms=20), kind="thread")]
    with Pipeline(range(10**9), stages, samples_per_item=10) as pipeline:
        _run_for(pipeline, 0.2)
        pipeline.consumer_stats()
        taken = _run_for(pipeline, 1.0)
        stats = pipeline.consumer_stats()
    assert stats["idle_fraction"] > 0.8
    assert stats["wait_ms"] > 10
    assert stats["device"] == "cpu"
    assert abs(stats["throughput"] - 10 * taken / 1.0) < 0.3 * 10 * taken


def test_consumer_stats_say_a_slow_consumer_did_not_wait():
    with Pipeline(range(10**9), [Stage("fast", Work())]) as pipeline:
        _run_for(pipeline, 0.3)
        pipeline.consumer_stats()
        end = time.monotonic() + 1.0
        for _ in pipeline:
            time.sleep(0.01)  # the consumer's own work
            if time.monotonic() > end:
                break
        stats = pipeline.consumer_stats()
    assert stats["idle_fraction"] < 0.2
    assert stats["step_ms"] >= 9


def test_a_wait_in_progress_is_counted_when_stats_are_taken():
    import threading

    stages = [Stage("stall", Work(ms=800), kind="thread")]
    with Pipeline(range(10**9), stages) as pipeline:
        consumer = threading.Thread(target=lambda: next(iter(pipeline)), daemon=True)
        consumer.start()
        pipeline.consumer_stats()
        time.sleep(0.5)
        stats = pipeline.consumer_stats()
        consumer.join(timeout=10)
        assert not consumer.is_alive(), "the consumer never got its item"
    assert stats["idle_fraction"] > 0.9
