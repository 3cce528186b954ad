"""A running pipeline iterated in a child forked from its process raises at once, naming the
process that runs it, and a child leaving a ``with pipeline:`` block stops nothing; the
parent's iteration is untouched. Before: the child's copy has none of the threads that fill
it, and its loop waited for ever; its stop killed the parent's workers."""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pytest

from agents.pipeline import Pipeline, Stage
from tests.support.processes import exit_code_within


def slow_square(i: int) -> int:
    time.sleep(0.002)
    return i * i


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_a_running_pipeline_iterated_in_a_forked_child_raises_and_the_parent_goes_on(kind):
    pipeline = Pipeline(range(200), [Stage("square", slow_square, workers=2, kind=kind)])
    with pipeline:
        taken = iter(pipeline)
        first = next(taken)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                next(iter(pipeline))
            except RuntimeError as exc:
                code = 0 if f"process {os.getppid()}" in str(exc) else 2
            finally:
                os._exit(code)
        code = exit_code_within(pid, 20)
        if code is None:
            pytest.fail("the child's loop over its parent's pipeline did not end within 20 s")
        assert code == 0
        assert [first, *taken] == [i * i for i in range(200)]


def slow_batch(i: int) -> np.ndarray:
    time.sleep(0.002)
    return np.full(100_000, i)  # 800 kB: through shared memory


def test_a_forked_child_leaving_the_pipelines_with_block_leaves_the_parents_items_whole(caplog):
    caplog.set_level(logging.WARNING)
    received = []
    with Pipeline(range(200), [Stage("batch", slow_batch, workers=2)]) as pipeline:
        for i, item in enumerate(pipeline):
            received.append(int(item[0]))
            if i == 10:
                pid = os.fork()
                if pid == 0:
                    try:
                        pipeline.__exit__(None, None, None)  # what sys.exit() in the block runs
                    finally:
                        os._exit(0)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
    assert received == list(range(200))
    killed = [r.getMessage() for r in caplog.records if "was killed" in r.getMessage()]
    assert killed == [], "the child killed the parent's workers"
