"""Workers killed from outside while in a slow ``worker_init_fn`` (their launcher SIGKILLed,
or one worker SIGKILLed now and then, as the OOM killer does) do not turn the loader into one
that fails every batch: only deaths in a row that say something of ``worker_init_fn`` count
(``agents.torch.steps.InitWatch``). Found by the loader hunter (seed 779 of
``tests/agents/torch/hunt.py``): a persistent loader failed every batch of its later epochs.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch

from agents.torch import DataLoader


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def slow_init(worker_id: int) -> None:
    mark = os.path.join(os.environ["INIT_MARKS"], str(os.getpid()))
    with open(mark, "w"):
        pass
    time.sleep(0.6)
    os.rename(mark, mark + ".done")


def _in_init(marks, launcher: int | None = None, timeout: float = 20.0) -> list[int]:
    """The pids of the workers inside worker_init_fn (children of ``launcher`` if given),
    once there is one (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inside = [int(p.name) for p in marks.iterdir() if p.suffix != ".done"]
        inside = [pid for pid in inside if _running(pid) and _child(pid, launcher)]
        if inside:
            return inside
        time.sleep(0.01)
    raise AssertionError(f"no worker entered worker_init_fn in {timeout} s")


def _out_of_init(marks, count: int, timeout: float = 20.0) -> None:
    """Wait (bounded) until ``count`` workers have come out of worker_init_fn."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(marks.glob("*.done"))) >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} workers not out of worker_init_fn after {timeout} s")


def _child(pid: int, launcher: int | None) -> bool:
    try:
        return launcher is None or psutil.Process(pid).ppid() == launcher
    except psutil.Error:
        return False


def _launcher(loader: DataLoader, other_than: int, timeout: float = 20.0) -> int:
    """The pid of the loader's launcher once it is not ``other_than`` (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        zygote = loader.pipeline._zygote
        if zygote is not None and zygote.pid != other_than:
            return zygote.pid
        time.sleep(0.01)
    raise AssertionError(f"no new launcher after {timeout} s")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _epoch(loader: DataLoader) -> list[int]:
    return [int(v) for batch in loader for v in batch[:, 0].tolist()]


@pytest.fixture
def loader(tmp_path, monkeypatch):
    """A persistent loader of 2 workers whose slow worker_init_fn marks itself in tmp_path."""
    monkeypatch.setenv("INIT_MARKS", str(tmp_path))
    made = DataLoader(
        Rows(), batch_size=4, num_workers=2, persistent_workers=True,
        worker_init_fn=slow_init, timeout=60,
    )  # fmt: skip
    try:
        yield made
    finally:
        made.close()


def test_a_launcher_killed_while_its_workers_are_in_init_three_times_leaves_whole_epochs(
    tmp_path, loader
):
    assert _epoch(loader) == list(range(24))
    iterator = iter(loader)
    launcher = loader.pipeline._zygote.pid
    os.kill(launcher, signal.SIGKILL)
    for _ in range(3):
        launcher = _launcher(loader, other_than=launcher)
        _in_init(tmp_path, launcher)  # the new launcher's workers, in init
        os.kill(launcher, signal.SIGKILL)  # they die with it, in init
    rows = [int(v) for batch in iterator for v in batch[:, 0].tolist()]
    assert rows == list(range(24))
    assert _epoch(loader) == list(range(24))


def test_workers_killed_in_init_one_at_a_time_leave_whole_epochs(tmp_path, loader):
    assert _epoch(loader) == list(range(24))
    for size in (3, 4, 5):
        loader.apply({name: size for name in loader.stage_names})  # new workers start
        done = len(list(tmp_path.glob("*.done")))
        os.kill(_in_init(tmp_path)[0], signal.SIGKILL)
        # One death at a time: a worker started since has come out of its init (two
        # deaths in a row, with none out in between, do count, as torch's one does).
        _out_of_init(tmp_path, done + 1)
        assert _epoch(loader) == list(range(24))
