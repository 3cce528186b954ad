"""A call run in a thread of its own under the test's bound: what it returned or raised, and how
long it took; the test fails, naming what still waits, if it has not returned by then (never the
suite's hang)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def bounded_call(fn: Callable[[], Any], bound_s: float, waiting: str) -> dict:
    """``fn()`` in a daemon thread: ``{"value": ...}`` or ``{"error": ...}``, and ``"seconds"``;
    an ``AssertionError`` saying ``waiting`` when it is still running after ``bound_s``."""
    outcome: dict = {}

    def run() -> None:
        began = time.monotonic()
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"{waiting} after {bound_s} s"
    return outcome
