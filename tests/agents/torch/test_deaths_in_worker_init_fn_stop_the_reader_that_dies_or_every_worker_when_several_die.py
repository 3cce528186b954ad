"""Deaths in ``worker_init_fn`` (``agents.torch.steps.InitWatch``) stop the reader that dies
after ``INIT_DEATHS_LIMIT`` deaths in a row of its own, whatever the other readers do; and every
worker once the deaths in a row of any workers come from that many readers (or from the other
workers). Generated sequences of deaths and returns from ``worker_init_fn``, against that rule.

One count for all had the live readers' returns set a dying reader's count back to 0 (CI's
hypothesis case: about 28 of reader 1's replacements died in a row), and stopped a live reader
that started after the dying one's two deaths; a count per reader alone let every reader of a
``worker_init_fn`` that kills them all die twice, a tick handed from one to the next until its
third death failed it in the runtime."""

from __future__ import annotations

import os

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.torch.steps import INIT_DEATHS_LIMIT, InitWatch


def _dies_in_init(watch: InitWatch, worker_id: int) -> None:
    """A worker process that marks itself in worker_init_fn and exits there, reaped."""
    pid = os.fork()
    if pid == 0:
        try:
            watch.entering(worker_id)
        finally:
            os._exit(3)
    os.waitpid(pid, 0)


@st.composite
def histories(draw) -> tuple[int, list[tuple[str, int]]]:
    readers = draw(st.integers(1, 4))
    events = st.tuples(st.sampled_from(["dies", "returns"]), st.integers(0, readers))
    return readers, draw(st.lists(events, max_size=7))


@settings(max_examples=30, deadline=None)
# A worker_init_fn that kills every reader: both stop after one death each.
@example(history=(2, [("dies", 0), ("dies", 1)]))
# CI's case: reader 1 dies twice with the live readers' returns between.
@example(history=(3, [("dies", 1), ("returns", 0), ("returns", 2), ("dies", 1)]))
@given(history=histories())
def test_a_reader_stops_after_its_own_deaths_in_a_row_or_everyone_after_several_readers(history):
    readers, events = history
    watch = InitWatch(readers)
    own = [0] * (readers + 1)  # deaths in a row per reader; the other workers' last
    row: set[int] = set()  # the readers (or the others, ``readers``) of the deaths in a row
    for what, worker in events:
        if what == "dies":
            _dies_in_init(watch, worker)
            watch.died(worker)  # its replacement starts: the death is found
            own[worker] += 1
            row.add(worker)
        else:
            watch.left(watch.entering(worker), worker)
            own[worker] = 0
            row.clear()
    for worker in range(readers + 1):
        stops = own[worker] >= INIT_DEATHS_LIMIT or len(row) >= INIT_DEATHS_LIMIT
        assert (watch.died(worker) >= INIT_DEATHS_LIMIT) == stops, (worker, own, row, events)
        if stops:
            assert "exited unexpectedly in its worker_init_fn" in str(watch.error(worker))


def test_a_live_readers_return_never_resets_the_dying_readers_deaths():
    """CI's case: reader 1 dies, readers 0 and 2 come out of worker_init_fn, reader 1's
    replacement dies: it stops there, and the live readers run on."""
    watch = InitWatch(3)
    _dies_in_init(watch, 1)
    assert watch.died(1) == 1
    for live in (0, 2):
        watch.left(watch.entering(live), live)
    _dies_in_init(watch, 1)
    assert watch.died(1) == INIT_DEATHS_LIMIT
    assert watch.died(0) < INIT_DEATHS_LIMIT and watch.died(2) < INIT_DEATHS_LIMIT
    assert "reader 1 of the IterableDataset" in str(watch.error(1))
