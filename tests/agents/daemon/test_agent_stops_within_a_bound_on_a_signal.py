"""``intune-agent`` stops within a bound on SIGTERM or Ctrl-C (SIGINT), whatever its pipeline
and the control plane are doing, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
# The agent's own bounds: the shipper's last try (5 s), the pipeline's stop (about 3 s), the
# consumer's join (5 s); a hang would be far past this.
STOP_BOUND_S = 15.0


def _start_agent(url: str, host_id: int, token: str, pipeline: str, state: Path):
    return subprocess.Popen(
        [sys.executable, "-m", "agents", "--url", url, "--host-id", str(host_id),
         "--token", token, "--pipeline", pipeline, "--state-dir", str(state),
         "--interval", "0.2", "--batch-seconds", "0.5", "--log-level", "INFO"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def _wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.05)


def _stop_and_time(agent: subprocess.Popen, sig: int) -> tuple[float, str, list]:
    family = psutil.Process(agent.pid).children(recursive=True)
    began = time.monotonic()
    agent.send_signal(sig)
    try:
        output, _ = agent.communicate(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        agent.kill()
        output, _ = agent.communicate(timeout=10)
        raise AssertionError(f"the agent did not stop within {STOP_BOUND_S} s:\n{output}") from None
    took = time.monotonic() - began
    _wait_for(lambda: not any(p.is_running() and p.status() != "zombie" for p in family), 5,
              "the agent's processes to end")  # fmt: skip
    return took, output, family


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_running_agent_stops_at_once_on_a_signal(control_plane, tmp_path, sig):
    host = control_plane.add_host(["read", "parse"])
    agent = _start_agent(control_plane.url, host.id, host.token, "cli_pipelines:build", tmp_path)
    try:
        _wait_for(lambda: len(host.samples) >= 3, 30, "samples from the agent")
        took, output, family = _stop_and_time(agent, sig)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, output
    assert family, "the agent had started no pipeline worker to check"
    assert took < STOP_BOUND_S
    assert "agent stopped" in output


def test_an_agent_stuck_in_user_code_and_cut_off_from_the_control_plane_still_stops(
    control_plane, tmp_path
):
    host = control_plane.add_host(["read", "parse"])
    agent = _start_agent(
        control_plane.url, host.id, host.token, "cli_pipelines:build_stuck", tmp_path
    )
    try:
        _wait_for(lambda: len(host.samples) >= 3, 30, "samples from the agent")
        control_plane.stop()  # its last batch cannot be sent now
        time.sleep(1.0)  # both read workers are inside their 600 s sleep by now
        took, output, _ = _stop_and_time(agent, signal.SIGTERM)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, output
    assert took < STOP_BOUND_S
