"""A ``__getitem__`` that never returns is named by the loader's timeout: torch's words
("DataLoader timed out after T seconds"), then the stage, the worker's pid and the dataset
indices of the oldest batch in flight, where torch names none of them and leaves the user to
guess which item hangs. (The parity hunter's "never" items: ours said what torch says.)
"""

from __future__ import annotations

import time

import psutil
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.torch import DataLoader


class HangsAt(tud.Dataset):
    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            time.sleep(600)
        return i


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    at=st.integers(0, 7),
    batch_size=st.integers(1, 3),
    num_workers=st.integers(1, 2),
    fuse=st.sampled_from(["auto", None]),
)
def test_a_getitem_that_never_returns_is_named_by_the_timeout(at, batch_size, num_workers, fuse):
    loader = DataLoader(
        HangsAt(8, at), batch_size=batch_size, num_workers=num_workers, timeout=1.0, fuse=fuse
    )
    stuck = [i for i in range(at - at % batch_size, min(8, at - at % batch_size + batch_size))]
    try:
        iterator = iter(loader)
        for _ in range(at // batch_size):
            next(iterator)
        try:
            next(iterator)
        except RuntimeError as exc:
            message = str(exc)
        else:
            raise AssertionError("the batch of the item that never returns came")
        assert message.startswith("DataLoader timed out after 1.0 seconds"), message
        assert f"dataset indices {stuck}" in message, message
        pid = int(message.split("worker pid ")[1].split(",")[0])
        assert psutil.Process(pid).is_running(), message
        assert "'fetch" in message, message
    finally:
        loader.close()
