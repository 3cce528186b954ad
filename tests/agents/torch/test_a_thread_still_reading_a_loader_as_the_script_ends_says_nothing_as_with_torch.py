"""A daemon thread still reading a loader when the training script ends is ended with the
interpreter, silently, as one reading torch's loader is. Before, the exit's stop of the
loader's pipeline raised ``PipelineStopped`` into that thread, and the script printed its
traceback (twice: the error and its cause) as it exited (the exit hunter, seed 2002)."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROMPT_S = 5.0  # from the script's end to its exit, on a loaded machine (the wait is 10 s)

SCRIPT = textwrap.dedent(
    """
    import threading, time
    import torch
    from agents.torch import DataLoader

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            return torch.tensor([float(i)])

    loader = DataLoader(Rows(), batch_size=4, num_workers=1)
    reading = threading.Event()

    def read():
        for _ in loader:
            reading.set()
            time.sleep(0.01)

    threading.Thread(target=read, daemon=True).start()
    reading.wait(60)
    print(time.time(), flush=True)
    """
)


def test_a_daemon_thread_reading_a_loader_at_exit_prints_nothing():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    exited = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == "", done.stderr[-2000:]
    assert exited - float(done.stdout) < PROMPT_S
