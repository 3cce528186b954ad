"""``intune-agent`` exits promptly when Ctrl-C (SIGINT) or SIGTERM reaches its whole process
group (the terminal's way): its handler only notes the signal, its waits look at the note every
0.2 s, its workers and launcher ignore the group's signal and are stopped by the agent.

Measured here, on a counting pipeline: the time from the signal to the agent's exit, over
several runs (the figures are printed; docs/reliability.md has them)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
RUNS = 3
MEDIAN_BOUND_S = 1.0  # measured 0.1 to 0.3 s on a shared 2-core host; a hang is far past it
ANY_BOUND_S = 5.0


def _exit_time(control_plane, tmp_path: Path, signum: int) -> float:
    host = control_plane.add_host(["read", "parse"])
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents", "--url", control_plane.url, "--host-id", str(host.id),
         "--token", host.token, "--pipeline", "cli_pipelines:build", "--state-dir",
         str(tmp_path), "--interval", "0.2", "--batch-seconds", "0.5"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while len(host.samples) < 2:
            assert time.monotonic() < deadline, "no samples from the agent within 30 s"
            assert agent.poll() is None, agent.stderr.read()
            time.sleep(0.05)
        family = psutil.Process(agent.pid).children(recursive=True)
        began = time.monotonic()
        os.killpg(agent.pid, signum)
        agent.wait(timeout=ANY_BOUND_S)
        took = time.monotonic() - began
        assert agent.returncode == 0, agent.stderr.read()
        gone = time.monotonic() + 3
        while any(p.is_running() and p.status() != "zombie" for p in family):
            assert time.monotonic() < gone, "the agent's workers outlived it"
            time.sleep(0.05)
        return took
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(timeout=10)
        agent.stderr.close()


def test_an_agent_exits_within_a_fraction_of_a_second_of_ctrl_c_to_its_group(
    control_plane, tmp_path
):
    times = [_exit_time(control_plane, tmp_path / str(k), signal.SIGINT) for k in range(RUNS)]
    print(f"agent exit after SIGINT to its group: {[round(t, 3) for t in times]} s")
    assert statistics.median(times) < MEDIAN_BOUND_S, times


def test_an_agent_exits_within_a_fraction_of_a_second_of_sigterm_to_its_group(
    control_plane, tmp_path
):
    took = _exit_time(control_plane, tmp_path, signal.SIGTERM)
    print(f"agent exit after SIGTERM to its group: {took:.3f} s")
    assert took < MEDIAN_BOUND_S
