"""prometheus-client's multiprocess mode for the web server's worker processes.

gunicorn forks several workers; each counts in memory-mapped files of its own in one directory,
and a scrape, answered by any one of them, adds up all the files. The directory is per machine
(the hostname is in its name, as var/ may be a volume shared by several machines), emptied when
the server starts (figures of a previous run would add to this one's), and a worker's live gauges
are dropped when it exits (``child_exit``).

Nothing here imports prometheus-client at module level: the variable must be set before the
first import of it in a process that will be forked.
"""

import os
import socket
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(var_dir: Path | str) -> Path:
    """Set up the directory before any worker starts (gunicorn's config calls this in the
    master): ``PROMETHEUS_MULTIPROC_DIR`` if set, else ``<var_dir>/prometheus-<hostname>``;
    created, emptied of a previous run's files, and exported to the workers."""
    path = Path(os.environ.get(ENV) or Path(var_dir) / f"prometheus-{socket.gethostname()}")
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ[ENV] = str(path)
    return path


def child_exit(server, worker) -> None:
    """gunicorn's ``child_exit`` hook: drop the exited worker's live gauges (held long-polls)."""
    from prometheus_client import multiprocess

    if os.environ.get(ENV):
        multiprocess.mark_process_dead(worker.pid)


def enabled() -> bool:
    """Whether this process counts in the shared directory (set before it was started)."""
    return bool(os.environ.get(ENV))
