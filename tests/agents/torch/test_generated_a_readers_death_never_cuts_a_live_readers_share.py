"""Generated IterableDataset loaders of which one reader's worker_init_fn kills its process,
with the dead reader's ticks handed on late and its replacement slow to start (forced delays,
as a loaded host gives them): the epoch raises once, naming that reader, and every live
reader's share comes whole, each in its reader's order.

A reader answers a tick with its next batch or its end, whatever the tick, and the consumer
gets the answers in tick order. The ticks a dead reader held went back to the head of the
inbox; a live reader that had read its share answered one with its end, ahead of its last
batches, and the epoch ended without them: row 38 (reader 2's last batch) was missing in a
clean-clone CI run at load 15; with the forced delays of ``HANDED_ON_LATE`` below, rows 9 to
39 of reader 1's share, 4 runs in 4.

No more than ``INIT_DEATHS_LIMIT`` processes die in worker_init_fn per epoch (torch raises at
the first). CI's hypothesis case of 3 readers, reader 1's worker_init_fn exiting, saw about
28 of reader 1's replacements die in a row: one count of deaths for every worker, which the
live readers set back to 0 as they came out of worker_init_fn after reader 1's first death,
and which a live reader slow to start found at the limit (it refused its own share).

The short form runs in ``make test``; ``INTUNE_READER_DEATH_CASES=N`` runs N cases.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info

from agents.pipeline.pool import StagePool
from agents.torch import DataLoader
from agents.torch.steps import INIT_DEATHS_LIMIT, Read
from tests.agents.pipeline.stress import Burner
from tests.agents.torch.conftest import skip_errors_epoch

SHORT = int(os.environ.get("INTUNE_READER_DEATH_CASES", "3"))
EPOCH_BOUND_S = 60.0  # each next() is bounded by the loader's timeout (20 s) too


@dataclass(frozen=True)
class Case:
    """A loader of ``rows`` rows read by ``readers`` readers, of which reader ``dies`` exits
    in worker_init_fn; the forced delays in seconds, and whether a CPU burner runs."""

    readers: int
    rows: int
    batch_size: int
    dies: int
    persistent: bool
    row_s: float = 0.0  # each row's read
    handed_on_s: float = 0.0  # before the dead reader's ticks go back to the inbox
    replacement_s: float = 0.0  # before its replacement reads its first tick
    burn: bool = False
    live_start_s: float = 0.0  # before a live reader's worker_init_fn, as it first starts


class Shards(IterableDataset):
    """Rows 0 .. rows-1, reader i reading rows r with r % readers == i, ``row_s`` each."""

    def __init__(self, rows: int, row_s: float) -> None:
        self.rows, self.row_s = rows, row_s

    def __iter__(self):
        info = get_worker_info()
        for row in range(info.id, self.rows, info.num_workers):
            time.sleep(self.row_s)
            yield torch.tensor([row])


class ExitIn:
    """A worker_init_fn that kills the process of reader ``reader``, counting the deaths in
    ``deaths`` (a shared counter the workers inherit by fork)."""

    def __init__(self, reader: int, deaths: Any = None) -> None:
        self.reader = reader
        self.deaths = deaths

    def __call__(self, worker_id: int) -> None:
        if worker_id == self.reader:
            if self.deaths is not None:
                with self.deaths.get_lock():
                    self.deaths.value += 1
            os._exit(3)


@st.composite
def cases(draw) -> Case:
    readers = draw(st.integers(1, 4))
    return Case(
        readers=readers,
        rows=draw(st.integers(0, 40)),
        batch_size=draw(st.integers(1, 4)),
        dies=draw(st.integers(0, readers - 1)),
        persistent=draw(st.booleans()),
        row_s=draw(st.sampled_from([0.0, 0.01, 0.03])),
        handed_on_s=draw(st.sampled_from([0.0, 0.3, 1.0])),
        replacement_s=draw(st.sampled_from([0.0, 0.5, 2.0])),
        burn=draw(st.booleans()),
        live_start_s=draw(st.sampled_from([0.0, 1.0])),
    )


# The dead reader's ticks go back after the live reader has read its share; the replacement
# holds two fresh ticks, early in the epoch, unanswered until after that: the live reader took
# the dead one's ticks and answered them with its end (failed 4 runs in 4 before the fix).
HANDED_ON_LATE = Case(2, 40, 2, 0, False, row_s=0.05, handed_on_s=1.0, replacement_s=2.0)
# CI's case (3 readers, reader 0's worker_init_fn exits) with those delays: failed 1 run in 4.
CI_CASE_FORCED = Case(3, 40, 2, 0, False, row_s=0.05, handed_on_s=1.0, replacement_s=2.0)
PERSISTENT_LAST_READER = Case(4, 37, 3, 3, True, row_s=0.03, handed_on_s=1.0, replacement_s=2.0)
# CI's hypothesis case (blob AEEDQSdBBEEBAEECQQBBAAA=: 3 readers, reader 1's worker_init_fn
# exits) failed 4 epochs of 16 under two busy CPUs, with two errors or reader 2's share lost;
# the live readers 1 s late into worker_init_fn, after reader 1 died twice, fail every run.
CI_INIT_DEATHS = Case(3, 39, 4, 1, False, row_s=0.03, live_start_s=1.0)


@pytest.mark.timeout(max(240, 60 * SHORT))
@settings(
    max_examples=SHORT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@example(case=HANDED_ON_LATE)
@example(case=CI_CASE_FORCED)
@example(case=PERSISTENT_LAST_READER)
@example(case=CI_INIT_DEATHS)
@given(case=cases())
def test_a_live_readers_share_comes_whole_whatever_becomes_of_a_dead_readers_ticks(case):
    real_recover, real_claim = StagePool._recover, Read._claim

    def late_recover(self, worker, lost):
        time.sleep(case.handed_on_s)  # a relay thread of this process, as a loaded host's
        return real_recover(self, worker, lost)

    def slow_claim(self, slot):
        before = list(self.owners)
        reader = real_claim(self, slot)
        if reader >= 0 and before[reader] != 0:  # it takes over a dead reader's share
            time.sleep(case.replacement_s)
        elif reader >= 0 and reader != case.dies:  # a live reader's start, before its init
            time.sleep(case.live_start_s)
        return reader

    deaths = multiprocessing.get_context("fork").Value("i", 0)
    burner = Burner()
    burner.set(case.burn)
    # Patched before the loader starts: its workers fork from this process and keep them.
    with (
        mock.patch.object(StagePool, "_recover", late_recover),
        mock.patch.object(Read, "_claim", slow_claim),
    ):
        loader = DataLoader(
            Shards(case.rows, case.row_s),
            batch_size=case.batch_size,
            num_workers=case.readers,
            timeout=20,
            worker_init_fn=ExitIn(case.dies, deaths),
            persistent_workers=case.persistent,
        )
        try:
            for epoch in range(2):
                rows, errors = _epoch(loader, epoch)
                # A persistent loader's count goes on: its refusing replacement lives on.
                assert deaths.value <= INIT_DEATHS_LIMIT, f"epoch {epoch}: {deaths.value} died"
                if not case.persistent:
                    deaths.value = 0
                assert len(errors) == 1, (epoch, errors)
                assert f"reader {case.dies}" in str(errors[0]), (epoch, errors[0])
                assert len(rows) == len(set(rows)), f"epoch {epoch}: a row came twice: {rows}"
                live = {r for r in range(case.rows) if r % case.readers != case.dies}
                assert set(rows) == live, f"epoch {epoch}: missing {sorted(live - set(rows))}"
                for reader in range(case.readers):
                    share = [r for r in rows if r % case.readers == reader]
                    assert share == sorted(share), f"epoch {epoch}: reader {reader}: {share}"
        finally:
            loader.close()
            burner.set(False)


def _epoch(loader: DataLoader, epoch: int) -> tuple[list[int], list[RuntimeError]]:
    """One epoch through a loop that skips failed batches: its rows and its errors."""
    return skip_errors_epoch(loader, EPOCH_BOUND_S, f"epoch {epoch}", max_errors=5)
