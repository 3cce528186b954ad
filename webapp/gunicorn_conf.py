"""gunicorn settings for the web service, the same in the demo, the tests and docker-compose.

Threads, not only processes: an agent's allocation long-poll holds a thread while it waits
on Redis pub/sub, so each process serves many agents at once.
"""

import os

from webapp.env import envint
from webapp.metrics import multiprocess
from webapp.settings import VAR_DIR

bind = os.getenv("INTUNE_BIND", "127.0.0.1:8000")
workers = envint("WEB_CONCURRENCY", 2)
worker_class = "gthread"
# Each agent holds one long-poll, so a process needs a thread per agent it serves, and more for
# the batches: with 2 processes the default serves a fleet of about 400 hosts. A waiting thread
# costs memory for its stack, no CPU; the pool starts threads only as they are needed.
threads = envint("INTUNE_WEB_THREADS", 256)
timeout = 120
graceful_timeout = 10
keepalive = 30
accesslog = os.getenv("INTUNE_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.getenv("INTUNE_LOG_LEVEL", "info").lower()
# gunicorn's control socket defaults to one path per user: two servers on a machine (the demo
# and a test stack) would fight over it, and InTune does not use it.
control_socket_disable = True


def on_starting(server) -> None:
    """Once, in the master, before the first worker: every worker counts its Prometheus metrics
    in files of one shared directory, emptied here, and a scrape answered by any worker adds
    them all up (docs/monitoring.md)."""
    multiprocess.prepare(VAR_DIR)


child_exit = multiprocess.child_exit
