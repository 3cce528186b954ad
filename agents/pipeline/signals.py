"""Signals in a process that runs a pipeline: Ctrl-C held over the steps that must not be cut.

Ctrl-C in a terminal sends SIGINT to the whole process group. The pipeline's launcher and its
workers lead a group of their own (``agents.pipeline.zygote``), which it does not reach, and
they ignore it besides (``GROUP_SIGNALS`` in :mod:`agents.pipeline.worker`: a scheduler may
signal every process of a job, not a group); the pipeline's own process takes it as Python does, as a
``KeyboardInterrupt`` in its main thread, wherever that thread is. Raised halfway through
starting or stopping a pipeline, it would leave a launcher forked and no thread to watch it,
or workers asked to leave and never reaped: ``deferred()`` holds it over those steps and
raises it after them.

A daemon's own handler must not take a lock (the interrupted thread may hold it):
``SignalledStop`` is the flag such a handler sets, and the waits that look at it do so in
short slices.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

# How long a wait on a SignalledStop lasts before it looks at the flag again.
SLICE_S = 0.2


class Held:
    """What a ``deferred()`` block holds: ``pending`` turns true when a Ctrl-C came, so that
    a wait inside the block can end early (it is raised when the block ends)."""

    def __init__(self) -> None:
        self.caught: list[tuple[int, FrameType | None]] = []

    @property
    def pending(self) -> bool:
        """Whether a Ctrl-C came during the block (to be raised at its end)."""
        return bool(self.caught)


@contextlib.contextmanager
def deferred() -> Iterator[Held]:
    """Hold SIGINT for the block; a Ctrl-C that came meanwhile is raised after it, as the
    handler in force would have (``KeyboardInterrupt`` for Python's own).

    A no-op outside the main thread (only it can set handlers, and only it is interrupted),
    inside another ``deferred()`` block, or where the handler in force was not set from
    Python."""
    held = Held()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or getattr(previous, "_intune_deferred", False):
        yield held
        return

    def note(signum: int, frame: FrameType | None) -> None:
        held.caught.append((signum, frame))

    note._intune_deferred = True  # type: ignore[attr-defined]
    try:
        signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main interpreter
        yield held
        return
    try:
        yield held
    except BaseException as exc:
        # A block that failed still raises the Ctrl-C it held, its error as the context:
        # raising only the block's error lost the Ctrl-C, and a loop that catches that error
        # (a DataLoader's timeout, a failed batch) went on as if none had come. (An exit
        # under way keeps its status.)
        signal.signal(signal.SIGINT, previous)
        if held.caught and not isinstance(exc, KeyboardInterrupt | SystemExit):
            _raise_held(held, previous)
        raise
    signal.signal(signal.SIGINT, previous)
    if held.caught:
        _raise_held(held, previous)


def _raise_held(held: Held, previous: signal.Handlers | Callable[..., Any] | int) -> None:
    """Act on the first Ctrl-C ``held`` caught as the handler in force would have."""
    signum, frame = held.caught[0]
    if callable(previous):
        previous(signum, frame)  # Python's own raises KeyboardInterrupt here
    elif previous == signal.SIG_DFL:
        raise KeyboardInterrupt


class SignalledStop:
    """A stop flag a signal handler may set: ``note()`` only stores a value (no lock, so it
    can never wait on the thread it interrupted), and every ``wait()`` looks at it at least
    every ``SLICE_S``. Threads use it as a ``threading.Event`` (``set``, ``is_set``,
    ``wait``); ``signum`` says which signal stopped it, if one did."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._event = threading.Event()

    def note(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: note the signal, nothing else."""
        self.signum = signum

    def set(self) -> None:
        """Stop (from a thread, not from a signal handler)."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether a stop was asked for, by a signal or by ``set()``."""
        return self.signum is not None or self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the stop; return whether it came."""
        deadline = time.monotonic() + timeout
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, SLICE_S))
        return True

    def install(self, signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """Make ``note`` the handler of ``signums`` (from the main thread)."""
        for signum in signums:
            signal.signal(signum, self.note)
