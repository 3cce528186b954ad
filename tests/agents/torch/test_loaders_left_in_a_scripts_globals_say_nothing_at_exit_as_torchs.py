"""Loaders a training script leaves in its globals are collected at the interpreter's
teardown, after the modules imported later than ``__main__`` (ours among them) have had their
globals cleared: they end as torch's do there, printing nothing.

Before: a library's loader subclass with a ``__del__`` of its own (mosaicml-streaming's
``StreamingDataLoader``) printed "Exception ignored in ... AttributeError: 'NoneType' object
has no attribute '__del__'" at the end of every such script under intune-run: the ``__del__``
that also runs ours looked ``DataLoader`` up in a module already cleared (seen once in a clean
run of tests/agents/torch, then made to happen every time by a loader in ``__main__``'s
globals, which are cleared last).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    if os.environ.get("PATCH") == "1":
        from agents.torch import auto
        auto.patch()
    from torch.utils.data import DataLoader, TensorDataset

    class Closing(DataLoader):
        # a library's clean-up that never calls super().__del__()
        def __del__(self):
            pass

    workers = int(sys.argv[1])
    persistent = workers > 0 and sys.argv[2] == "1"
    dataset = TensorDataset(torch.arange(24.0))
    closing = Closing(dataset, batch_size=4, num_workers=workers, persistent_workers=persistent)
    plain = DataLoader(dataset, batch_size=4, num_workers=workers, persistent_workers=persistent)
    print(sum(len(b[0]) for b in closing), sum(len(b[0]) for b in plain))
    left = iter(plain)  # an epoch left mid-way, in the globals too
    first = next(left)
    print(first[0].tolist())
    """
)


def _run(tmp_path: Path, patch: bool, workers: int, persistent: bool) -> tuple[str, str]:
    script = tmp_path / "globals.py"
    script.write_text(SCRIPT)
    env = os.environ | {"PATCH": "1" if patch else "0", "PYTHONPATH": str(ROOT)}
    for name in ("INTUNE_URL", "INTUNE_HOST_ID", "INTUNE_AGENT_TOKEN"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script), str(workers), "1" if persistent else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, done.stderr


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, True)])
def test_loaders_left_in_the_globals_end_printing_nothing_as_torchs(tmp_path, workers, persistent):
    torchs_out, torchs_err = _run(tmp_path, False, workers, persistent)
    ours_out, ours_err = _run(tmp_path, True, workers, persistent)
    assert ours_out == torchs_out
    assert "Exception ignored" not in torchs_err and "Traceback" not in torchs_err  # the baseline
    assert "Exception ignored" not in ours_err, ours_err
    assert "Traceback" not in ours_err, ours_err
