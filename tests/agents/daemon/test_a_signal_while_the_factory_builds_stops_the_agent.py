"""SIGINT or SIGTERM while ``intune-agent``'s factory builds the pipeline (waiting for a
mount, a download, a dataset being generated, or for ever) stops the agent at once, exit 0,
saying so. Before, the agent's note-only handlers were installed before the factory ran and
nothing looked at the note until it returned: a blocked factory was still running 10 s after
SIGTERM, and Ctrl-C did nothing either."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

FACTORY = """
import time
from pathlib import Path


def build_pipeline():
    Path({marker!r}).write_text("building")
    while True:  # waits on a mount that never comes; catches what a careless factory catches
        try:
            time.sleep(3600)
        except Exception:
            pass
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_factory_blocks_stops_the_agent_at_once(tmp_path, sig):
    marker = tmp_path / "building"
    (tmp_path / "blocked_factory.py").write_text(FACTORY.format(marker=str(marker)))
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    agent = subprocess.Popen(
        [sys.executable, "-m", "agents", "--url", "http://127.0.0.1:9", "--host-id", "1",
         "--token", "ia_test", "--pipeline", "blocked_factory:build_pipeline", "--no-train",
         "--state-dir", str(tmp_path / "state")],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the factory never ran"
        sent = time.monotonic()
        agent.send_signal(sig)
        output, _ = agent.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(5)
    assert took < 3.0, f"exited {took:.1f} s after {sig.name}"
    assert agent.returncode == 0, output
    assert f"stopped by {sig.name} while building the pipeline" in output
