"""Which processes still run, for tests that check nothing is left behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

import psutil


def still_running(pids: Iterable[int]) -> list[int]:
    """The pids that are running (a zombie, exited and not yet reaped, is not)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def exit_code_within(pid: int, seconds: float, poll_s: float = 0.05) -> int | None:
    """The exit code (``-signal`` if killed) of our child ``pid`` once it ends, or ``None``
    when it has not ended within ``seconds``: then it is SIGKILLed and reaped."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(poll_s)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
