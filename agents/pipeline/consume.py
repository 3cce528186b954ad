"""A consumer that takes items until it is told to stop: the agent's drain, the CLI's, the
benchmarks' and the tests'."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from agents.pipeline.errors import PipelineStopped


def consume_until(
    pipeline: Iterable[Any], stop: threading.Event, each: Callable[[Any], None] | None = None
) -> int:
    """Take items (calling ``each`` on every one) until ``stop`` is set or the source ends;
    return how many were taken.

    The pipeline stopped after ``stop`` was set is how such a loop is meant to end, so its
    ``PipelineStopped`` ends it quietly; stopped while ``stop`` was not set, the loop was cut
    short by someone else, and the error goes on to the caller."""
    taken = 0
    try:
        for item in pipeline:
            taken += 1
            if each is not None:
                each(item)
            if stop.is_set():
                break
    except PipelineStopped:
        if not stop.is_set():
            raise
    return taken
