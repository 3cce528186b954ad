"""The launcher every worker process of a pipeline is forked from.

Forking a process that runs threads copies its memory, locks included, but only the thread
that forked: a lock another thread held at that moment stays held in the child forever. A
pipeline runs threads (its source, its collector, thread stages, the relays of process
workers, and whatever the training script runs), so a worker forked from it during a live
resize could hang on its first ``malloc``-adjacent lock, import or log line. The launcher is
forked once, when the pipeline starts and before the pipeline starts any thread of its own;
it runs no thread and no user code, and forks every worker of the pipeline on request.

It talks to the pipeline over a ``SOCK_SEQPACKET`` socket: a request carries the stage, the
worker's slot and CPUs, with the worker's two pipe ends as passed file descriptors; the
answer carries the new worker's pid and a pidfd, which the pipeline uses to signal and watch
that very process (a pid alone could be reused once the process is reaped).

The launcher reaps its workers and keeps their exit status in a shared array, so a worker's
death can be explained ("killed by signal 9"). When the pipeline's process dies the launcher
notices (its socket closes, or its parent changes), kills every worker, removes the
pipeline's shared-memory files and exits; each worker is also set to die with the launcher.

What a worker's code starts lives no longer than that worker: a fork of the worker's main
thread dies with it (``PR_SET_PDEATHSIG``, see ``agents.pipeline.worker``), and anything a
worker's code started that its parent leaves orphaned (a dead worker's ``subprocess``, a
daemon it double-forked) is adopted by the launcher (``PR_SET_CHILD_SUBREAPER``) and killed
within ``_LOOP_S``; when the launcher leaves, everything under it goes. A process meant to
outlive the worker that started it must be started from the training script instead.

A launcher killed outright (SIGKILL, the OOM killer) cannot do that: its workers die with it,
and what they had ``exec``'d (a ``subprocess``, which gets no at-fork hook, so no death
signal) went to init and ran on. Every process under the launcher carries the pipeline's mark
in its environment (``MARK``, inherited across fork and exec); when the pipeline finds its
launcher killed it ends every process still carrying the mark (``end_marked``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import pickle
import select
import signal
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from agents.pipeline.worker import die_with_parent, ignore_group_signals

log = logging.getLogger(__name__)

# Every fork of the pipeline's process that this package makes holds this lock, so that no
# fork of ours copies pipe ends that another of our pipelines is handing over to a worker.
FORK_LOCK = threading.Lock()

# An answer: the number of the request it answers, and the new worker's pid (or -errno).
_ANSWER = struct.Struct("<qq")
_REQUEST_TIMEOUT_S = 10.0  # the socket's timeout: a launcher that does not answer is gone
_ANSWER_SLICE_S = 0.05  # how often a request waiting for its answer looks for a stop
_KILL_REAP_S = 1.0  # how long close() waits for the launcher to die after SIGKILL
# A launcher's last message when it dies of an exception: this mark, then its traceback.
_CRASH = b"intune-launcher-crash\n"
_REPORT_BYTES = 16384  # the most of a message read from the launcher (a traceback's text)
_PR_SET_CHILD_SUBREAPER = 36
_LOOP_S = 0.2  # how often the launcher reaps, looks for strays and for its parent's death
# The environment variable every process under a launcher carries: the pipeline's prefix.
MARK = "INTUNE_PIPELINE"
_MARK_ROUNDS = 5  # scans of /proc at most, while each still finds a marked process


class LauncherGone(RuntimeError):
    """The launcher process is not there any more; the pipeline cannot start workers."""


class Zygote:
    """The pipeline's side of its launcher process."""

    def __init__(self, serve: Callable[..., None], statuses: Any, prefix: str | None) -> None:
        """Fork the launcher now.

        ``serve(request, items_fd, results_fd)`` is what a worker runs (in the worker);
        ``statuses`` a list of shared arrays of doubles, where the launcher writes each
        worker's exit status at the request's ``status_index`` (array, position); ``prefix`` the shared-memory
        prefix to sweep if the pipeline's process dies.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        with FORK_LOCK:
            pid = os.fork()
        if pid == 0:  # the launcher
            code = 0
            try:
                ours.close()
                _launcher(theirs, parent, serve, statuses, prefix)
            except BaseException:  # noqa: BLE001 - never return into the caller's code
                code = 1
                _report(theirs, traceback.format_exc())
            finally:
                os._exit(code)
        theirs.close()
        ours.settimeout(_REQUEST_TIMEOUT_S)
        self.pid = pid
        self._prefix = prefix
        self._socket = ours
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned = False  # the pipeline is stopping: no request waits any more
        self._requests = 0  # requests sent: each is numbered, and so is its answer
        self.started_workers = 0  # workers it forked: one or more, it got past its start
        self.exit_code: int | None = None  # once reaped: its exit code, or -signal
        self.crash = ""  # what it raised, if it said so before it died (traceback text)

    def spawn(self, request: dict[str, Any]) -> tuple[int, int | None, int, int]:
        """Start a worker; return its pid, a pidfd (``None`` where the platform has none),
        and the pipeline's ends of its item pipe (to write) and result pipe (to read)."""
        items_r, items_w = os.pipe()
        results_r, results_w = os.pipe()
        try:
            with self._lock:
                if self._closed or self._abandoned:
                    raise LauncherGone("the pipeline is stopping")
                self._requests += 1
                number = self._requests
                try:
                    with FORK_LOCK:
                        socket.send_fds(
                            self._socket,
                            [pickle.dumps({**request, "number": number})],
                            [items_r, results_w],
                        )
                        # Only the worker may hold its ends: end-of-file on the result pipe
                        # is how the pipeline learns that the worker is gone.
                        os.close(items_r)
                        os.close(results_w)
                        items_r = results_w = -1
                    message, fds = self._answer_to(number)
                except (OSError, TimeoutError) as exc:
                    raise LauncherGone(
                        f"the worker launcher (pid {self.pid}) is gone: {exc}"
                    ) from exc
            if not message:
                raise LauncherGone(f"the worker launcher (pid {self.pid}) closed its socket")
            _, pid = _ANSWER.unpack(message)
            if pid > 0:
                self.started_workers += 1
            if pid < 0:
                raise LauncherGone(f"the worker launcher could not fork: {os.strerror(-pid)}")
            return pid, (fds[0] if fds else None), items_w, results_r
        except BaseException:
            for fd in (items_r, results_w, items_w, results_r):
                if fd >= 0:
                    _close(fd)
            raise

    def _answer_to(self, number: int) -> tuple[bytes, list[int]]:
        """The launcher's answer to request ``number`` (the lock held). A late answer to an
        earlier request, one that timed out, is dropped (its pidfd closed): taken for this
        one, it gave this worker another's pid, and every later request the answer before."""
        deadline = time.monotonic() + _REQUEST_TIMEOUT_S
        while True:
            # In slices, so that a stop is not held up to the whole timeout by a launcher
            # that does not answer (stopped, or swapped out under memory pressure).
            ready, _, _ = select.select([self._socket], [], [], _ANSWER_SLICE_S)
            if self._abandoned:
                raise TimeoutError("the pipeline is stopping")
            if not ready:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no answer to request {number} in {_REQUEST_TIMEOUT_S} s")
                continue
            message, fds, _, _ = socket.recv_fds(self._socket, _REPORT_BYTES, 1)
            if message.startswith(_CRASH):
                self.crash = message[len(_CRASH) :].decode(errors="replace")
                raise OSError(f"it died: {_last_line(self.crash)}")
            if not message or _ANSWER.unpack(message)[0] == number:
                return message, fds
            for fd in fds:
                _close(fd)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to request {number} in {_REQUEST_TIMEOUT_S} s")

    def abandon(self) -> None:
        """Make the request waiting for an answer, and every later one, fail at once (the
        pipeline is stopping; taken without the lock, which that request holds)."""
        self._abandoned = True

    def alive(self) -> bool:
        """Say whether the launcher still runs (once it has not: ``exit_code``)."""
        if self.exit_code is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid:
            self.exit_code = os.waitstatus_to_exitcode(status)
        return pid == 0

    def how_it_ended(self) -> str:
        """How the launcher ended, for a message (after ``alive()`` said it had): its exit
        status, and the last line of what it raised if it said so before it died."""
        with self._lock:
            while not self._closed:
                try:
                    message = self._socket.recv(_REPORT_BYTES, socket.MSG_DONTWAIT)
                except (BlockingIOError, OSError):
                    break
                if not message:
                    break
                if message.startswith(_CRASH):
                    self.crash = message[len(_CRASH) :].decode(errors="replace")
        code = self.exit_code
        if code is None:
            how = "ended"
        elif code < 0:
            name = signal.Signals(-code).name if -code < signal.NSIG else "?"
            how = f"was killed by signal {-code} ({name})"
        else:
            how = f"exited with code {code}"
        return f"{how}: {_last_line(self.crash)}" if self.crash else how

    def close(self, timeout: float = 2.0) -> None:
        """Stop the launcher: it kills any worker left and exits; reap it within ``timeout``.

        A launcher that was killed (it could not end what its workers had started) has its
        marked processes ended here (``end_marked``)."""
        with self._lock:
            self._closed = True
            self._socket.close()
        deadline = time.monotonic() + timeout
        killed = False
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = 0, None
            if status is not None and pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
            if pid or status is None:
                if self._prefix is not None and (self.exit_code or 0) < 0:
                    end_marked(self._prefix)
                return
            if time.monotonic() > deadline:
                if not killed:
                    os.kill(self.pid, signal.SIGKILL)
                    killed = True
                    deadline = time.monotonic() + _KILL_REAP_S
                else:
                    # Still not dead a second after SIGKILL (stuck in the kernel, e.g. on a hung
                    # NFS read): leave it to init rather than block the caller without a bound.
                    log.warning("launcher %d did not exit after SIGKILL; not reaped", self.pid)
                    return
            time.sleep(0.01)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _report(sock: socket.socket, text: str) -> None:
    """From a launcher about to die of an exception: what it raised, for the pipeline's
    message (best effort: the socket may be gone, or full)."""
    data = _CRASH + text.encode(errors="replace")[-(_REPORT_BYTES - len(_CRASH)) :]
    try:
        sock.setblocking(False)
        sock.send(data)
    except OSError:
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _launcher(
    sock: socket.socket,
    parent: int,
    serve: Callable[..., None],
    statuses: Any,
    prefix: str | None,
) -> None:
    """The launcher's loop: fork workers on request, reap them, and leave with the pipeline."""
    # It leaves with the pipeline's process, not with the group; so do its workers.
    ignore_group_signals(in_children=True)
    if prefix is not None:
        os.environ[MARK] = prefix  # inherited by every process under it (see end_marked)
    _adopt_orphans()
    children: dict[int, tuple[int, int]] = {}  # pid -> where its exit status goes
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], _LOOP_S)
            _reap(children, statuses)
            _end_strays(children)
            if os.getppid() != parent:
                return  # the pipeline's process died
            if not ready:
                continue
            try:
                message, fds, _, _ = socket.recv_fds(sock, 4096, 2)
            except OSError:
                return
            if not message:
                return  # the pipeline closed the socket: it is stopping, or gone
            request = pickle.loads(message)
            pid = _fork_worker(sock, request, fds, serve)
            if pid > 0:
                children[pid] = request["status_index"]
            reply_fds = []
            if pid > 0 and hasattr(os, "pidfd_open"):
                try:
                    reply_fds = [os.pidfd_open(pid)]
                except OSError:
                    reply_fds = []
            try:
                socket.send_fds(sock, [_ANSWER.pack(request["number"], pid)], reply_fds)
            except OSError:
                return
            finally:
                for fd in reply_fds:
                    os.close(fd)
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Then what the workers started: orphaned as the workers die, adopted here, killed.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            _reap(children, statuses)
            if not _end_strays(children) and not children:
                break
            time.sleep(0.01)
        if prefix is not None:
            # The pipeline's process sweeps after it has closed this launcher too, but it may
            # be killed on its way (a second Ctrl-C, SIGKILL): the launcher is the last out.
            from agents.pipeline import shm

            shm.sweep(prefix)


def end_marked(prefix: str) -> list[int]:
    """SIGKILL every process carrying ``prefix`` as its ``MARK`` (what was under a launcher
    that was killed: its workers die with it, but what they exec'd went to init); return
    their pids. Each is signalled through a pidfd opened before its mark is read again, so a
    pid reused meanwhile is never hit. Processes that cleared their environment (``env=`` to
    ``subprocess``) carry no mark and are not found."""
    mark = f"{MARK}={prefix}".encode()
    ended: list[int] = []
    for _ in range(_MARK_ROUNDS):
        found = []
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:  # pragma: no cover - no /proc (not Linux)
            return ended
        for pid in pids:
            if pid == os.getpid() or not _marked(pid, mark):
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                continue
            try:
                if _marked(pid, mark):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    found.append(pid)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        if not found:
            break
        ended += found
    if ended:
        log.warning(
            "ended %d process(es) the killed launcher's workers had started (pids %s)",
            len(set(ended)),
            ", ".join(map(str, sorted(set(ended)))),
        )
    return ended


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return mark in environ.read().split(b"\0")
    except OSError:
        return False


def _adopt_orphans() -> None:
    """Make the launcher the parent of every process its workers' code started and left
    orphaned (``PR_SET_CHILD_SUBREAPER``; Linux), so that ``_end_strays`` can end them.

    A worker killed (by the pipeline on stop, by the OOM killer) left what its code had
    started to init: the processes of a ``multiprocessing.Pool`` in ``__getitem__`` stayed,
    waiting on the pool's lock, after the training script had ended."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _end_strays(children: dict[int, tuple[int, int]]) -> list[int]:
    """SIGKILL every child of the launcher that is not one of its workers: a process a
    worker's code started whose parent has died (a worker, or a process of the worker's);
    return them (those not reaped yet included)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as listing:
            strays = [int(pid) for pid in listing.read().split() if int(pid) not in children]
    except OSError:  # pragma: no cover - no /proc (not Linux), or an old kernel
        return []
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return strays


def _fork_worker(
    sock: socket.socket, request: dict[str, Any], fds: list[int], serve: Callable[..., None]
) -> int:
    """Fork one worker with its two pipe ends; return its pid (a negative errno on failure)."""
    launcher = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return -(exc.errno or errno.EAGAIN)
    if pid == 0:  # the worker
        code = 0
        try:
            sock.close()
            # Not Linux: the launcher still kills its workers when it leaves normally.
            die_with_parent(launcher)
            serve(request, fds[0], fds[1])
        except BaseException:  # noqa: BLE001 - a worker never returns into the launcher
            code = 1
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    if request.get("affinity"):
        # Pinned here, before the pipeline learns the pid, never by the worker itself: a pin
        # the pipeline sets once it knows the pid (a re-plan at apply()) then always comes
        # later, where a worker pinning itself as it starts could undo a re-plan made meanwhile.
        try:
            os.sched_setaffinity(pid, request["affinity"])
        except (AttributeError, OSError):
            pass  # the platform cannot pin, or the CPUs are not ours
    return pid


def _reap(children: dict[int, tuple[int, int]], statuses: Any) -> None:
    """Collect exited children: workers, whose status (exit code, or -signal) goes to their
    slot, and adopted strays (``_end_strays``)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        where = children.pop(pid, None)
        if where is not None and statuses is not None:
            array, position = where
            statuses[array][position] = float(os.waitstatus_to_exitcode(status))
