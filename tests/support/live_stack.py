"""A whole control plane in child processes on a fresh database: for end-to-end tests, load and
soak runs. Uses REDIS_URL / DATABASE_URL when set (a fresh PostgreSQL database is created and
dropped), else the embedded Redis and a SQLite file."""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from tests.support.manage_shell import ManageShell, persistent
from tests.support.ports import free_port
from webapp.stack.embedded_redis import EmbeddedRedis
from webapp.stack.services import command
from webapp.stack.supervisor import ProcessGroup, wait_until

ROOT = Path(__file__).resolve().parents[2]


class FreshDatabase:
    """A database of its own: a new PostgreSQL database when DATABASE_URL names a server,
    else a SQLite file in ``directory``.

    ``migrated=True`` gives it every migration applied. On PostgreSQL it is then copied from a
    template database that is migrated once for all the stacks of every process (``CREATE
    DATABASE ... TEMPLATE``: a fraction of a second where ``migrate`` takes seconds); the template
    is named after the migrations' contents, so a changed migration makes a new one."""

    def __init__(self, directory: Path, *, migrated: bool = False):
        self.base_url = os.getenv("DATABASE_URL", "")
        self.directory = directory
        self.migrated = migrated
        self.name = f"intune_live_{uuid.uuid4().hex[:10]}"
        self.url = ""
        self.needs_migrate = migrated

    def _postgres(self) -> bool:
        return self.base_url.startswith(("postgres://", "postgresql://"))

    def _url_of(self, name: str) -> str:
        return urlunsplit(urlsplit(self.base_url)._replace(path=f"/{name}"))

    def create(self) -> str:
        if not self._postgres():
            self.url = f"sqlite:///{self.directory / 'intune.sqlite3'}"
            return self.url
        import psycopg

        template = _migrated_template(self.base_url, self._url_of) if self.migrated else None
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            if template is None:
                conn.execute(f'CREATE DATABASE "{self.name}"')
            else:
                _copy_database(conn, template, self.name)
        self.needs_migrate = self.migrated and template is None
        self.url = self._url_of(self.name)
        return self.url

    def drop(self, *, wait: bool = True) -> None:
        """Drop the database (a SQLite file goes with its directory). ``wait=False`` drops it in
        a thread of its own, so that a test's teardown does not wait for PostgreSQL: the thread
        is not a daemon (the process exits only once it is done), and the test session waits
        for every such drop at its end (:func:`wait_for_pending_drops`)."""
        if not self.url.startswith(("postgres://", "postgresql://")):
            return
        if wait:
            self._drop()
            return
        thread = threading.Thread(target=self._drop_noting_failure, name=f"drop {self.name}")
        with _DROPS_LOCK:
            _PENDING_DROPS[thread] = self.name
        thread.start()

    def _drop(self) -> None:
        import psycopg

        # Bounded: a connection that cannot be made or a DROP that waits on a lock fails.
        with psycopg.connect(
            self.base_url, autocommit=True, connect_timeout=10, options="-c statement_timeout=60000"
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _drop_noting_failure(self) -> None:
        try:
            self._drop()
        except Exception as exc:
            with _DROPS_LOCK:
                _FAILED_DROPS.append(f"{self.name}: {exc}")
        finally:
            with _DROPS_LOCK:
                _PENDING_DROPS.pop(threading.current_thread(), None)


# Databases being dropped in the background (thread -> database), and the drops that failed.
_DROPS_LOCK = threading.Lock()
_PENDING_DROPS: dict[threading.Thread, str] = {}
_FAILED_DROPS: list[str] = []


def wait_for_pending_drops(timeout: float) -> list[str]:
    """Wait up to ``timeout`` seconds in all for the background drops of :meth:`FreshDatabase.drop`
    to end; what is left: each database still being dropped or whose drop failed, with why."""
    deadline = time.monotonic() + timeout
    with _DROPS_LOCK:
        threads = list(_PENDING_DROPS)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with _DROPS_LOCK:
        left = [
            f"{name}: still being dropped after {timeout:.0f} s" for name in _PENDING_DROPS.values()
        ]
        left += _FAILED_DROPS
        _FAILED_DROPS.clear()
    return left


TEMPLATE_PREFIX = "intune_live_template_"
_TEMPLATE_LOCK = 0x1A7E  # a pg_advisory_lock key: one process migrates the template at a time


def _migrations_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("webapp/*/migrations/*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _migrated_template(base_url: str, url_of) -> str | None:
    """The name of a database with every migration applied, made here if no process made it
    yet (older templates are dropped then); None if it cannot be made (the caller migrates)."""
    import psycopg

    name = TEMPLATE_PREFIX + _migrations_digest()
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            ready = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s AND datistemplate", (name,)
            ).fetchone()
            if ready:
                return name
            for (stale,) in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (TEMPLATE_PREFIX.replace("_", r"\_") + "%",),
            ).fetchall():
                conn.execute(f'ALTER DATABASE "{stale}" IS_TEMPLATE false')
                conn.execute(f'DROP DATABASE IF EXISTS "{stale}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
            env = dict(os.environ) | {"DATABASE_URL": url_of(name)}
            result = subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput"],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if result.returncode != 0:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return None
            # Marked a template only once migrated: a process that sees it may copy it.
            conn.execute(f'ALTER DATABASE "{name}" IS_TEMPLATE true')
            return name
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))


def _copy_database(conn, template: str, name: str) -> None:
    """CREATE DATABASE from ``template``; PostgreSQL refuses while another session copies the
    same template at that instant, so a refusal is tried again, for 30 s at most."""
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# The stack's own services, killed when it stops (LiveStack.stop says why).
KILLED_AT_STOP = ("web", "worker", "beat")


class LiveStack:
    """Web server, Celery worker (and optionally beat and agents) as real processes."""

    def __init__(
        self,
        directory: Path,
        *,
        beat: bool = False,
        extra_env: dict[str, str] | None = None,
        web_env: dict[str, str] | None = None,
        manage_shell: bool = True,
    ):
        self.directory = Path(directory)
        # Start the tests' manage.py shell (their reads, intune_user) with the services, so
        # that it imports Django while they start (1.5 to 2 s that the first read paid after
        # them); False for a test that never reads through it.
        self.manage_shell_at_start = manage_shell
        self.beat = beat
        self.extra_env = extra_env or {}
        # For the web server alone, over extra_env (not for the worker or the tests' reads).
        self.web_env = web_env or {}
        self.group = ProcessGroup(log_dir=self.directory / "logs")
        self.database = FreshDatabase(self.directory, migrated=True)
        self.embedded_redis: EmbeddedRedis | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env: dict[str, str] = {}
        self.python = sys.executable
        self.bin_dir = str(Path(sys.executable).parent)
        # Another web command than the shipped one (benchmarks compare the former tier).
        self.web_argv: list[str] | None = None
        self.manage_shell: ManageShell | None = None
        # The service each started instance runs ("worker-2" runs "worker").
        self.services: dict[str, str] = {}
        # False where the database server goes away with the test (a private one).
        self.drop_in_background = True

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "LiveStack":
        self.directory.mkdir(parents=True, exist_ok=True)
        redis_url = os.getenv("REDIS_URL")
        if not redis_url:
            self.embedded_redis = EmbeddedRedis(self.directory / "redis")
            redis_url = self.embedded_redis.start()
        self.env = (
            dict(os.environ)
            | {
                "DATABASE_URL": self.database.create(),
                "REDIS_URL": redis_url,
                "INTUNE_REDIS_PREFIX": f"intune-live-{uuid.uuid4().hex[:8]}",
                "INTUNE_VAR_DIR": str(self.directory),
                "INTUNE_BIND": f"127.0.0.1:{self.port}",
                "INTUNE_SECURE_COOKIES": "False",
                "WEB_CONCURRENCY": "1",
                "INTUNE_WORKER_CONCURRENCY": "1",
                "DJANGO_SETTINGS_MODULE": "webapp.settings",
                "PYTHONUNBUFFERED": "1",
            }
            | self.extra_env
        )
        if self.database.needs_migrate:
            self.manage("migrate", "--noinput")
        if self.web_argv:
            self.group.start("web", self.web_argv, self.env | self.web_env, cwd=ROOT)
            self.services["web"] = "web"
        else:
            self.start_service("web")
        self.start_service("worker")
        if self.beat:
            self.start_service("beat")
        if self.manage_shell_at_start:
            self._manage_shell().launch()
        self.wait_healthy()
        return self

    def stop(self) -> None:
        """End the stack at once, its test done: the web server, worker and beat are killed
        (SIGKILL: nothing is left to check of them, and their graceful stop took 2.2 to 4.7 s
        of each test's teardown; a test of how a service stops signals it itself, through
        ``group.stop``), the agents are stopped with SIGTERM as before (an agent killed would
        leave its shared-memory files in /dev/shm), and the database is dropped in the
        background (the session waits for it at its end, tests/conftest.py)."""
        if self.manage_shell is not None:
            self.manage_shell.stop()
        for instance in [i for i in self.group.children if self.services.get(i) in KILLED_AT_STOP]:
            self.group.kill(instance)
        self.group.stop_all(together=True)
        if self.embedded_redis is not None:
            self.embedded_redis.stop()
        self.database.drop(wait=not self.drop_in_background)

    def __enter__(self) -> "LiveStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- services --------------------------------------------------------------------------
    def start_service(
        self,
        name: str,
        *,
        env: dict[str, str] | None = None,
        argv_extra: list[str] | None = None,
        instance: str | None = None,
    ):
        argv = command(name, self.python, self.bin_dir) + list(argv_extra or [])
        self.services[instance or name] = name
        env = self.env | (self.web_env if name == "web" else {}) | (env or {})
        return self.group.start(instance or name, argv, env, cwd=ROOT)

    def start_agent(
        self,
        host_id: int,
        token: str,
        *argv_extra: str,
        instance: str = "agent",
        state_dir: Path | None = None,
    ):
        """The real agent (``python -m agents``, the compose service's command) for a registered
        host, with its own state directory; ``argv_extra`` adds or overrides flags."""
        state_dir = state_dir or self.directory / f"{instance}-state"
        return self.start_service(
            "agent",
            env={
                "INTUNE_URL": self.url,
                "INTUNE_HOST_ID": str(host_id),
                "INTUNE_AGENT_TOKEN": token,
            },
            argv_extra=["--state-dir", str(state_dir), *argv_extra],
            instance=instance,
        )

    def wait_healthy(self, timeout: float = 60) -> None:
        wait_until(
            lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200,
            timeout,
            what="the web server's /healthz",
        )

    def manage(self, *args: str) -> str:
        """``manage.py *args`` against the stack's database; its output. The tests' reads and
        ``intune_user`` run in one long-lived process (see tests/support/manage_shell.py)."""
        if persistent(args):
            returncode, stdout, stderr = self._manage_shell().run(*args)
        else:
            result = subprocess.run(
                [self.python, "manage.py", *args],
                env=self.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            returncode, stdout, stderr = result.returncode, result.stdout, result.stderr
        if returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{stdout}\n{stderr}")
        return stdout

    def _manage_shell(self) -> ManageShell:
        if self.manage_shell is None:
            log = self.directory / "logs" / "manage-shell.log"
            self.manage_shell = ManageShell(self.python, self.env, ROOT, log)
        return self.manage_shell

    def stored_samples(self, job_id: int) -> int:
        """How many host samples of the job the database holds (read by a management shell)."""
        code = (
            "from webapp.ingestion.models import HostSample; "
            f"print(HostSample.objects.filter(host__job_id={int(job_id)}).count())"
        )
        return int(self.manage("shell", "-c", code).strip().splitlines()[-1])

    def log(self, name: str) -> str:
        path = self.directory / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- API helpers -----------------------------------------------------------------------
    def create_user(self, username: str, role: str = "operator") -> dict:
        return json.loads(
            self.manage("intune_user", username, "--role", role).strip().splitlines()[-1]
        )

    def register_job_and_host(self, token: str, job: dict, host: dict) -> tuple[int, int, str]:
        """Register ``job`` (the POST body) and one ``host`` of it through the REST API, as an
        operator with ``token`` does; return the job id, the host id and its agent token."""
        with self.client(token) as api:
            created = api.post("/api/v1/jobs/", json=job)
            if created.status_code != 201:
                raise RuntimeError(f"registering job failed: {created.status_code} {created.text}")
            job_id = created.json()["id"]
            registered = api.post(f"/api/v1/jobs/{job_id}/hosts/", json=host)
            if registered.status_code != 201:
                raise RuntimeError(
                    f"registering host failed: {registered.status_code} {registered.text}"
                )
        return job_id, registered.json()["id"], registered.json()["agent_token"]

    def client(self, token: str | None = None, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Token {token}"} if token else {}
        return httpx.Client(
            base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs
        )
