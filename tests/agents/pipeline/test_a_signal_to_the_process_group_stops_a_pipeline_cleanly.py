"""Ctrl-C (SIGINT) or SIGTERM sent to a pipeline's whole process group, at any moment (during
its start, mid-iteration, during a resize, during its stop), ends the process within a bound
and leaves no process and no shared-memory file of the pipeline behind.

Generated: the pipeline's shape (stages, workers per stage, item sizes, under and over the
shared-memory threshold) and the moment of the signal. The pipeline runs in a child process
in a session of its own, so that the signal never reaches pytest."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline.shm import SHM_DIR

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
EXIT_BOUND_S = 5.0  # the pipeline's stop is bounded at stop_timeout_s (1 s) plus about a second
LEFTOVER_BOUND_S = 3.0  # the launcher sees its parent gone within 0.2 s, then kills and sweeps


def _read_until(child: subprocess.Popen, wanted: str, seen: dict, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = child.stdout.readline()  # the child prints a line at least every phase
        if not line:
            raise AssertionError(f"the child ended before '{wanted}': {child.stderr.read()}")
        key, _, value = line.strip().partition(" ")
        seen.setdefault(key, []).append(value)
        if line.strip() == wanted:
            return
    raise AssertionError(f"no '{wanted}' from the child within {seconds} s")


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    stages=st.integers(1, 3),
    workers=st.integers(1, 3),
    item_bytes=st.sampled_from([64, 200_000]),
    phase=st.sampled_from(["start", "iterate", "resize", "stop"]),
    delay_s=st.floats(0.0, 0.05),
    signum=st.sampled_from([signal.SIGINT, signal.SIGTERM]),
)
def test_a_signal_to_the_process_group_ends_the_pipeline_within_a_bound_leaving_nothing(
    stages, workers, item_bytes, phase, delay_s, signum
):
    child = subprocess.Popen(
        [sys.executable, str(HERE / "signalled.py"), str(stages), str(workers), str(item_bytes),
         phase],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        seen: dict = {}
        _read_until(child, f"phase {phase}", seen)
        time.sleep(delay_s)
        family = psutil.Process(child.pid).children(recursive=True)
        family += [psutil.Process(int(pid)) for pid in seen.get("launcher", []) if pid]
        began = time.monotonic()
        os.killpg(child.pid, signum)
        try:
            child.wait(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the pipeline's process did not end within {EXIT_BOUND_S} s of "
                f"{signal.Signals(signum).name} during {phase}"
            ) from None
        took = time.monotonic() - began
        deadline = time.monotonic() + LEFTOVER_BOUND_S
        while _alive(family) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(family), f"left running after {phase}: {_alive(family)}"
        prefix = seen["prefix"][0]
        while glob.glob(f"{SHM_DIR}/{prefix}-*") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not glob.glob(f"{SHM_DIR}/{prefix}-*"), f"shared memory left after {phase}"
        assert took < EXIT_BOUND_S
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        child.stdout.close()
        child.stderr.close()
