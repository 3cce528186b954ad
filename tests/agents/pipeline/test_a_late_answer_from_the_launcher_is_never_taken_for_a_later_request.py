"""The launcher numbers its answers: an answer that came after its request had timed out (the
launcher stalled, then went on) is dropped, never taken as the answer to the next request,
which would give that worker another's pid (and every later request the answer before)."""

from __future__ import annotations

import os
import select
import signal

import pytest

from agents.pipeline import zygote
from agents.pipeline.zygote import LauncherGone, Zygote


def say_pid(request, items_fd, results_fd):
    os.write(results_fd, str(os.getpid()).encode())
    select.select([items_fd], [], [], 5.0)  # until the pipeline closes the pipe


def _read_pid(fd: int) -> int:
    ready, _, _ = select.select([fd], [], [], 5.0)
    assert ready, "the worker said nothing within 5 s"
    return int(os.read(fd, 64))


def test_a_late_answer_is_dropped_and_the_next_request_gets_its_own(monkeypatch):
    monkeypatch.setattr(zygote, "_REQUEST_TIMEOUT_S", 0.3)
    launcher = Zygote(say_pid, None, None)
    opened: list[int] = []
    try:
        request = {"stage_index": 0, "slot": 0, "affinity": None, "status_index": (0, 0)}
        os.kill(launcher.pid, signal.SIGSTOP)
        with pytest.raises(LauncherGone):
            launcher.spawn(request)  # times out: the launcher is stopped
        os.kill(launcher.pid, signal.SIGCONT)  # it answers the first request now, late
        pid, pidfd, items_w, results_r = launcher.spawn(request)
        opened += [fd for fd in (pidfd, items_w, results_r) if fd is not None]
        assert _read_pid(results_r) == pid
        pid2, pidfd2, items_w2, results_r2 = launcher.spawn(request)
        opened += [fd for fd in (pidfd2, items_w2, results_r2) if fd is not None]
        assert _read_pid(results_r2) == pid2 != pid
    finally:
        os.kill(launcher.pid, signal.SIGCONT)
        for fd in opened:
            os.close(fd)
        launcher.close()
        assert not launcher.alive()
