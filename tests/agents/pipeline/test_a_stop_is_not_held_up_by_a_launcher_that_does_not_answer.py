"""``stop()`` keeps its bound while an ``apply()`` in another thread waits for the launcher
to fork workers and the launcher does not answer (stopped here; swapped out under memory
pressure on a real host). Before, the stop waited for the pipeline's lock behind every
worker's 10 s request: 62 s for 3 workers."""

import os
import signal
import threading
import time

import psutil
import pytest

from agents.pipeline import Pipeline, Stage


def slow(x: int) -> int:
    time.sleep(0.01)
    return x


@pytest.mark.timeout(60)
def test_a_stop_returns_in_its_bound_while_a_resize_waits_for_a_stopped_launcher():
    # Processes the session had before the test (a session fixture's server, say) are not its.
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    pipeline = Pipeline(
        range(10**6), [Stage("a", slow, workers=1, max_workers=8)], stop_timeout_s=1.0
    )
    pipeline.start()
    items = iter(pipeline)
    next(items)
    launcher = pipeline._zygote.pid
    os.kill(launcher, signal.SIGSTOP)
    resize = threading.Thread(target=pipeline.apply, args=({"a": 4},), daemon=True)
    resize.start()
    time.sleep(0.5)  # the resize is waiting for the launcher's first answer
    began = time.monotonic()
    pipeline.stop()
    took = time.monotonic() - began
    resize.join(5)
    assert took < pipeline.stop_timeout_s + 2.0, took
    assert not resize.is_alive()
    assert not psutil.pid_exists(launcher) or psutil.Process(launcher).status() == "zombie"
    assert not [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
