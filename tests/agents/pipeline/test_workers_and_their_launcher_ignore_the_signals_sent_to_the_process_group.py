"""A pipeline's worker processes and their launcher ignore SIGINT, SIGTERM and SIGHUP (what a
terminal or ``kill -- -PGID`` sends the whole group): the pipeline's process stops them.

They ignore them with a handler that does nothing, not ``SIG_IGN``: what a worker's user
code starts (a ``multiprocessing.Pool``, a ``subprocess``) must get them as anywhere else
(tests/agents/torch/test_user_code_that_starts_processes_in_a_worker_can_stop_them.py)."""

from __future__ import annotations

import time

import psutil

from agents.pipeline import Pipeline, Stage
from agents.pipeline.worker import GROUP_SIGNALS


def _ignored(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def double(x):
    return 2 * x


def test_workers_and_their_launcher_live_through_the_group_signals_and_go_on():
    with Pipeline(range(300), [Stage("double", double, workers=2)], name="ignores") as p:
        items = iter(p)
        first = next(items)
        launcher = psutil.Process(p._zygote.pid)
        family = [launcher, *launcher.children()]
        assert len(family) >= 3  # the launcher and two workers
        for process in family:
            for signum in GROUP_SIGNALS:
                process.send_signal(signum)
        time.sleep(0.5)
        for process in family:
            assert process.is_running() and process.status() != psutil.STATUS_ZOMBIE, process
            # Not by SIG_IGN, which the processes they start would inherit.
            assert not {int(s) for s in GROUP_SIGNALS} & _ignored(process.pid), process
        assert sorted([first, *items]) == [2 * x for x in range(300)]
