"""``kill -9`` of a training script's whole process group leaves nothing its pipeline's
workers started: a ``subprocess`` with a cleared environment (no mark), and one in a session
of its own (``start_new_session=True``, outside every group the kill reaches).

Before, the launcher and its workers were in the script's group and died with it at once:
nothing of the pipeline was left to end what had left the group (a ``sleep`` ran on under
init). The launcher now leads a group of its own: the kill does not reach it, it finds its
parent gone, ends its workers and what it adopted, and SIGKILLs its group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.processes import still_running

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from agents.pipeline import Pipeline, Stage

    TAG, HOW = sys.argv[1], sys.argv[2]
    started = set()

    def fn(x):
        if os.getpid() not in started:
            started.add(os.getpid())
            env = {"PATH": os.environ.get("PATH", "")}
            subprocess.Popen(["sleep", TAG], env=env, start_new_session=HOW == "session")
        time.sleep(0.01)
        return x

    with Pipeline(range(10**6), [Stage("s", fn, workers=WORKERS, max_workers=3)]) as p:
        for i, _ in enumerate(p):
            if i == 20:
                print("ready", flush=True)
    """
)


def _tagged(tag: str) -> list[int]:
    found = [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", tag]]
    return still_running(found)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workers=st.integers(1, 3), how=st.sampled_from(["cleared_env", "session"]))
def test_a_kill_of_the_whole_group_leaves_nothing_a_worker_started(workers, how):
    tag = f"{1000 + uuid.uuid4().int % 9000}.{os.getpid() % 1000}"
    script = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.replace("WORKERS", str(workers)), tag, how],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert script.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(_tagged(tag)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _tagged(tag), "no worker started its process"
        os.killpg(script.pid, signal.SIGKILL)
        script.wait(10)
        deadline = time.monotonic() + 5
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _tagged(tag), f"left after kill -9 of the group: {_tagged(tag)}"
    finally:
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
        try:
            os.killpg(script.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        script.wait(10)
