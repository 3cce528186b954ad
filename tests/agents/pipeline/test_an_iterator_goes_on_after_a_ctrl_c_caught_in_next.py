"""A training loop that catches a Ctrl-C in ``next(it)`` and goes on gets every item from
that same iterator, once, in order: of a ``Pipeline`` and of ``agents.torch.DataLoader``.

``Pipeline.__iter__`` was a generator, which ends at the first exception out of it: the
next ``next(it)`` raised ``StopIteration``, an epoch ended early without a word, and
``agents.torch.DataLoader``'s iterator raised ``PipelineStopped`` ("the loader's pipeline was
stopped") for a pipeline still running: the epoch was lost (probe: 6 rows of 40, then
``PipelineStopped``). torch's iterator goes on. Found by the hang hunter
(``tests/agents/pipeline/hunt.py``: "65 item(s) lost: got 0 of 65" after a Ctrl-C in the
consumer's first take). Now the iterator is an object whose ``next()`` survives what it raises.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, Stage, StageFailed
from agents.torch import DataLoader


def _slow(x: int) -> int:
    time.sleep(0.01)
    return x


def _fails_at_7(x: int) -> int:
    if x == 7:
        raise ValueError("item 7")
    return x


def _take_with_ctrl_c(it, count: int, at: set[int], delay_s: float) -> tuple[list, int]:
    """``count`` calls of ``next(it)``, a SIGINT sent ``delay_s`` into those numbered ``at``;
    the interrupted ones are caught and the loop goes on. Returns what came, and how many
    Ctrl-Cs were caught."""
    got, caught = [], 0
    for k in range(count):
        timer = None
        if k in at:
            timer = threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGINT))
        try:
            try:
                if timer is not None:
                    timer.start()
                got.append(next(it))  # no Python call between: a Ctrl-C cannot land there
            finally:
                if timer is not None:
                    timer.join(5)
                    time.sleep(0.05)  # the Ctrl-C lands by now, if not in next()
        except KeyboardInterrupt:
            caught += 1
        except StopIteration:
            break
    return got, caught


@settings(max_examples=6, deadline=None)
@given(
    kind=st.sampled_from(["process", "thread"]),
    at=st.sets(st.integers(0, 15), min_size=1, max_size=3),
    delay_s=st.sampled_from([0.0, 0.003, 0.02]),
)
def test_a_pipelines_iterator_goes_on_after_a_caught_ctrl_c(kind, at, delay_s):
    with Pipeline(range(30), [Stage("slow", _slow, kind=kind, workers=2)], name="c") as p:
        it = iter(p)
        got, _ = _take_with_ctrl_c(it, 60, at, delay_s)
        assert got == list(range(30))
        assert list(it) == []  # then it ends, as at the source's end


def test_a_pipelines_iterator_goes_on_after_a_stage_failed():
    with Pipeline(range(12), [Stage("f", _fails_at_7)], name="f") as p:
        it = iter(p)
        got = [next(it) for _ in range(7)]
        try:
            next(it)
            raise AssertionError("item 7 did not fail")
        except StageFailed:
            pass
        got += list(it)
    assert got == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11]


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        time.sleep(0.005)
        return i


@settings(max_examples=4, deadline=None)
@given(
    persistent=st.booleans(),
    at=st.sets(st.integers(0, 8), min_size=1, max_size=2),
    delay_s=st.sampled_from([0.0, 0.005, 0.02]),
)
def test_a_loaders_iterator_goes_on_after_a_caught_ctrl_c(persistent, at, delay_s):
    loader = DataLoader(_Rows(), batch_size=2, num_workers=2, persistent_workers=persistent)
    try:
        for _ in range(2):  # two epochs: a persistent loader's second too
            got, _ = _take_with_ctrl_c(iter(loader), 40, at, delay_s)
            assert [int(v) for batch in got for v in batch] == list(range(40))
    finally:
        loader.close()
