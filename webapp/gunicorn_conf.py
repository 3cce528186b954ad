"""gunicorn settings for the web service, the same in the demo, the tests and docker-compose.

uvicorn workers serving webapp.asgi: an agent's held allocation long-poll is a future on the
worker's event loop, not a thread (webapp/agent_asgi.py); Django's work runs on a small thread
pool of ``INTUNE_WEB_THREADS`` per process.
"""

import os

from django.core.exceptions import ImproperlyConfigured

from webapp.env import envint
from webapp.metrics import multiprocess
from webapp.settings import VAR_DIR
from webapp.stack.limits import raise_open_file_limit

# Below this many open files a web worker could not hold 2,000 agents' connections.
MIN_OPEN_FILES = 8192

bind = os.getenv("INTUNE_BIND", "127.0.0.1:8000")
workers = envint("WEB_CONCURRENCY", 2)
# uvicorn's worker, with gunicorn's bounds on a request's head (webapp/stack/web_worker.py).
worker_class = "webapp.stack.web_worker.BoundedUvicornWorker"
limit_request_fields = 100
limit_request_field_size = 8190
# Threads per process for Django's work (agents' batches, the allocation view's checks): held
# long-polls take none, so a few suffice; each borrows a database connection while it works.
threads = envint("INTUNE_WEB_THREADS", 8)
# Each thread's connection opened when the process starts (webapp/settings.py says why); the
# workers read the settings after this file, so the environment carries it to them.
os.environ.setdefault("INTUNE_DB_POOL_MIN_SIZE", str(threads))
timeout = 120
graceful_timeout = 10
# Seconds an idle connection is kept open, between requests and before the first one. The
# request and write timeouts (INTUNE_REQUEST_TIMEOUT_S, INTUNE_WRITE_TIMEOUT_S) are read by the
# worker (webapp/stack/web_worker.py).
keepalive = envint("INTUNE_KEEPALIVE_S", 30)
if keepalive <= 0:
    raise ImproperlyConfigured(
        f"INTUNE_KEEPALIVE_S={keepalive} is not a positive number of seconds: use e.g. "
        "INTUNE_KEEPALIVE_S=30, or unset it for that default"
    )
accesslog = os.getenv("INTUNE_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.getenv("INTUNE_LOG_LEVEL", "info").lower()
# gunicorn's control socket defaults to one path per user: two servers on a machine (the demo
# and a test stack) would fight over it, and InTune does not use it.
control_socket_disable = True


def on_starting(server) -> None:
    """Once, in the master, before the first worker: every worker counts its Prometheus metrics
    in files of one shared directory, emptied here, and a scrape answered by any worker adds
    them all up (docs/monitoring.md). The open-file limit is raised to the hard limit here, so
    that every worker inherits it: a worker holds a descriptor per agent's held long-poll and
    another per agent's keep-alive connection (webapp/stack/limits.py)."""
    multiprocess.prepare(VAR_DIR)
    limit = raise_open_file_limit()
    if limit < MIN_OPEN_FILES:
        server.log.warning(
            "the open-file limit is %d: a web worker holds about two per agent, so more than "
            "%d agents on one worker would fail; raise the hard limit (LimitNOFILE=, "
            "docker's --ulimit nofile=)",
            limit,
            limit // 2,
        )


child_exit = multiprocess.child_exit
