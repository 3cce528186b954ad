"""A dataset whose ``__getitem__`` starts processes of its own (a ``multiprocessing.Pool`` to
decode in parallel, a ``subprocess`` it stops with ``terminate()``) gives its batches, as
torch's does in one process, and leaves no process behind.

Before, a worker ignored SIGTERM, SIGINT and SIGHUP with ``SIG_IGN``, which its children
inherit (through ``fork`` and ``exec``): ``Pool.__exit__`` SIGTERMs its processes and joins
them, and waited for ever (the epoch hung; with ``timeout=`` it timed out), and the pool's
processes, deaf to SIGTERM, outlived the training script.

Then, with a handler in the worker that the fork hook put back to the default in its children,
the pool case still hung now and then (1 run of 5 in a loop, 1 of 8 beside two busy loops): a
pool process SIGTERMed before it had first run lost the signal (agents/pipeline/worker.py,
``_block_group_signals``). Busy loops make it likely: tests/agents/torch/
test_generated_pools_in_getitem_never_hang.py runs pools beside one."""

import multiprocessing
import signal
import subprocess
import sys
import threading

import pytest
import torch
import torch.utils.data as tud

from agents.torch import DataLoader
from tests.agents.pipeline import stress
from tests.agents.torch.conftest import assert_same_epoch
from tests.agents.torch.loader_cases import CALL_BOUND_S, assert_nothing_left, children


class PooledDecode(tud.Dataset):
    """Each item decoded by a pool of 2 processes (forked from the worker), or by a helper
    process that it stops with SIGTERM."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        if self.how == "pool":
            with multiprocessing.get_context("fork").Pool(2) as pool:
                return torch.tensor(pool.map(abs, [-i, i, -2 * i]))
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        helper.terminate()
        code = helper.wait(timeout=10)  # raises TimeoutExpired if SIGTERM was ignored
        return torch.tensor([i, code])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["pool", "subprocess"])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_dataset_that_starts_and_stops_processes_gives_its_batches(how, num_workers):
    theirs = list(tud.DataLoader(PooledDecode(how), batch_size=2))
    assert theirs[0][0].tolist() == ([0, 0, 0] if how == "pool" else [0, -signal.SIGTERM])
    before, threads = children(), set(threading.enumerate())
    loader = DataLoader(PooledDecode(how), batch_size=2, num_workers=num_workers, timeout=20)
    try:
        for _ in range(2):
            ours, _ = stress.bounded("an epoch", CALL_BOUND_S, lambda: list(loader))
            assert_same_epoch(ours, theirs)
    finally:
        loader.close()
    assert_nothing_left(f"{how}, {num_workers} workers", "after close()", threads, before)
