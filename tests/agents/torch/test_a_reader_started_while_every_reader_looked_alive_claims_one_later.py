"""A reader process that starts while every reader number is held by a live process takes one
once it is freed, instead of failing every tick for good.

The pipeline gives up a worker's start when its launcher is stopped past the request's
timeout (10 s), and starts another; the launcher, running again, still forks the given-up one,
which claims the dead reader's number at its start and lives until the pipeline closes its
pipes. The replacement started in that window found no reader free, kept that, raised on every
tick ("a bug of agents.torch"), the dead reader's share never ended, and the epoch waited for
ever: ``python -m tests.agents.torch.hunt --replay 90028`` (2 hangs in 2 runs before).
Here the two reader numbers are held by two live processes, one of which leaves.
"""

import subprocess
import sys
import threading
import time

from torch.utils.data import IterableDataset

from agents.torch import steps


class Rows(IterableDataset):
    def __iter__(self):
        return iter(range(6))


def _holder() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_reader_that_found_no_number_free_claims_the_one_freed_later():
    setup = steps.WorkerSetup(Rows(), base_seed=1, num_workers=2)
    read = steps.Read(Rows(), batch_size=2, drop_last=False, setup=setup, readers=2)
    holders = [_holder(), _holder()]
    try:
        read.owners[0], read.owners[1] = holders[0].pid, holders[1].pid
        steps.set_reader_slot(0)
        # At its start (StartWorker): every number is held by a live process.
        assert read.claim() == -1
        # The given-up worker leaves a little later (its pipes closed).
        leave = threading.Timer(0.3, holders[0].kill)
        leave.start()
        began = time.monotonic()
        epoch, samples, batch, _ = read((1, 0, 0, 7))
        took = time.monotonic() - began
        leave.join(5)
        assert (epoch, samples, batch) == (1, 2, [0, 1]), batch
        assert read.owners[0] > 0 and read.owners[0] not in (holders[0].pid, holders[1].pid)
        assert took < steps.CLAIM_WAIT_S, took
        # And it stays that reader.
        assert read((1, 0, 1, 7))[1:3] == (2, [2, 3])
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(10)


def test_a_reader_that_finds_none_freed_fails_its_tick_within_the_bound_and_claims_later():
    setup = steps.WorkerSetup(Rows(), base_seed=1, num_workers=2)
    read = steps.Read(Rows(), batch_size=2, drop_last=False, setup=setup, readers=2)
    holders = [_holder(), _holder()]
    try:
        read.owners[0], read.owners[1] = holders[0].pid, holders[1].pid
        steps.set_reader_slot(1)
        began = time.monotonic()
        try:
            read((1, 0, 0, 7))
            raise AssertionError("a reader with no number read a tick")
        except RuntimeError as exc:
            assert "while all 2 readers were alive" in str(exc)
        assert time.monotonic() - began < steps.CLAIM_WAIT_S + 2
        holders[1].kill()
        holders[1].wait(10)
        epoch, samples, batch, _ = read((1, 0, 1, 7))
        assert (epoch, samples, batch) == (1, 2, [0, 1]), batch  # Rows does not shard
        assert read.owners[1] not in (0, holders[1].pid)
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(10)
