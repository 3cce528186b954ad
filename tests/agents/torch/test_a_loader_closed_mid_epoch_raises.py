"""An epoch of ``agents.torch.DataLoader`` cut short by ``close()`` from another thread raises
``PipelineStopped`` in the training loop, whether the loop was waiting for a batch or asks
for the next one after: it never ends as if the epoch were whole. Before, a loop that asked
after the close got a quiet end of the epoch; and with a ``timeout`` a loop waiting at the
close waited out the whole timeout and blamed it ("timed out")."""

import faulthandler
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from agents.pipeline import PipelineStopped
from agents.torch import DataLoader

CASE_BOUND_S = 40.0
CLOSE_BOUND_S = 10.0


class Slow(Dataset):
    """Item i: i, after ``delay_s``; 64 of them."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay_s)
        return i


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(
    num_workers=st.sampled_from([0, 2]),
    persistent=st.booleans(),
    timeout=st.sampled_from([0, 30]),
    taken_before=st.integers(0, 3),
    waiting=st.booleans(),  # at the close: waiting for a batch (slow dataset), or between
)
def test_a_close_from_another_thread_mid_epoch_raises_in_the_training_loop(
    num_workers, persistent, timeout, taken_before, waiting
):
    if persistent and num_workers == 0:
        persistent = False  # torch refuses persistent workers without workers
    loader = DataLoader(
        Slow(0.25 if waiting else 0.0),
        batch_size=4,
        num_workers=num_workers,
        persistent_workers=persistent,
        timeout=timeout,
    )
    faulthandler.dump_traceback_later(CASE_BOUND_S, exit=True, file=sys.stderr)
    try:
        epoch = iter(loader)
        for _ in range(taken_before):
            next(epoch)
        if waiting:
            closer = threading.Timer(0.3, loader.close)
            closer.start()
            began = time.monotonic()
            with pytest.raises(PipelineStopped, match="not loaded"):
                for _ in epoch:  # the epoch has 16 batches of 1 s each: the close comes first
                    pass
            assert time.monotonic() - began < CLOSE_BOUND_S
            closer.join(CLOSE_BOUND_S)
        else:
            loader.close()
            with pytest.raises(PipelineStopped, match="not loaded"):
                next(epoch)
        # The loader iterates again, a whole epoch.
        if not waiting:
            assert sum(len(b) for b in loader) == 64
    finally:
        loader.close()
        faulthandler.cancel_dump_traceback_later()
