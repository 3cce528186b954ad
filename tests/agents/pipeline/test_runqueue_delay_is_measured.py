"""Each stage reports its workers' run-queue delay (``runqueue_percent``): the time they were
runnable but waiting for a CPU, read from ``/proc/<pid>/task/<tid>/schedstat``.

The contended cases pin a stage's worker to one core beside two processes that spin on the same
core, so the worker gets about a third of it whatever else the machine runs.
"""

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.budget import WAITING_BELOW, cpu_per_busy_worker, worker_cpu
from agents.pipeline import Pipeline, Stage
from agents.pipeline.examples import Work
from agents.pipeline.schedstat import process_runqueue_seconds, thread_runqueue_seconds

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").exists(),
    reason="this kernel keeps no schedstat (CONFIG_SCHED_INFO)",
)

CORE = sorted(os.sched_getaffinity(0))[-1]


def _spin_on(core: int, pinned) -> None:
    os.sched_setaffinity(0, {core})
    pinned.set()
    while True:
        pass


class PinnedSpin:
    """A stage function that pins its own thread to ``core`` and spins ``ms`` of wall time."""

    def __init__(self, core: int, ms: float = 5.0) -> None:
        self.core, self.work, self.pinned = core, Work(ms=ms, spin=True), False

    def __call__(self, item: int) -> int:
        if not self.pinned:
            os.sched_setaffinity(0, {self.core})  # on Linux: this thread only
            self.pinned = True
        return self.work(item)


@pytest.fixture
def contended_core():
    """Two processes spinning on ``CORE`` for the length of a test, both spinning before it
    starts: a spawned interpreter can take seconds to start on a loaded host, and a measurement
    taken while only one of them spins sees the worker get half the core, not a third."""
    context = multiprocessing.get_context("spawn")
    pinned = [context.Event() for _ in range(2)]
    burners = [
        context.Process(target=_spin_on, args=(CORE, event), daemon=True) for event in pinned
    ]
    for burner in burners:
        burner.start()
    for event in pinned:
        assert event.wait(60), "a spinning process did not start within 60 s"
    yield CORE
    for burner in burners:
        burner.kill()
        burner.join(5)


def _measure(pipeline: Pipeline, seconds: float) -> list[dict]:
    iterator = iter(pipeline)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        next(iterator)
    pipeline.metrics()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        next(iterator)
    return pipeline.metrics()


def test_schedstat_is_read_for_a_thread_and_for_a_whole_process(tmp_path):
    for tid, text in ((10, "500 2500000000 7\n"), (11, "9 500000000 1\n")):
        (tmp_path / "42" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "42" / "task" / str(tid) / "schedstat").write_text(text)
    assert thread_runqueue_seconds(10, 42, proc=tmp_path) == pytest.approx(2.5)
    assert process_runqueue_seconds(42, proc=tmp_path) == pytest.approx(3.0)
    assert thread_runqueue_seconds(12, 42, proc=tmp_path) is None
    assert process_runqueue_seconds(43, proc=tmp_path) is None
    (tmp_path / "42" / "task" / "10" / "schedstat").write_text("garbled\n")
    assert thread_runqueue_seconds(10, 42, proc=tmp_path) is None


def test_a_live_process_has_a_run_queue_delay_that_only_grows():
    """Read from a process of one thread, which keeps its threads: the figure sums the threads
    alive now, so the test process's own (pytest's, whose other tests' threads end while it
    reads) went down by 17 ms once in the clean-clone suite of 2026-11-30."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
    try:
        first = process_runqueue_seconds(child.pid)
        assert first is not None and first >= 0
        for _ in range(5):
            time.sleep(0.05)
            now = process_runqueue_seconds(child.pid)
            assert now is not None and now >= first
            first = now
        assert thread_runqueue_seconds(child.pid, child.pid) is not None
    finally:
        child.kill()
        child.wait(10)


def test_a_process_worker_held_back_from_its_core_reports_the_wait(contended_core):
    stage = Stage("spin", Work(ms=5, spin=True), cpu_affinity=[contended_core])
    with Pipeline(range(10**9), [stage]) as pipeline:
        (row,) = _measure(pipeline, 2.0)
    busy_workers = row["workers"] * row["busy_fraction"]
    # A third of the core: it used about 33% and waited about 67% of the time.
    assert row["runqueue_percent"] > 30, row
    assert row["cpu_percent"] / 100 / busy_workers < WAITING_BELOW, "read alone, it 'waits'"
    wanted = cpu_per_busy_worker(
        row["cpu_percent"], row["workers"], row["busy_fraction"], row["runqueue_percent"]
    )
    assert worker_cpu(wanted) == 1.0, (row, wanted)


def test_a_thread_worker_held_back_from_its_core_reports_the_wait(contended_core):
    stage = Stage("spin", PinnedSpin(contended_core), kind="thread")
    with Pipeline(range(10**9), [stage]) as pipeline:
        (row,) = _measure(pipeline, 2.0)
    assert row["runqueue_percent"] > 30, row
    wanted = cpu_per_busy_worker(
        row["cpu_percent"], row["workers"], row["busy_fraction"], row["runqueue_percent"]
    )
    assert worker_cpu(wanted) == 1.0, (row, wanted)


def fetch(item: int) -> int:
    """A stage function that waits: 50 ms asleep, then 1 ms of work."""
    time.sleep(0.05)
    return Work(ms=1, spin=True)(item)


def test_a_worker_that_sleeps_hardly_waits_for_a_cpu():
    with Pipeline(range(10**9), [Stage("fetch", fetch, workers=2, kind="thread")]) as p:
        (row,) = _measure(p, 1.0)
    assert row["busy_fraction"] > 0.8
    # Each wake-up may wait for a CPU on a loaded machine (with 20 ms asleep, a quarter of the
    # time at load 12 on 2 cores was seen), but less than half its busy time: it still waits.
    wanted = cpu_per_busy_worker(
        row["cpu_percent"], row["workers"], row["busy_fraction"], row["runqueue_percent"]
    )
    assert wanted is not None and wanted < WAITING_BELOW, (row, wanted)


def test_each_stage_reports_the_delay_of_its_own_workers_since_the_last_call(monkeypatch):
    # Every thread waits for a CPU a tenth of the time, whatever the machine does.
    monkeypatch.setattr(
        "agents.pipeline.pipeline.thread_runqueue_seconds", lambda tid: 0.1 * time.monotonic()
    )
    stages = [
        Stage("fetch", fetch, workers=2, kind="thread"),
        Stage("parse", Work(ms=1), workers=3, kind="thread"),
    ]
    with Pipeline(range(10**9), stages) as pipeline:
        _measure(pipeline, 0.5)
        for _ in range(3):
            time.sleep(0.3)
            fetch_row, parse_row = pipeline.metrics()
            assert fetch_row["runqueue_percent"] == pytest.approx(2 * 10.0, rel=0.05)
            assert parse_row["runqueue_percent"] == pytest.approx(3 * 10.0, rel=0.05)
