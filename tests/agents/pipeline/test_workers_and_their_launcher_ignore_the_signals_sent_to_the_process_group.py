"""A pipeline's worker processes and their launcher ignore SIGINT, SIGTERM and SIGHUP (what a
terminal or ``kill -- -PGID`` sends the whole group): the pipeline's process stops them."""

from __future__ import annotations

import psutil

from agents.pipeline import Pipeline, Stage
from agents.pipeline.worker import GROUP_SIGNALS


def _ignored(pid: int) -> set[int]:
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def double(x):
    return 2 * x


def test_workers_and_their_launcher_ignore_the_group_signals():
    with Pipeline(range(10_000), [Stage("double", double, workers=2)], name="ignores") as p:
        next(iter(p))
        launcher = psutil.Process(p._zygote.pid)
        family = [launcher, *launcher.children()]
        assert len(family) >= 3  # the launcher and two workers
        for process in family:
            assert {int(s) for s in GROUP_SIGNALS} <= _ignored(process.pid), process
