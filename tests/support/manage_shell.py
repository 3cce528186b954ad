"""One long-lived ``manage.py`` process that runs management commands on request.

Tests read the live stack's database through ``manage.py shell -c`` and make people through
``manage.py intune_user``, many times a test (a wait polls a count until it grows). Each
``manage.py`` is a new Python that imports Django and the project: about 2 s of CPU on the CI's
2 cores, spent by the test while the stack it tests competes for the same cores. This process
pays that once per stack and runs each command through ``call_command``, the same command
class with the same arguments; it closes its database connections after each command, so
that every command connects afresh, as a new process would (a restarted server is no matter).
"""

import contextlib
import json
import selectors
import subprocess
import threading
import time
from pathlib import Path

SERVER = r"""
import contextlib, io, json, os, sys, traceback
replies = os.fdopen(os.dup(1), "w")  # the protocol's channel; stray writes to fd 1 go to stderr
os.dup2(2, 1)
sys.stdout = os.fdopen(1, "w", buffering=1)
import django
django.setup()
from django.core.management import call_command
from django.db import connections
replies.write("ready\n")
replies.flush()
for line in sys.stdin:
    out, err, rc = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            call_command(*json.loads(line))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        err.write(traceback.format_exc())
        rc = 1
    finally:
        connections.close_all()
    replies.write(json.dumps({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    replies.flush()
"""


class ManageShell:
    """``run(*args)`` runs ``manage.py *args`` in the one process; returns (rc, stdout, stderr)."""

    def __init__(self, python: str, env: dict[str, str], cwd: Path, log: Path):
        self.python, self.env, self.cwd, self.log = python, env, cwd, log
        self.process: subprocess.Popen | None = None
        self.ready = False  # the process said it is ready
        self.lock = threading.Lock()

    def launch(self) -> "ManageShell":
        """Start the process without waiting for it: it imports Django while the caller goes
        on (a live stack starts it beside its web server); the first command waits for it."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._launch()
        return self

    def _launch(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.ready = False
        self.process = subprocess.Popen(
            [self.python, "-c", SERVER],
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log, "ab"),  # noqa: SIM115 - the process owns it
            text=True,
        )

    def _start(self, timeout: float) -> None:
        if self.process is None or self.process.poll() is not None:
            self._launch()
        if self._read_line(timeout) != "ready":
            raise RuntimeError(f"the manage.py shell did not start; see {self.log}")
        self.ready = True

    def _read_line(self, timeout: float) -> str:
        """The next line the process writes, within ``timeout`` seconds."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                self.stop()
                raise TimeoutError(f"manage.py gave no answer in {timeout:.0f} s; see {self.log}")
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError(f"the manage.py shell exited; see {self.log}")
        return line.rstrip("\n")

    def run(self, *args: str, timeout: float = 300) -> tuple[int, str, str]:
        with self.lock:
            deadline = time.monotonic() + timeout
            if not self.ready or self.process is None or self.process.poll() is not None:
                self._start(timeout)
            self.process.stdin.write(json.dumps([str(a) for a in args]) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self._read_line(max(1.0, deadline - time.monotonic())))
            return reply["rc"], reply["stdout"], reply["stderr"]

    def stop(self) -> None:
        """Kill the process: it holds nothing to save (each command's connections are closed
        when it ends), and closing its input to let it exit took 0.2 to 0.3 s of a teardown."""
        process, self.process = self.process, None
        self.ready = False
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        with contextlib.suppress(OSError):
            process.stdin.close()
        process.stdout.close()


def persistent(args: tuple[str, ...]) -> bool:
    """Whether ``manage.py *args`` may run in the long-lived process: the tests' reads
    (``shell -c``) and ``intune_user``; the commands that a procedure under test runs
    (``migrate``, ``dumpdata``, ...) keep a process of their own, as the README runs them."""
    return bool(args) and args[0] in ("shell", "intune_user")
