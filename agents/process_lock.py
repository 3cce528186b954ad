"""A lock shared by a process and the processes forked from it, that a dead holder cannot keep.

``multiprocessing``'s locks (a ``Value``'s ``get_lock()`` among them) are POSIX semaphores:
a process killed while it holds one (SIGKILL, the OOM killer, a segfault in user code) leaves
it taken for ever, and every other process then waits on it without end. Workers of a
training job's input pipeline are killed in exactly those ways, at any instant.

:class:`ProcessLock` is a POSIX record lock (``fcntl.lockf``) on an unlinked temporary file:
the kernel drops a process's record locks when it dies, however it dies, so the next process
takes the lock at once. Record locks belong to a process, not to a thread, so a thread lock
beside it keeps a process's threads apart too (made anew in a forked child, which may have been
forked while another thread held it). Every acquire has a bound: a holder that is alive but
stopped (SIGSTOP) makes the others raise :class:`TimeoutError` naming the lock, never wait on.

The file descriptor is inherited by ``fork``; like ``multiprocessing.Value`` the lock is shared
through inheritance only (a pickled copy would not be the same lock, so pickling raises).
"""

from __future__ import annotations

import errno
import fcntl
import multiprocessing
import os
import tempfile
import threading
import time
import weakref

__all__ = ["ProcessLock", "SharedCount"]

# The first retries are quick (a holder keeps it for microseconds), later ones back off.
_FIRST_PAUSE_S = 0.0005
_MAX_PAUSE_S = 0.02


class ProcessLock:
    """A lock between this process, its threads and the processes forked from it.

    ``name`` is said in the error when the lock cannot be taken within ``timeout`` seconds
    (the default of :meth:`acquire` and of ``with lock:``)."""

    def __init__(self, name: str = "a lock between processes", *, timeout: float = 30.0):
        self.name = name
        self.timeout = timeout
        # Unlinked at once: nothing to clean up, however this process ends. A bare descriptor,
        # closed when the lock is collected: a file object left to the collector warned
        # "ResourceWarning: unclosed file" for every lock, so every epoch of a loader (two
        # per pipeline), which fails a user's test suite run with warnings as errors (torch's
        # loader warns of nothing there).
        fd, path = tempfile.mkstemp(prefix="intune-lock-")
        os.unlink(path)
        self._fd = fd
        # Not at exit: a daemon thread may still take the lock then (its descriptor goes
        # with the process).
        weakref.finalize(self, os.close, fd).atexit = False
        self._threads = threading.Lock()
        _forked.add(self)

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock within ``timeout`` seconds (the lock's own by default); True if
        taken, False if the time ran out."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, limit)
        if not self._threads.acquire(timeout=max(0.0, limit)):
            return False
        pause = _FIRST_PAUSE_S
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    self._threads.release()
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                self._threads.release()
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_PAUSE_S)

    def release(self) -> None:
        """Let the lock go (the caller must hold it)."""
        fcntl.lockf(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def __enter__(self) -> ProcessLock:
        if not self.acquire(timeout=self.timeout):
            raise TimeoutError(
                f"{self.name} was not free within {self.timeout:g} s: a process that holds it "
                "is stopped (SIGSTOP?) or stuck while holding it"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self):
        raise TypeError(
            f"{self.name} ({type(self).__name__}) is shared with forked processes by "
            "inheritance only; it cannot be pickled"
        )

    def _after_fork_in_child(self) -> None:
        # Another thread of the parent may have held the thread lock at the fork; no such
        # thread exists here. The record lock is the parent's, not inherited: nothing to undo.
        self._threads = threading.Lock()


class SharedCount:
    """An integer shared with the processes forked from this one, changed under a
    :class:`ProcessLock` (``name`` says what it counts, in that lock's error)."""

    def __init__(self, name: str, start: int = 0, *, timeout: float = 60.0):
        self._value = multiprocessing.get_context("fork").RawValue("q", start)
        self._lock = ProcessLock(name, timeout=timeout)

    @property
    def value(self) -> int:
        """The count now."""
        return int(self._value.value)

    def add(self, n: int = 1) -> int:
        """Add ``n``; the count before."""
        with self._lock:
            before = self._value.value
            self._value.value = before + n
        return int(before)


_forked: weakref.WeakSet[ProcessLock] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for lock in list(_forked):
        lock._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
