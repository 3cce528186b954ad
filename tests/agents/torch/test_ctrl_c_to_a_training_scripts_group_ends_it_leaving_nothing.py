"""Ctrl-C (SIGINT) or SIGTERM to the process group of a training script that reads through
``agents.torch.DataLoader`` ends it promptly, and leaves no worker process and no shared-memory
file behind: its workers ignore the group's signal, and the loop's interrupted iterator, held
weakly by the loader, stops them as it is dropped."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agents.pipeline.shm import SHM_DIR

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
# Measured at load average 8 to 10 on 2 cores: SIGINT 0.8 to 2.9 s (the loader's part, the
# Ctrl-C caught and the workers stopped, about 0.2 s; the rest is the interpreter's teardown of
# torch), SIGTERM 0.02 to 0.14 s. Before the pipelines were stopped at exit (atexit, while
# their threads still run): SIGINT 4.5 to 5.1 s at the same load. A hang would be far past.
EXIT_BOUND_S = 5.0


@pytest.mark.parametrize(
    ("signum", "persistent"),
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, True)],
    ids=["SIGINT-per-epoch", "SIGINT-persistent", "SIGTERM-persistent"],
)
def test_a_training_script_ends_within_a_bound_leaving_no_worker_and_no_shared_memory(
    signum, persistent
):
    script = subprocess.Popen(
        [sys.executable, str(HERE / "training_script.py"), "2", "1" if persistent else "0"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        lines = []
        while "training" not in lines:
            line = script.stdout.readline()  # the script prints a line every epoch
            assert line, script.stderr.read()
            lines.append(line.strip())
        family = psutil.Process(script.pid).children(recursive=True)
        assert family, "the loader started no worker process"
        began = time.monotonic()
        os.killpg(script.pid, signum)
        script.wait(timeout=10)
        took = time.monotonic() - began
        print(f"training script exit after {signal.Signals(signum).name}: {took:.3f} s")
        lines += script.stdout.read().split("\n")
        prefixes = [line.split()[1] for line in lines if line.startswith("prefix ")]
        deadline = time.monotonic() + 3
        while any(p.is_running() and p.status() != "zombie" for p in family):
            assert time.monotonic() < deadline, "the loader's workers outlived the script"
            time.sleep(0.05)

        def left() -> list[str]:
            return [f for prefix in prefixes for f in glob.glob(f"{SHM_DIR}/{prefix}-*")]

        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert prefixes and not left()
        assert took < EXIT_BOUND_S
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(timeout=10)
        script.stdout.close()
        script.stderr.close()
