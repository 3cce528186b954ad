"""How long a worker waited for a CPU: the run-queue delay the Linux scheduler keeps per thread.

A worker's busy time (in the stage's function) is CPU time, time waiting on I/O or a lock, and
time runnable but waiting for a CPU (on the run queue). Only the last grows with the host's load:
on a host whose CPUs are all taken, a worker that computes shows half a CPU of use per busy
worker, exactly as a worker that waits on I/O half the time would. The run-queue delay tells the
two apart, so each stage reports it (``runqueue_percent``, docs/agent-protocol.md) and the budget
counts it as CPU the worker wanted (:func:`agents.budget.cpu_per_busy_worker`).

``/proc/<pid>/task/<tid>/schedstat`` holds three numbers: nanoseconds on a CPU, nanoseconds
waiting on a run queue, and time slices. psutil exposes none of the second, so it is read
here. Kernels built without ``CONFIG_SCHED_INFO`` have no such file; then the delay is unknown
(``None``) and the stage reports 0, as an agent older than the field does.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


# The agent reads these for every worker every second: plain os calls on string paths, not
# pathlib (a third of the pipeline's sampling cost went to building Path objects).


def _runqueue_ns(path: str) -> int | None:
    try:
        with open(path, "rb", buffering=0) as file:
            fields = file.read(256).split()
    except OSError:
        return None
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


def thread_runqueue_seconds(tid: int, pid: int | None = None, proc: Path = PROC) -> float | None:
    """Seconds thread ``tid`` of process ``pid`` (this process by default) has spent runnable
    but waiting for a CPU since it started; ``None`` when the kernel does not say."""
    ns = _runqueue_ns(f"{proc}/{pid or os.getpid()}/task/{tid}/schedstat")
    return None if ns is None else ns / 1e9


def process_runqueue_seconds(pid: int, proc: Path = PROC) -> float | None:
    """Seconds all the threads of process ``pid`` now alive have spent waiting for a CPU;
    ``None`` when the process is gone or the kernel does not say."""
    task = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return None
    total, seen = 0, False
    for tid in tids:
        ns = _runqueue_ns(f"{task}/{tid}/schedstat")
        if ns is not None:
            total, seen = total + ns, True
    return total / 1e9 if seen else None
