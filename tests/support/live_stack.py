"""A whole control plane in child processes on a fresh database: for end-to-end tests, load and
soak runs. Uses REDIS_URL / DATABASE_URL when set (a fresh PostgreSQL database is created and
dropped), else the embedded Redis and a SQLite file."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from tests.support.ports import free_port
from webapp.stack.embedded_redis import EmbeddedRedis
from webapp.stack.services import command
from webapp.stack.supervisor import ProcessGroup, wait_until

ROOT = Path(__file__).resolve().parents[2]


class FreshDatabase:
    """A database of its own: a new PostgreSQL database when DATABASE_URL names a server,
    else a SQLite file in ``directory``."""

    def __init__(self, directory: Path):
        self.base_url = os.getenv("DATABASE_URL", "")
        self.directory = directory
        self.name = f"intune_live_{uuid.uuid4().hex[:10]}"
        self.url = ""

    def create(self) -> str:
        if self.base_url.startswith(("postgres://", "postgresql://")):
            import psycopg

            with psycopg.connect(self.base_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.name}"')
            parts = urlsplit(self.base_url)
            self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        else:
            self.url = f"sqlite:///{self.directory / 'intune.sqlite3'}"
        return self.url

    def drop(self) -> None:
        if self.url.startswith(("postgres://", "postgresql://")):
            import psycopg

            with psycopg.connect(self.base_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class LiveStack:
    """Web server, Celery worker (and optionally beat and agents) as real processes."""

    def __init__(
        self, directory: Path, *, beat: bool = False, extra_env: dict[str, str] | None = None
    ):
        self.directory = Path(directory)
        self.beat = beat
        self.extra_env = extra_env or {}
        self.group = ProcessGroup(log_dir=self.directory / "logs")
        self.database = FreshDatabase(self.directory)
        self.embedded_redis: EmbeddedRedis | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env: dict[str, str] = {}
        self.python = sys.executable
        self.bin_dir = str(Path(sys.executable).parent)
        # Another web command than the shipped one (benchmarks compare the former tier).
        self.web_argv: list[str] | None = None

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
        self.manage("migrate", "--noinput")
        if self.web_argv:
            self.group.start("web", self.web_argv, self.env, cwd=ROOT)
        else:
            self.start_service("web")
        self.start_service("worker")
        if self.beat:
            self.start_service("beat")
        self.wait_healthy()
        return self

    def stop(self) -> None:
        self.group.stop_all()
        if self.embedded_redis is not None:
            self.embedded_redis.stop()
        self.database.drop()

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
        return self.group.start(instance or name, argv, self.env | (env or {}), cwd=ROOT)

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
        result = subprocess.run(
            [self.python, "manage.py", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
            )
        return result.stdout

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
