"""A training script that leaves an epoch (``break``) and ends there exits with its own
status, as with torch's loader. Before, it was aborted at the interpreter's exit
("terminate called without an active exception", exit status 134) in 8 runs of 8 with
batches of many tensors, and in about 1 run in 8 of a plain shuffled loop: the epoch's
pipeline was being stopped in a thread of its own, so the ``atexit`` stop passed it by, and
its collector, rebuilding the next batch's tensors, came back from torch's C++ code after the
interpreter's teardown had begun, where ``pthread_exit`` ends a daemon thread by unwinding
through C++ frames that may not be unwound."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.utils.data as tud
    from agents.torch import DataLoader

    class ManyTensors(tud.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return [torch.full((2,), float(i)) for _ in range(400)]

    loader = DataLoader(ManyTensors(), batch_size=16, num_workers=2, collate_fn=lambda b: b)
    for batch in loader:
        break
    print("left the epoch", flush=True)
    """
)


def test_a_script_that_breaks_out_of_an_epoch_and_ends_exits_with_status_0():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert "left the epoch" in done.stdout, done.stderr
        assert "terminate called" not in done.stderr
        assert done.returncode == 0, done.stderr[-2000:]


# A script that returns from its loop mid-epoch: its loader's last reference is the thread
# that stops the epoch (``_stop_soon``), which drops it as it ends. That thread ended after
# the interpreter's teardown had begun, and freeing the loader's tensors there (its
# ``_Place``'s generator states: a core dump showed ``THPVariable_clear`` taking the GIL back
# in ``pthread_exit``) aborted the script in 2 runs of 99 (``python -m
# tests.agents.torch.exit_hunt --runs``). Here the dataset, freed with the loader, takes
# 0.3 s to go (its ``__del__``), so that thread is sure to outlast the exit unless the exit
# waits for it: it did not, and the dataset never finished going (5 runs of 5).
RETURNS = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from agents.torch import DataLoader

    MAIN = os.getpid()

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.tensor([float(i)])

        def __del__(self):
            if os.getpid() == MAIN:
                time.sleep(0.3)
                torch.ones(8).sum()
                with open(sys.argv[1], "w") as f:
                    f.write("freed")

    def main():
        loader = DataLoader(Rows(), batch_size=4, shuffle=True, num_workers=2)
        for b, batch in enumerate(loader):
            if b == 2:
                return 0

    sys.exit(main())
    """
)


def test_a_script_that_returns_mid_epoch_has_its_loader_freed_before_the_teardown(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    freed = tmp_path / "freed"
    done = subprocess.run(
        [sys.executable, "-c", RETURNS, str(freed)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert "terminate called" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert freed.exists(), "the loader was still being freed when the interpreter's teardown began"
