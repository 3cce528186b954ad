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

The launcher also leads a process group of its own, which its workers and what they start
inherit (``subprocess`` with ``env={...}`` too, which clears the mark; not what calls
``setsid``): the pipeline, finding its launcher exited, SIGKILLs that group before it reaps the
launcher (``Zygote._exited``; the zombie holds the group's id, so it names no other group).
And a ``kill -9`` of the training script's whole group does not reach the launcher: it finds
its parent gone within ``_LOOP_S``, ends its workers and what it adopted, removes the shared
memory, and SIGKILLs its group, itself last. In a group of their own, the launcher and the
workers are a background group of the terminal: they ignore ``SIGTTIN`` and ``SIGTTOU`` (a
read of the terminal fails rather than stopping the process; ``input()`` in a stage raises).
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
import weakref
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


# The pipelines' ends of their launchers' sockets, closed in every process forked from the
# pipelines' process (another pipeline's launcher, a torch worker, a fork of the script's): a
# launcher leaves once its pipeline closes its end, and a copy kept open in another process
# hid that close. A script with two persistent loaders, whose second loader's launcher held
# the first's end, waited 2 s at exit for the first launcher to leave, then killed it (exit
# 3.0 s after a Ctrl-C against torch's 0.8 s: the exit hunter, seed 1012, 3 runs of 4).
_PARENT_ENDS: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def _close_parent_ends() -> None:
    for end in list(_PARENT_ENDS):
        try:
            end.close()
        except OSError:
            pass
    _PARENT_ENDS.clear()


os.register_at_fork(after_in_child=_close_parent_ends)


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
        _PARENT_ENDS.add(ours)
        self._lock = threading.Lock()
        self._closed = False
        self._abandoned = False  # the pipeline is stopping: no request waits any more
        self._requests = 0  # requests sent: each is numbered, and so is its answer
        self._pending: dict[int, float] = {}  # requests not answered yet -> their deadline
        self._answers: dict[int, tuple[bytes, list[int]]] = {}  # answers not taken yet
        self._gone = ""  # why no answer will come any more (the socket closed, a crash)
        self.started_workers = 0  # workers it forked: one or more, it got past its start
        self.exit_code: int | None = None  # once reaped: its exit code, or -signal
        self.crash = ""  # what it raised, if it said so before it died (traceback text)

    def spawn(self, request: dict[str, Any]) -> tuple[int, int | None, int, int]:
        """Start a worker; return its pid, a pidfd (``None`` where the platform has none),
        and the pipeline's ends of its item pipe (to write) and result pipe (to read).

        Waits for the launcher's answer up to ``_REQUEST_TIMEOUT_S``; ``request()`` and
        ``answer()`` are the same in two steps, for a caller that must not wait so long."""
        number, items_w, results_r = self.request(request)
        try:
            answer = self.answer(number, _REQUEST_TIMEOUT_S)
            assert answer is not None  # a wait to the request's own deadline ends in one
        except BaseException:
            self.forget(number)
            _close(items_w)
            _close(results_r)
            raise
        pid, pidfd = answer
        return pid, pidfd, items_w, results_r

    def request(self, request: dict[str, Any]) -> tuple[int, int, int]:
        """Ask the launcher for a worker, without waiting for its answer: return the
        request's number (for ``answer()``) and the pipeline's ends of the worker's item pipe
        (to write) and result pipe (to read)."""
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
                except OSError as exc:
                    raise LauncherGone(
                        f"the worker launcher (pid {self.pid}) is gone: {exc}"
                    ) from exc
                self._pending[number] = time.monotonic() + _REQUEST_TIMEOUT_S
            return number, items_w, results_r
        except BaseException:
            for fd in (items_r, results_w, items_w, results_r):
                if fd >= 0:
                    _close(fd)
            raise

    def answer(self, number: int, wait_s: float) -> tuple[int, int | None] | None:
        """The launcher's answer to request ``number``: the new worker's pid and pidfd, or
        ``None`` if none came within ``wait_s`` (ask again later). Raises ``LauncherGone``
        once the launcher is gone, crashed, or has not answered within
        ``_REQUEST_TIMEOUT_S`` of the request (the request is then forgotten: a late answer
        is dropped, its pidfd closed; the worker it started finds its item pipe closed and
        leaves). A late answer taken for a later request gave that worker another's pid."""
        until = time.monotonic() + max(0.0, wait_s)
        with self._lock:
            while True:
                if number in self._answers:
                    message, fds = self._answers.pop(number)
                    self._pending.pop(number, None)
                    break
                expires = self._pending.get(number)
                if self._gone or self._closed or self._abandoned or expires is None:
                    self._pending.pop(number, None)
                    raise LauncherGone(
                        f"the worker launcher (pid {self.pid}) is gone: "
                        + (self._gone or "the pipeline is stopping")
                    )
                now = time.monotonic()
                if now > expires:
                    self._pending.pop(number, None)
                    raise LauncherGone(
                        f"the worker launcher (pid {self.pid}) is gone: no answer to request "
                        f"{number} in {_REQUEST_TIMEOUT_S} s"
                    )
                if now >= until and not self._readable(0.0):
                    return None
                # In slices, so that a stop is not held up by a launcher that does not answer
                # (stopped, or swapped out under memory pressure).
                if self._readable(min(_ANSWER_SLICE_S, max(0.0, until - now))):
                    self._take_answers()
        _, pid = _ANSWER.unpack(message)
        if pid > 0:
            self.started_workers += 1
            return pid, (fds[0] if fds else None)
        for fd in fds:
            _close(fd)
        raise LauncherGone(f"the worker launcher could not fork: {os.strerror(-pid)}")

    def behind(self, number: int) -> bool:
        """Whether a request before ``number`` is still unanswered (the launcher lags)."""
        with self._lock:
            return any(earlier < number for earlier in self._pending)

    def forget(self, number: int) -> None:
        """Give up request ``number``: its answer, come or to come, is dropped."""
        with self._lock:
            self._pending.pop(number, None)
            _, fds = self._answers.pop(number, (b"", []))
        for fd in fds:
            _close(fd)

    def _readable(self, wait_s: float) -> bool:
        try:
            ready, _, _ = select.select([self._socket], [], [], wait_s)
        except (OSError, ValueError):  # closed under us: close() holds the lock, so not ours
            return False
        return bool(ready)

    def _take_answers(self) -> None:
        """Read every answer waiting on the socket (the lock held): each kept for its
        request, one for a forgotten request dropped (its pidfd closed)."""
        # A socket with a timeout waits for data before it reads, MSG_DONTWAIT or not: read
        # only what select() says is there.
        reset = False
        while self._readable(0.0):
            try:
                message, fds, _, _ = socket.recv_fds(self._socket, _REPORT_BYTES, 1)
            except (BlockingIOError, InterruptedError, TimeoutError):
                return
            except ConnectionResetError as exc:
                self._gone = str(exc)
                if reset:  # said once only: a second would be a socket gone wrong
                    return
                # The launcher died with requests unread: the kernel says so once, before
                # what it sent (its crash report) is read. Read on.
                reset = True
                continue
            except OSError as exc:
                self._gone = str(exc)
                return
            if not message:
                self._gone = "it closed its socket"
                return
            if message.startswith(_CRASH):
                self.crash = message[len(_CRASH) :].decode(errors="replace")
                self._gone = f"it died: {_last_line(self.crash)}"
                return
            number = _ANSWER.unpack(message)[0]
            if number in self._pending:
                self._answers[number] = (message, fds)
            else:
                for fd in fds:
                    _close(fd)

    def abandon(self) -> None:
        """Make the request waiting for an answer, and every later one, fail at once (the
        pipeline is stopping; taken without the lock, which that request holds)."""
        self._abandoned = True

    def alive(self) -> bool:
        """Say whether the launcher still runs (once it has not: ``exit_code``)."""
        if self.exit_code is not None:
            return False
        return not self._exited()

    def _exited(self) -> bool:
        """Whether the launcher has exited; if it has, SIGKILL what is left of its process
        group (a worker's ``exec``'d children, marked or not), then reap it (``exit_code``).

        The group is ended before the launcher is reaped: until then its zombie holds the pid,
        so the group's id cannot have been taken by another process."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # reaped already
        if info is None:
            return False
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing left in it (or it could not make its group)
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid:
            self.exit_code = os.waitstatus_to_exitcode(status)
        return True

    def how_it_ended(self) -> str:
        """How the launcher ended, for a message (after ``alive()`` said it had): its exit
        status, and the last line of what it raised if it said so before it died."""
        with self._lock:
            reset = False
            while not self._closed:
                try:
                    message = self._socket.recv(_REPORT_BYTES, socket.MSG_DONTWAIT)
                except ConnectionResetError:
                    if reset:
                        break
                    reset = True
                    continue  # said once, before what it sent: see _take_answers()
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
            self._pending.clear()
            answers, self._answers = self._answers, {}
        for _, fds in answers.values():
            for fd in fds:
                _close(fd)
        deadline = time.monotonic() + timeout
        killed = False
        while True:
            if self.exit_code is not None or self._exited():
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
    try:
        # A group of its own (see the module's docs): the pipeline ends it when the launcher
        # is killed, and a kill of the training script's group leaves the launcher to clean up.
        os.setpgid(0, 0)
    except OSError:
        pass
    for signum in (signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, signal.SIG_IGN)  # a background group's terminal access
    if prefix is not None:
        os.environ[MARK] = prefix  # inherited by every process under it (see end_marked)
    _adopt_orphans()
    _give_back_free_heap()
    children: dict[int, tuple[int, int]] = {}  # pid -> where its exit status goes
    orphaned = False
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], _LOOP_S)
            _reap(children, statuses)
            _end_strays(children)
            if os.getppid() != parent:
                orphaned = True
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
        if orphaned and os.getpgid(0) == os.getpid():
            # Nobody is left to end the group: what the workers started in it, then itself.
            os.killpg(0, signal.SIGKILL)


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


def _give_back_free_heap() -> None:
    """Give the kernel back the heap memory the training process had freed but kept
    (glibc's ``malloc_trim(0)``), before any worker is forked from the launcher.

    A long-running training process's heap holds freed blocks, resident and mapped. A worker
    forked with them mapped reuses them for its own allocations: copies on write of pages it
    already maps, which its resident set does not show, so its memory read as its own stayed at
    0 MB however much it allocated (``agents.pipeline.Pipeline._inherited_rss``; 8 MB a worker
    unseen in a pytest process, whose heap had such holes). Given back, those pages are new
    ones in the worker, and counted; the launcher and every worker also hold less. Python's own
    small-object arenas are not glibc's to trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
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
