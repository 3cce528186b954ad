"""Which processes still run, for tests that check nothing is left behind; and waits on what a
process does that fail with the tail of its log."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

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


# The threads a loader's pipeline runs (ours), or torch's pin-memory thread.
LOADER_THREADS = ("intune-", "dataloader-", "pin_memory")


def loader_processes_and_threads() -> tuple[set[int], set[threading.Thread]]:
    """This process's descendants and the loaders' threads running now."""
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    threads = {t for t in threading.enumerate() if t.name.startswith(LOADER_THREADS)}
    return children, threads


def loader_leftovers(
    before: tuple[set[int], set[threading.Thread]], bound_s: float
) -> tuple[set[int], set[threading.Thread]]:
    """The processes and threads (``loader_processes_and_threads``) not there ``before`` that
    still run after waiting up to ``bound_s`` for them to leave: empty sets when none is left."""
    deadline = time.monotonic() + bound_s
    while True:
        children, threads = loader_processes_and_threads()
        left = (children - before[0], threads - before[1])
        if not any(left) or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


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


def wait_showing_log(condition: Callable[[], Any], timeout_s: float, log_path: Path, what: str):
    """``wait_until(condition, timeout_s)`` polling every 0.5 s; past the bound an
    ``AssertionError`` that ends with the last 3,000 characters of the process's log."""
    from webapp.stack.supervisor import wait_until  # the agents' tests import this module too

    try:
        return wait_until(condition, timeout_s, interval=0.5, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{log_path.read_text()[-3000:]}") from exc


@contextlib.contextmanager
def under_intune_run(
    command: list[str],
    plane: Any,
    host_id: int,
    token: str,
    cwd: Path,
    pythonpath: Any,
    stop: Path,
) -> Iterator[tuple[Any, Path]]:
    """``start_under_intune_run``, for a ``with`` block: yields the process and its log's path;
    leaving the block without an error touches ``stop`` (the script's signal to end) and expects
    the command to exit 0 within 90 s; the process is killed, if it still runs, whatever
    happened."""
    run, log_path = start_under_intune_run(command, plane, host_id, token, cwd, pythonpath)
    try:
        yield run, log_path
        stop.touch()
        assert run.wait(timeout=90) == 0, log_path.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)


def json_lines(log_path: Path) -> list[dict]:
    """The lines of a log that are JSON objects (what a test's script printed), in order."""
    import json

    return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]


def start_under_intune_run(
    command: list[str], plane: Any, host_id: int, token: str, cwd: Path, pythonpath: Any
) -> tuple[Any, Path]:
    """Start ``command`` (``intune-run``'s argv, then the training command's) as host
    ``host_id`` of the live control plane ``plane``, with ``pythonpath`` (this checkout's agents
    first), in ``cwd``; returns the process and the path of its log (stdout and stderr)."""
    import subprocess

    env = os.environ | {
        "INTUNE_URL": plane.url,
        "INTUNE_HOST_ID": str(host_id),
        "INTUNE_AGENT_TOKEN": token,
        "PYTHONPATH": str(pythonpath),
    }
    log_path = cwd / "run.log"
    with open(log_path, "w") as out:
        run = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    return run, log_path
