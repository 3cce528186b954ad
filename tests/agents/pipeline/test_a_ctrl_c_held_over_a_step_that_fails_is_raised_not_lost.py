"""A Ctrl-C held over a step (``deferred()``: a pipeline's start or stop, an epoch's start or
end) that then fails is still raised, with the step's error as its context.

Before, the block's error went up alone and the Ctrl-C it held was dropped: a training loop
that catches that error (a DataLoader's timeout, a failed batch, as the loader hunter's
"sigint" loop does) went on as if no Ctrl-C had come. Generated: what the step raises, and
the handler in force (Python's own, or a script's that only takes note).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, PipelineStopped, StageFailed
from agents.pipeline.signals import deferred
from agents.torch import DataLoader

ERRORS = {
    "RuntimeError": lambda: RuntimeError("DataLoader timed out after 1.0 seconds"),
    "ValueError": lambda: ValueError("row 3 is bad"),
    "OSError": lambda: OSError("the worker launcher is gone"),
    "StageFailed": lambda: StageFailed("fetch", 0, "ValueError('row 3 is bad')", ""),
    "PipelineStopped": lambda: PipelineStopped("the pipeline was stopped"),
}


@settings(max_examples=10, deadline=None)
@given(error=st.sampled_from(sorted(ERRORS)), own_handler=st.booleans())
def test_a_ctrl_c_held_over_a_block_that_raises_is_acted_on(error, own_handler):
    noted = []
    handler = (lambda signum, frame: noted.append(signum)) if own_handler else None
    previous = signal.signal(signal.SIGINT, handler or signal.default_int_handler)
    try:
        with pytest.raises(BaseException) as raised:
            with deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.02)  # the handler runs here, and only notes it
                raise ERRORS[error]()
        if own_handler:
            # The script's handler ran once, and the step's own error goes on.
            assert noted == [signal.SIGINT]
            assert type(raised.value).__name__ == error
        else:
            assert raised.type is KeyboardInterrupt, f"the Ctrl-C was lost: {raised.value!r}"
            assert type(raised.value.__context__).__name__ == error
        assert signal.getsignal(signal.SIGINT) is (handler or signal.default_int_handler)
    finally:
        signal.signal(signal.SIGINT, previous)


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


def test_a_ctrl_c_during_an_epochs_start_that_fails_reaches_the_loop(monkeypatch):
    loader = DataLoader(Rows(), batch_size=2, num_workers=1)
    start = Pipeline.start

    def start_interrupted_then_failing(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.02)
        raise OSError("the worker launcher could not be forked")

    monkeypatch.setattr(Pipeline, "start", start_interrupted_then_failing)
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iter(loader))
    finally:
        monkeypatch.setattr(Pipeline, "start", start)
        loader.close()
    assert [b.tolist() for b in loader] == [[[0.0], [1.0]], [[2.0], [3.0]], [[4.0], [5.0]],
                                            [[6.0], [7.0]]]  # fmt: skip
    loader.close()
