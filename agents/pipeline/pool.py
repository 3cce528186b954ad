"""The workers of one stage: start, retire, replace the dead, stop, and their counters.

A thread worker takes items from the stage's inbox itself. A process worker is fed by two
threads of the pipeline's process, one writing items to its pipe (at most ``DEPTH`` ahead
of its answers, so it never waits for its next item), one reading its answers into the next
stage's inbox. The pipeline keeps every item a process worker has not answered; if the
worker dies, those items go back to the head of the inbox for another worker, and the pool
starts a replacement. An item that kills ``max_item_retries + 1`` workers in a row is not
tried again: it reaches the consumer as the stage's failure.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import select
import signal
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psutil

from agents.pipeline.fusion import Chain
from agents.pipeline.inbox import Inbox
from agents.pipeline.stage import Stage
from agents.pipeline.worker import (
    BUSY_S,
    FIRST_OUTPUT_AT,
    FN_CPU_S,
    HEADER,
    ITEM,
    ITEMS,
    POLL_S,
    RETIRE,
    WIDTH,
    Encoded,
    Failure,
    WorkerSpec,
    encode,
    serve_thread,
)
from agents.pipeline.zygote import LauncherGone, Zygote

log = logging.getLogger("agents.pipeline")

# multiprocessing.Connection's framing of a message: its size, or -1 and a 64-bit size.
_SIZE = struct.Struct("!i")
_LARGE_SIZE = struct.Struct("!Q")
_READ_CHUNK = 1 << 20

# Items a process worker holds at once: the one it works on and the next, already in its pipe.
DEPTH = 2
# How long a worker's start waits for the launcher's answer, holding the pipeline's lock (as
# apply() and the monitor do), when no earlier request is still unanswered; past it, the start
# is finished by the monitor once the answer comes. A launcher stopped (SIGSTOP, swapped out)
# held each start up to the request's 10 s timeout, and apply() and the agent's metrics(),
# which wait for that lock, as long per worker asked for.
START_WAIT_S = 0.5
# Deaths in a row (times max_item_retries + 1) after which a stage's workers are taken to die
# whatever they get, and an item whose worker died is no longer tried again.
BROKEN_AFTER_DEATHS = 2


@dataclass(eq=False)
class WorkerHandle:
    """One running (or retiring) worker of a stage."""

    slot: int
    kind: str
    started_at: float
    retire: threading.Event = field(default_factory=threading.Event)
    # A thread worker
    thread: threading.Thread | None = None
    native_id: int | None = None
    # A process worker
    pid: int | None = None
    pidfd: int | None = None
    items: Connection | None = None
    results: Connection | None = None
    process: psutil.Process | None = field(default=None, repr=False)
    relays: list[threading.Thread] = field(default_factory=list)
    outstanding: deque = field(default_factory=deque)  # (seq, payload) sent, not answered
    cv: threading.Condition = field(default_factory=threading.Condition)
    ended: bool = False  # a process worker's result pipe reached its end
    # A process worker asked of the launcher, not answered yet: (the launcher, the request).
    pending: tuple[Zygote, int] | None = None
    launcher: Zygote | None = None  # the launcher that forked a started process worker

    def alive(self) -> bool:
        """Say whether the worker still runs (a process worker: its pipe is still open)."""
        if self.kind == "thread":
            return self.thread is not None and self.thread.is_alive()
        return not self.ended

    def signal(self, signum: int) -> None:
        """Send a signal to a process worker, to this very process (never a reused pid)."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signum)
            elif self.pid is not None:
                os.kill(self.pid, signum)
        except (ProcessLookupError, OSError):
            pass

    def exited(self) -> bool:
        """Say whether a process worker's process has exited (not merely closed its pipes)."""
        if self.pidfd is not None:
            ready, _, _ = select.select([self.pidfd], [], [], 0)
            return bool(ready)
        if self.process is None:
            return True
        try:
            return self.process.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def close(self) -> None:
        """Close the pipeline's ends of the worker's pipes and its pidfd."""
        for conn in (self.items, self.results):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None


class StagePool:
    """Keeps a stage's worker count at its target while the pipeline runs.

    Growing starts workers at once; shrinking sets the retire flag of the newest workers,
    which leave once they answered what they hold. Each worker owns one slot of a shared
    array of counters (items, busy seconds, time of first output); per-interval figures are
    differences of the sums, so they stay right across retirements.
    """

    def __init__(
        self,
        stage: Stage,
        index: int,
        inbox: Inbox,
        outbox: Inbox,
        context: Any,
        stop: threading.Event,
        pack_prefix: str | None,
        keep_heap: bool = True,
        max_item_retries: int = 2,
    ) -> None:
        self.stage = stage
        self.index = index
        self.inbox = inbox
        self.outbox = outbox
        self.stop_flag = stop
        self.pack_prefix = pack_prefix
        self.keep_heap = keep_heap
        self.max_item_retries = max_item_retries
        # Room for a full pool and as many retiring workers again, twice over.
        self.slots = 4 * stage.ceiling
        self.counters = context.RawArray("d", self.slots * WIDTH)
        # Exit status of each slot's last process worker (NaN: none yet), by the launcher.
        self.statuses = context.RawArray("d", self.slots)
        # A fused stage times each of its functions, in seconds per slot and function.
        self.parts = len(stage.fn.fns) if isinstance(stage.fn, Chain) else 0
        self.part_seconds = (
            context.RawArray("d", self.slots * self.parts) if self.parts > 1 else None
        )
        self.zygote: Zygote | None = None
        self.active: list[WorkerHandle] = []
        self.retiring: list[WorkerHandle] = []
        # Every worker whose threads (its own, or a process worker's relays) may still run:
        # until they end, the worker may still put items in the queues (``quiet()``).
        self.lingering: list[WorkerHandle] = []
        self.affinity: list[int] | None = list(stage.cpu_affinity) if stage.cpu_affinity else None
        self.deaths: dict[int, int] = {}  # seq -> workers that died on it
        self.died = 0  # process workers lost to a crash or a kill, over the pipeline's life
        # Workers that died since the stage last answered an item: past BROKEN_AFTER_DEATHS
        # of them, an item is not tried again on the next one (see _recover).
        self.deaths_in_a_row = 0
        self._worker_seconds = 0.0
        self._counted_at = time.monotonic()
        # The workers the stage was last sized to (resize()), those starting included: a
        # worker takes a second item only once that many hold one (see _feed).
        self.wanted = 0

    @property
    def target(self) -> int:
        """The worker count the stage runs at (retiring workers not included)."""
        return len(self.active)

    def spec(self, slot: int) -> WorkerSpec:
        """What the worker in ``slot`` runs with."""
        in_process = self.stage.kind == "process"
        return WorkerSpec(
            stage=self.stage.name,
            fn=self.stage.fn,
            counters=self.counters,
            slot=slot,
            pack_prefix=self.pack_prefix if in_process and self.stage.shared_memory else None,
            shm_min_bytes=self.stage.shm_min_bytes,
            keep_heap=self.keep_heap,
            init=self.stage.init,
            part_seconds=self.part_seconds,
            parts=self.parts,
        )

    def resize(self, count: int) -> list[int]:
        """Grow or shrink to ``count`` workers; return the slots of the workers started."""
        self._account()
        self.reap()
        self.wanted = count
        started = []
        while len(self.active) < count:
            started.append(self._start_worker().slot)
        while len(self.active) > count:
            worker = self.active.pop()
            self._retire(worker)
            self.retiring.append(worker)
        return started

    def maintain(self) -> list[WorkerHandle]:
        """Replace active process workers that died; forget retired ones that left.

        Returns the workers replaced."""
        if self.stop_flag.is_set():
            return []
        for worker in list(self.active):
            if worker.pending is not None:
                self._finish_start(worker, 0.0)
        self.reap()
        dead = [w for w in self.active if w.kind == "process" and w.ended]
        for worker in dead:
            self._account()
            self.active.remove(worker)
            self.retiring.append(worker)  # closed by reap() once its relays have left
        # The replacements wait for the launcher's answers START_WAIT_S in all, not each: the
        # monitor holds the pipeline's lock, and a launcher started again on a loaded host
        # answers slowly, so waiting up to START_WAIT_S per worker held the agent's metrics()
        # 4.4 s (the pipeline hunter's seed 90100, load 21). A start left unanswered is
        # finished by the next round (0.1 s later). Not without any wait: the waits are what
        # keeps the requests from outrunning the launcher (relayouts 20 times a second asked
        # for workers faster than it forked them, and a request's send then blocked).
        until = time.monotonic() + START_WAIT_S
        for _ in dead:
            self._start_worker(until)
        return dead

    def _retire(self, worker: WorkerHandle) -> None:
        self._cancel_start(worker)
        with worker.cv:
            worker.retire.set()
            worker.cv.notify_all()
        self.inbox.wake()

    def _free_slot(self) -> int:
        used = {w.slot for w in self.active} | {w.slot for w in self.retiring}
        for slot in range(self.slots):
            if slot not in used:
                return slot
        # Every slot belongs to a worker: share the oldest retiring one's (its counters are
        # sums, so they stay right; only its first-output time is overwritten).
        return self.retiring[0].slot

    def _start_worker(self, until: float | None = None) -> WorkerHandle:
        """Start a worker in a free slot; a process worker's start waits for the launcher's
        answer until ``until`` (monotonic; ``None``: ``START_WAIT_S`` from now)."""
        slot = self._free_slot()
        self.counters[slot * WIDTH + FIRST_OUTPUT_AT] = 0.0
        worker = WorkerHandle(slot, self.stage.kind, time.time())
        try:
            if self.stage.kind == "process":
                self._start_process(worker, until)
            else:
                spec = self.spec(slot)
                worker.thread = threading.Thread(
                    target=serve_thread,
                    args=(spec, self.inbox, self.outbox, lambda: self._leaving(worker)),
                    name=f"intune-{self.stage.name}-{slot}",
                    daemon=True,
                )
                worker.thread.start()
                worker.native_id = worker.thread.native_id
        except BaseException:
            self._abandon_start(worker)
            raise
        self.active.append(worker)
        self.lingering.append(worker)
        return worker

    def _abandon_start(self, worker: WorkerHandle) -> None:
        """A worker's start was cut midway: end it, and keep it where ``reap()``, ``quiet()``
        and ``shutdown()`` find it.

        ``apply()`` and ``relayout()`` start workers in the caller's thread, the main thread
        of a training script, where a Ctrl-C's ``KeyboardInterrupt`` (or a SIGTERM handler's
        ``SystemExit``) is raised wherever it is, ``Thread.start()`` included (it waits for
        the new thread to run). Cut between its two relays, a process worker had its feeding
        relay running and no reading one, and was in none of the pool's lists: it took two
        items, answered them into a pipe nobody read, and the ordered consumer waited for
        them for ever (the hunter, ``tests/agents/pipeline/hunt.py``: 1 run in 3 of one case;
        "'s0' 0 item(s) waiting, 2 worker(s); 's1' 0 ..." and no item for 25 s). Now the
        reading relay starts first (without it the feeding one never starts), and a start cut
        anywhere kills the worker: its reading relay, if it runs, puts back what it held."""
        self._cancel_start(worker)
        worker.signal(signal.SIGKILL)
        with worker.cv:
            worker.retire.set()
            if worker.kind == "process":
                worker.ended = True
            worker.cv.notify_all()
        self.retiring.append(worker)
        self.lingering.append(worker)

    def _start_process(self, worker: WorkerHandle, until: float | None = None) -> None:
        assert self.zygote is not None
        self.statuses[worker.slot] = math.nan
        request = {
            "stage_index": self.index,
            "slot": worker.slot,
            "affinity": self.affinity,
            "status_index": (self.index, worker.slot),
        }
        zygote = self.zygote
        try:
            number, items_fd, results_fd = zygote.request(request)
        except LauncherGone as exc:
            # Counted as a worker that died at once: the pipeline replaces the launcher.
            log.warning("stage '%s': could not start a worker: %s", self.stage.name, str(exc))
            worker.ended = True
            return
        os.set_blocking(items_fd, False)  # see _send()
        worker.items = Connection(items_fd, readable=False)
        worker.results = Connection(results_fd, writable=False)
        worker.pending = (zygote, number)
        # Wait for the answer only while the launcher keeps up: behind on an earlier request
        # (stopped, swapped out), it would hold the lock START_WAIT_S per worker.
        wait_s = START_WAIT_S if until is None else max(0.0, until - time.monotonic())
        self._finish_start(worker, 0.0 if zygote.behind(number) else wait_s)

    def _finish_start(self, worker: WorkerHandle, wait_s: float) -> None:
        """Take the launcher's answer for a pending worker (waiting up to ``wait_s``) and start
        its relays; leave it pending if none came. A launcher gone, or silent past its
        request's timeout, ends the worker (the monitor replaces it)."""
        assert worker.pending is not None
        zygote, number = worker.pending
        try:
            answer = zygote.answer(number, wait_s)
        except LauncherGone as exc:
            log.warning("stage '%s': could not start a worker: %s", self.stage.name, str(exc))
            worker.pending = None
            with worker.cv:
                worker.ended = True
                worker.cv.notify_all()
            return
        if answer is None:
            return
        worker.pending = None
        worker.pid, worker.pidfd = answer
        worker.launcher = zygote
        if wait_s == 0.0 and self.affinity and self.stage.kind == "process":
            try:  # pinned as the request asked; a re-plan may have come since
                os.sched_setaffinity(worker.pid, self.affinity)
            except (OSError, AttributeError):
                pass
        try:
            worker.process = psutil.Process(worker.pid)
        except psutil.Error:
            worker.process = None
        name = f"intune-{self.stage.name}-{worker.slot}"
        # The reader first: a feeder running without it loses what it sends (_abandon_start).
        worker.relays = [
            threading.Thread(target=self._read, args=(worker,), name=f"{name}-out", daemon=True),
            threading.Thread(target=self._feed, args=(worker,), name=f"{name}-in", daemon=True),
        ]
        for relay in worker.relays:
            relay.start()

    def _cancel_start(self, worker: WorkerHandle) -> None:
        """A pending worker retired or abandoned: forget its request and end it (the worker
        the launcher may still fork finds its item pipe closed once reaped, and leaves)."""
        pending, worker.pending = worker.pending, None
        if pending is None:
            return
        pending[0].forget(pending[1])
        with worker.cv:
            worker.ended = True
            worker.cv.notify_all()

    # ------------------------------------------------------------- a process worker's relays

    def _leaving(self, worker: WorkerHandle) -> bool:
        return worker.retire.is_set() or self.stop_flag.is_set() or worker.ended

    def _feed(self, worker: WorkerHandle) -> None:
        """Send items from the inbox to one process worker, ``DEPTH`` ahead of its answers,
        but a second one only while every worker of the stage holds one: items go to idle
        workers first, as torch's round-robin gives each worker one before any gets two.
        The first workers started took two each and left the last ones none: a dataset whose
        items wait for each other across workers (torch's test_worker_seed: a barrier of
        ``num_workers`` items) waited for ever, and a slow item held the next one back while
        a worker idled."""
        while True:
            with worker.cv:
                while (
                    len(worker.outstanding) >= DEPTH
                    or (worker.outstanding and self._a_worker_holds_none())
                ) and not self._leaving(worker):
                    worker.cv.wait(POLL_S)
            if self._leaving(worker):
                break
            try:
                seq, payload = self.inbox.get(POLL_S, leave=lambda: self._leaving(worker))
            except queue.Empty:
                continue
            except EOFError:
                break
            try:
                body = encode(payload)
            except Exception as exc:  # an item that cannot be pickled fails in this stage
                failure = Failure(
                    self.stage.name,
                    f"cannot send the item to a worker process: {type(exc).__name__}: {exc}",
                    "",
                )
                self.outbox.put((seq, failure))
                continue
            with worker.cv:
                if worker.ended:  # died meanwhile: its reader has already put its items back
                    self.inbox.put_front([(seq, payload)])
                    break
                worker.outstanding.append((seq, payload))
                first = len(worker.outstanding) == 1
            if first:
                self._wake_feeders(worker)  # one fewer worker holds none: see the wait above
            try:
                if not (self._send(worker, HEADER.pack(seq, ITEM)) and self._send(worker, body)):
                    break  # it died: its reader puts what it held back in the inbox
            except (OSError, TypeError, ValueError):
                # It died: its reader puts what it held back in the inbox. (TypeError and
                # ValueError: its pipe was closed under this send once it was found dead.)
                break
        if not worker.ended:
            try:
                self._send(worker, HEADER.pack(-1, RETIRE))
            except (OSError, TypeError, ValueError):
                pass

    def _a_worker_holds_none(self) -> bool:
        """Whether fewer of the stage's workers hold an item than it was sized to (a worker
        starting, or idle, holds none)."""
        holding = sum(1 for w in list(self.active) if w.outstanding and not self._leaving(w))
        return holding < self.wanted

    def _wake_feeders(self, taker: WorkerHandle) -> None:
        for other in list(self.active):
            if other is not taker:
                with other.cv:
                    other.cv.notify_all()

    @staticmethod
    def _send(worker: WorkerHandle, data: bytes) -> bool:
        """Write one message (``Connection.send_bytes``' framing) to the worker's item pipe;
        ``False`` if the worker ended before it all went.

        The pipe is non-blocking, and a full one is waited on ``POLL_S`` at a time: a worker
        killed while a process its function forked lives on leaves the pipe's read end open
        in that process, and a blocking write then never returned (the relay stayed, and a
        layout change waiting for its group to empty was refused for good)."""
        fd = worker.items.fileno()
        size = len(data)
        head = _SIZE.pack(size) if size <= 0x7FFFFFFF else _SIZE.pack(-1) + _LARGE_SIZE.pack(size)
        for piece in (head, data):
            view = memoryview(piece).cast("B")
            while view:
                try:
                    view = view[os.write(fd, view) :]
                    continue
                except BlockingIOError:
                    pass
                if worker.ended:
                    return False
                select.select([], [fd], [], POLL_S)
        return True

    def _read(self, worker: WorkerHandle) -> None:
        """Pass one process worker's answers to the next inbox until its pipe ends."""
        stopping = False
        try:
            while True:
                header = self._receive(worker)
                body = self._receive(worker) if header is not None else None
                if body is None:
                    break  # the worker's process exited
                seq, _ = HEADER.unpack(header)
                with worker.cv:
                    for k, (held, _) in enumerate(worker.outstanding):
                        if held == seq:
                            del worker.outstanding[k]
                            break
                    worker.cv.notify_all()
                self.deaths.pop(seq, None)
                self.deaths_in_a_row = 0
                if not stopping and not self.outbox.put((seq, Encoded(body))):
                    # The pipeline is stopping: drop the answers, but keep reading, so that
                    # the worker is never stuck sending one and leaves at once.
                    stopping = True
        except (EOFError, OSError):
            pass
        finally:
            with worker.cv:
                worker.ended = True
                lost = list(worker.outstanding)
                worker.outstanding.clear()
                worker.cv.notify_all()
        if self.stop_flag.is_set() or (worker.retire.is_set() and not lost):
            return
        self._recover(worker, lost)

    @classmethod
    def _receive(cls, worker: WorkerHandle) -> bytes | None:
        """One message from the worker's result pipe (``Connection.send_bytes``' framing), or
        ``None`` once the worker's process has exited and the pipe holds no more of it.

        End-of-file alone does not tell that a worker died: a process the stage's function
        forked (a ``multiprocessing`` helper, a ``Manager``, a bare ``os.fork``) holds the
        pipe's write end too, and outlives a worker killed by the OOM killer. A relay blocked
        in ``recv_bytes`` then never saw the death (nor, for a worker killed halfway through
        writing an answer, the rest of it), and the items the worker held never went to
        another worker: the consumer waited forever. So the relay reads only what the pipe
        has, and watches the process itself (its pidfd) between reads, every ``POLL_S``."""
        head = cls._receive_exactly(worker, 4)
        if head is None:
            return None
        (size,) = _SIZE.unpack(head)
        if size == -1:
            head = cls._receive_exactly(worker, 8)
            if head is None:
                return None
            (size,) = _LARGE_SIZE.unpack(head)
        return cls._receive_exactly(worker, size)

    @staticmethod
    def _receive_exactly(worker: WorkerHandle, size: int) -> bytes | None:
        """``size`` bytes of the result pipe; ``None`` if the worker's process exited first.
        Raises ``EOFError`` at the pipe's end."""
        fd = worker.results.fileno()
        chunks: list[bytes] = []
        while size > 0:
            watch = [fd] if worker.pidfd is None else [fd, worker.pidfd]
            ready, _, _ = select.select(watch, [], [], POLL_S)
            if fd not in ready:
                if not (worker.pidfd in ready or (worker.pidfd is None and worker.exited())):
                    continue
                # Exited: what it wrote before its death is still read and passed on.
                if fd not in select.select([fd], [], [], 0)[0]:
                    return None
            chunk = os.read(fd, min(size, _READ_CHUNK))
            if not chunk:
                raise EOFError("the worker's result pipe ended")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _recover(self, worker: WorkerHandle, lost: list[tuple[int, Any]]) -> None:
        """A process worker died: say how, and give what it held to the other workers."""
        self.died += 1
        how = self._how_it_ended(worker)
        if worker.launcher is not None and not worker.launcher.alive():
            # It died with its launcher (killed, or the OOM killer's pick), which says
            # nothing of its items or its stage: counted, a few launchers killed in a row
            # while their workers started failed every item as a stage that cannot work.
            log.warning(
                "stage '%s': worker pid %s %s with its launcher, holding %d item(s); "
                "they go to another worker", self.stage.name, worker.pid, how, len(lost),
            )  # fmt: skip
            self.inbox.put_front(lost)
            return
        self.deaths_in_a_row += 1
        if lost and self.deaths_in_a_row > BROKEN_AFTER_DEATHS * (self.max_item_retries + 1):
            # Every worker dies before it answers anything (a worker_init_fn that exits, a
            # library that crashes on import): retrying each item on max_item_retries more
            # workers cost 3 deaths per item, 0.5 to 3.5 s per batch on 2 busy cores (200
            # batches of a loop that skips failed ones: 50 s). Now each death fails the item
            # the worker was on; the first answer of the stage ends this.
            log.error(
                "stage '%s': %d workers died in a row without answering (the last %s); "
                "%d item(s) it held fail without a retry",
                self.stage.name, self.deaths_in_a_row, how, len(lost),
            )  # fmt: skip
            # Only the item it worked on: the others it held go on (one may be a loader's
            # end of epoch, which failed here, left its epoch endless).
            seq, _ = lost[0]
            self.deaths.pop(seq, None)
            failure = Failure(
                self.stage.name,
                f"WorkerDied: {self.deaths_in_a_row} workers of this stage died in a row "
                f"without answering an item (the last {how})",
                "",
            )
            self.outbox.put((seq, failure))
            self.inbox.put_front(lost[1:])
            return
        if lost:
            seq, _ = lost[0]  # the item it was working on
            self.deaths[seq] = self.deaths.get(seq, 0) + 1
            if self.deaths[seq] > self.max_item_retries:
                del self.deaths[seq]
                log.error(
                    "stage '%s': item %d killed %d workers (the last %s); not tried again",
                    self.stage.name,
                    seq,
                    self.max_item_retries + 1,
                    how,
                )
                failure = Failure(
                    self.stage.name,
                    f"WorkerDied: {self.max_item_retries + 1} workers died on this item "
                    f"(the last {how})",
                    "",
                )
                self.outbox.put((seq, failure))
                lost = lost[1:]
        log.warning(
            "stage '%s': worker pid %s %s holding %d item(s); they go to another worker",
            self.stage.name,
            worker.pid,
            how,
            len(lost),
        )
        self.inbox.put_front(lost)

    def _how_it_ended(self, worker: WorkerHandle, wait_s: float = 0.5) -> str:
        deadline = time.monotonic() + wait_s
        while math.isnan(self.statuses[worker.slot]) and time.monotonic() < deadline:
            time.sleep(0.01)
        status = self.statuses[worker.slot]
        if math.isnan(status):
            return "ended"
        if status < 0:
            name = signal.Signals(int(-status)).name if -status < signal.NSIG else "?"
            return f"was killed by signal {int(-status)} ({name})"
        return f"exited with code {int(status)}"

    # ------------------------------------------------------------- the rest

    def pin(self, cpus: list[int] | None) -> None:
        """Pin this stage's workers, now and future, to ``cpus`` (``None``: leave as is)."""
        if self.stage.cpu_affinity:
            cpus = list(self.stage.cpu_affinity)  # the stage's own choice wins
        self.affinity = cpus
        if not cpus or self.stage.kind != "process":
            return
        for worker in self.active:
            if worker.pid is None:
                continue
            try:
                os.sched_setaffinity(worker.pid, cpus)
            except (OSError, AttributeError):
                pass  # it exited meanwhile, or the platform cannot pin

    def quiet(self) -> bool:
        """Say whether the stage has no worker left that could still put an item anywhere
        (none active, and every former one's threads ended)."""
        if self.active:
            return False
        self.lingering = [
            w
            for w in self.lingering
            if any(t.is_alive() for t in ([w.thread] if w.thread is not None else w.relays))
        ]
        return not self.lingering

    def reap(self) -> None:
        """Forget retired workers that have left."""
        still = []
        for worker in self.retiring:
            # A relay thread may still be inside send_bytes() on the worker's item pipe (its
            # RETIRE, or an item it took before the worker died): closing the pipe under it
            # frees the descriptor's number for the next open() while the relay writes to it.
            if worker.alive() or any(relay.is_alive() for relay in worker.relays):
                still.append(worker)
            else:
                worker.close()
        self.retiring = still

    def first_outputs(self, slots: list[int]) -> list[float]:
        """The wall time each given slot's worker first produced an item (0.0: not yet)."""
        return [self.counters[s * WIDTH + FIRST_OUTPUT_AT] for s in slots]

    def totals(self) -> tuple[float, float]:
        """Items produced and busy seconds, summed over every worker this stage ever had."""
        # Strided slices of the shared array are copied in C: the agent asks every second.
        end = self.slots * WIDTH
        return sum(self.counters[ITEMS:end:WIDTH]), sum(self.counters[BUSY_S:end:WIDTH])

    def fn_cpu_total(self) -> float:
        """CPU seconds spent inside the stage's function, over every worker it ever had."""
        return sum(self.counters[FN_CPU_S : self.slots * WIDTH : WIDTH])

    def part_totals(self) -> list[float]:
        """A fused stage's seconds in each of its functions, summed over every worker it ever
        had (empty for a stage of one function)."""
        if self.part_seconds is None:
            return []
        end = self.slots * self.parts
        return [sum(self.part_seconds[k : end : self.parts]) for k in range(self.parts)]

    def _account(self) -> None:
        now = time.monotonic()
        self._worker_seconds += (now - self._counted_at) * len(self.active)
        self._counted_at = now

    def worker_seconds(self) -> float:
        """Seconds of worker time the stage had (its count integrated over time)."""
        self._account()
        return self._worker_seconds

    def processes(self) -> list[psutil.Process]:
        """The live worker processes (active and retiring), for CPU and memory figures."""
        return [
            w.process for w in self.active + self.retiring if w.process is not None and not w.ended
        ]

    def thread_ids(self) -> list[int]:
        """The native thread ids of a thread stage's workers."""
        return [w.native_id for w in self.active + self.retiring if w.native_id is not None]

    def shutdown(self, deadline: float, grace_s: float = 1.0) -> list[str]:
        """Stop every worker by ``deadline`` (monotonic): process workers are asked to leave,
        and killed if they have not within ``grace_s``. Returns what could not be stopped
        (threads stuck in the stage's function; a thread cannot be killed)."""
        workers = self.active + self.retiring
        self.active, self.retiring = [], []
        for worker in workers:
            self._retire(worker)
        for worker in workers:
            if worker.kind == "process" and worker.pid is None:
                worker.close()  # never started (its start was cut, or cancelled above)
        processes = [w for w in workers if w.kind == "process" and w.pid is not None]
        grace_end = min(deadline, time.monotonic() + grace_s)
        _wait_exited(processes, grace_end)
        for worker in processes:
            if not worker.exited():
                worker.signal(signal.SIGKILL)
        _wait_exited(processes, deadline + 1.0)
        for worker in processes:
            for relay in worker.relays:
                join_unless_current(relay, min(0.5, deadline + 1.0 - time.monotonic()))
            if not any(relay.is_alive() for relay in worker.relays):
                worker.close()
        stuck = []
        for worker in workers:
            if worker.kind == "thread" and worker.thread is not None:
                if join_unless_current(worker.thread, deadline - time.monotonic()):
                    stuck.append(worker.thread.name)
        return stuck


def join_unless_current(thread: threading.Thread, timeout_s: float) -> bool:
    """Join ``thread`` for at most ``timeout_s``; return whether it is still running.

    The thread calling is never joined (it would raise): a pipeline may be stopped from one
    of its own threads (a thread stage's function; the garbage collection of a dropped
    DataLoader, which runs in whichever thread allocates). It is not counted as stuck either:
    it is on its way out of the stop."""
    if thread is threading.current_thread():
        return False
    try:
        thread.join(max(0.0, timeout_s))
    except RuntimeError:
        # Never started: a worker's start cut before its relay started (_abandon_start).
        return False
    return thread.is_alive()


def _wait_exited(workers: list[WorkerHandle], deadline: float) -> None:
    """Wait until every worker's process has exited, or until ``deadline``."""
    while True:
        left = [w for w in workers if not w.exited()]
        remaining = deadline - time.monotonic()
        if not left or remaining <= 0:
            return
        fds = [w.pidfd for w in left if w.pidfd is not None]
        if fds:
            select.select(fds, [], [], min(remaining, 0.1))
        else:
            time.sleep(min(remaining, 0.02))
