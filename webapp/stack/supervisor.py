"""Child processes that die with their parent, and a group that stops them all, leaving none."""

import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the parent dies, even by SIGKILL, so no process is left."""
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class ProcessGroup:
    """Starts named children, each in its own session so its whole tree can be signalled."""

    def __init__(self, log_dir: Path | None = None):
        self.log_dir = Path(log_dir) if log_dir else None
        self.children: dict[str, subprocess.Popen] = {}
        self._logs = []

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str], cwd: Path | None = None
    ) -> subprocess.Popen:
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
            self._logs.append(out)
        else:
            out = None
        process = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            preexec_fn=_die_with_parent,
        )
        self.children[name] = process
        log.info("started %s (pid %s): %s", name, process.pid, " ".join(argv))
        return process

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Signal a child's whole process group and wait for it; SIGKILL after ``timeout``."""
        process = self.children.pop(name, None)
        if process is None:
            return
        self._signal_group(process, sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s; killing it", name, timeout)
            self._signal_group(process, signal.SIGKILL)
            process.wait(timeout=5)
        # Stragglers of the tree (e.g. pool processes) share the group: make sure they are gone.
        self._signal_group(process, signal.SIGKILL)

    def kill(self, name: str) -> None:
        """SIGKILL a child's whole tree at once, as a crash would."""
        self.stop(name, sig=signal.SIGKILL, timeout=5)

    def stop_all(self, *, together: bool = False, timeout: float = 15.0) -> None:
        """Stop every child, the last started first, each within ``timeout``. ``together``
        signals them all at once and then waits for each (the whole group stops within one
        ``timeout``, not one per child): for a throwaway stack, where no child needs another
        to stop cleanly (an agent's last batch needs the web server up: the demo stops its agent
        first, then the rest together)."""
        if together:
            deadline = time.monotonic() + timeout
            for process in self.children.values():
                self._signal_group(process, signal.SIGTERM)
            for name in reversed(list(self.children)):
                self.stop(name, timeout=max(0.1, deadline - time.monotonic()))
        for name in reversed(list(self.children)):
            self.stop(name, timeout=timeout)
        for out in self._logs:
            out.close()
        self._logs.clear()

    def poll_dead(self) -> list[str]:
        """Names of children that exited on their own."""
        return [name for name, p in self.children.items() if p.poll() is not None]

    @staticmethod
    def _signal_group(process: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_until(condition, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``condition`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:  # the thing waited for may not be up yet
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout:.0f} s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )
