"""The loops stage workers run: a process worker behind its own pipes, a thread worker.

Every item travels as ``(seq, payload)``. A process worker owns two private pipes to the
pipeline's process: items come in on one, results go out on the other, each as a small
header (the item's number and what follows) and a pickled body. Pipes that belong to one
worker alone are what make a worker expendable: when it dies (killed, out of memory, a crash
in native code) only its own pipes are torn, the pipeline sees end-of-file on them, and sends
the items it had not answered to another worker. A queue shared by several processes cannot
give that: a process killed while it holds the queue's lock, or halfway through a message,
leaves every other user of the queue waiting forever.

A thread worker takes items from its stage's inbox and puts results in the next one.

Either leaves only between items, so an item it took is answered, and its counters live in a
shared array the pipeline reads for metrics.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from agents.pipeline import heap, shm

# The signals a terminal (Ctrl-C, a closed terminal) or a ``kill -- -PGID`` sends to the whole
# process group (the launcher's group is its own now, see agents.pipeline.zygote; a scheduler
# may still signal every process of a job). Workers and their launcher ignore them: killed mid-transfer, a worker leaves
# its shared memory behind and the consumer waiting for its item. The pipeline's process
# decides what stops, and stops them (SIGKILL for a worker that will not leave).
GROUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# How long a waiting thread worker sleeps between looks at its retire and stop flags; a
# wait is also cut short by the inbox whenever a flag changes, so this only bounds a lapse.
POLL_S = 0.5

# Per-worker counters in the stage's shared array, at slot * WIDTH + field.
# FN_CPU_S: CPU seconds inside the stage's function alone (no unpickling, no packing): what a
# worker spends beyond it per item is its hand-off (tuner.layout).
ITEMS, BUSY_S, FIRST_OUTPUT_AT, FN_CPU_S, WIDTH = 0, 1, 2, 3, 4

# The header before every body on a worker's pipes: the item's number and what follows.
HEADER = struct.Struct("<qB")
ITEM, RETIRE = 0, 1


@dataclass
class Failure:
    """An item a stage (or the source) raised on; it flows on to the consumer, in order."""

    stage: str
    error: str
    traceback_text: str
    error_type: str = ""  # "module:qualname" of what was raised (error_type_name)
    source_seq: int = -1  # the failed item's number from the source (set by the collector)
    worker: int = -1  # the stage's worker (its slot) that raised, where one did


def error_type_name(exc: BaseException) -> str:
    """Where the type of ``exc`` lives, ``"module:qualname"``, so that a consumer can raise
    an error of that type (``agents.torch.DataLoader`` does, as torch does); a string, so
    that a type the consumer cannot import never makes the failure itself unreadable."""
    kind = type(exc)
    return f"{kind.__module__}:{kind.__qualname__}"


class Encoded(NamedTuple):
    """A payload still pickled, as a process worker sent it: relayed to the next process
    without being unpickled in between, and unpickled only where it is used."""

    data: bytes


def encode(payload: Any) -> bytes:
    """Pickle a payload for a worker's pipe (``Encoded`` payloads are passed through): so
    that it stands on its own, readable after its writer has gone (``shm.dumps``)."""
    if isinstance(payload, Encoded):
        return payload.data
    return shm.dumps(payload)


def decode(payload: Any, release: bool = True) -> Any:
    """The item a payload stands for: unpickled, its shared-memory buffers mapped back.

    With ``release`` the shared-memory file is given back at once; a process worker passes
    ``False`` and releases it only once its result is sent, so that an item whose worker
    died on it can be sent again, whole, to another worker.
    """
    if isinstance(payload, Encoded):
        payload = pickle.loads(payload.data)
    if isinstance(payload, shm.SharedPacket):
        return shm.unpack(payload, release=release)
    return payload


@dataclass
class WorkerSpec:
    """What one worker needs; the same object describes a process or a thread worker."""

    stage: str
    fn: Callable[[Any], Any]
    counters: Any  # shared array of doubles
    slot: int
    pack_prefix: str | None  # shared-memory prefix, or None to send results by pickle
    shm_min_bytes: int
    keep_heap: bool = True  # see agents.pipeline.heap
    init: Callable[[int], Any] | None = None  # the stage's per-worker setup, given the slot
    # A fused stage's per-function seconds, ``parts`` per slot (agents.pipeline.fusion.Chain)
    part_seconds: Any = None
    parts: int = 0
    fn_cpu_s: float = 0.0  # CPU seconds in fn since the last count (this worker's own)


def _apply(
    spec: WorkerSpec, payload: Any, release: bool, broken: Failure | None = None
) -> tuple[Any, Any]:
    """Run the stage on one payload; return the result (or a ``Failure``) and the input
    packet to release afterwards, if any. ``broken``: the worker's setup failed, and every
    item it takes fails with that error."""
    if isinstance(payload, Failure):
        return payload, None
    if broken is not None:
        if isinstance(payload, Encoded):
            payload = pickle.loads(payload.data)
        if isinstance(payload, shm.SharedPacket):
            if release:
                shm.free(payload)
                return broken, None
            return broken, payload
        return broken, None
    packet = None
    try:
        if isinstance(payload, Encoded):
            payload = pickle.loads(payload.data)
        if isinstance(payload, Failure):
            return payload, None
        if isinstance(payload, shm.SharedPacket):
            packet = None if release else payload
            payload = shm.unpack(payload, release=release)
        began = time.thread_time()
        if spec.part_seconds is not None:
            result = spec.fn.timed(payload, spec.part_seconds, spec.slot * spec.parts)
        else:
            result = spec.fn(payload)
        spec.fn_cpu_s += time.thread_time() - began
        if spec.pack_prefix is not None:
            result = shm.pack(result, spec.pack_prefix, spec.shm_min_bytes)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in fn is the stage's error too
        # KeyboardInterrupt too: workers ignore SIGINT (process) or never receive it (thread),
        # so here it can only come from fn; re-raised, it would end a thread worker silently
        # with its item in hand, and the ordered consumer would wait for that item forever.
        result = Failure(
            spec.stage,
            f"{type(exc).__name__}: {exc}",
            traceback.format_exc(),
            error_type_name(exc),
            worker=spec.slot,
        )
    return result, packet


def _setup(spec: WorkerSpec) -> Failure | None:
    """Run the stage's per-worker setup; a failure is returned, to fail every item with."""
    if spec.init is None:
        return None
    try:
        spec.init(spec.slot)
    except Exception as exc:
        return Failure(
            spec.stage, f"worker setup failed: {type(exc).__name__}: {exc}", traceback.format_exc()
        )
    return None


def _count(spec: WorkerSpec, busy_s: float) -> None:
    base = spec.slot * WIDTH
    spec.counters[base + BUSY_S] += busy_s
    spec.counters[base + FN_CPU_S] += spec.fn_cpu_s
    spec.fn_cpu_s = 0.0
    spec.counters[base + ITEMS] += 1
    if spec.counters[base + FIRST_OUTPUT_AT] == 0.0:
        spec.counters[base + FIRST_OUTPUT_AT] = time.time()


# ----------------------------------------------------------------------------- processes


def serve_process(spec: WorkerSpec, items_fd: int, results_fd: int) -> None:
    """A worker process's whole life: settle, then answer items until told to retire.

    It leaves when the pipeline sends ``RETIRE`` (after answering every item sent before
    it) or closes the item pipe; it never outlives the process it was started for (the
    launcher kills its workers when the pipeline's process dies, see ``zygote``).
    """
    from multiprocessing.connection import Connection

    items = Connection(items_fd, writable=False)
    results = Connection(results_fd, readable=False)
    _settle_process(spec)
    try:
        broken = _setup(spec)
        while True:
            try:
                seq, kind = HEADER.unpack(items.recv_bytes())
                if kind == RETIRE:
                    return
                body = items.recv_bytes()
            except (EOFError, OSError):
                return  # the pipeline closed the pipe, or its process is gone
            started = time.perf_counter()
            result, packet = _apply(spec, Encoded(body), release=False, broken=broken)
            busy = time.perf_counter() - started
            try:
                data = encode(result)
            except Exception as exc:  # an unpicklable result is the stage's error
                data = encode(
                    Failure(
                        spec.stage,
                        f"cannot send the result to the next stage: {type(exc).__name__}: {exc}",
                        traceback.format_exc(),
                    )
                )
            try:
                results.send_bytes(HEADER.pack(seq, ITEM))
                results.send_bytes(data)
            except OSError:
                return  # the pipeline stopped reading: it is stopping
            _count(spec, busy)
            if packet is not None:
                shm.free(packet)  # answered: the input's shared file may be reused
    finally:
        shm.release_pool()


def ignore_group_signals(in_children: bool = False) -> None:
    """Ignore ``GROUP_SIGNALS`` in this process (a worker, or the launcher); ``in_children``
    (the launcher, whose children are workers): in the processes it forks too.

    Ignored by a handler that does nothing, not ``SIG_IGN``, and put back to Python's defaults
    in what a worker forks: whatever the user's code in a worker starts (a
    ``multiprocessing.Pool``, a ``subprocess``) gets the signals as it would anywhere. With
    ``SIG_IGN``, which a forked child and an ``exec`` inherit, a ``Pool`` in ``__getitem__``
    hung its worker for ever (``Pool.terminate()`` SIGTERMs its processes and joins them:
    they ignored it) and left its processes behind when the pipeline stopped, unkillable by
    SIGTERM. An ``exec`` puts a handler back to the default by itself; a fork keeps it, so
    ``os.register_at_fork`` does it in the children of workers (``_block_group_signals`` and
    ``_restore_group_signals``: without a gap, see there). A worker's forks also die with
    the worker (``PR_SET_PDEATHSIG``), and what outlives a worker anyway is the launcher's
    to end (``agents.pipeline.zygote``)."""
    global _restore_in_children, _worker_main_thread, _worker_pid
    _restore_in_children = not in_children
    if _restore_in_children:
        _worker_main_thread, _worker_pid = threading.get_ident(), os.getpid()
    for signum in GROUP_SIGNALS:
        signal.signal(signum, _ignore_signal)


def _ignore_signal(signum: int, frame: Any) -> None:
    """``GROUP_SIGNALS``' handler in a worker or a launcher: nothing (see above)."""


# Whether a fork of this process puts GROUP_SIGNALS back to Python's defaults in the child
# (the hooks below, registered for every fork: they do nothing unless set).
_restore_in_children = False
# The worker's main thread: what it forks dies with the worker (PR_SET_PDEATHSIG fires when
# the thread that forked ends, so a fork from another thread would die with that thread).
_worker_main_thread: int | None = None
_worker_pid = 0
# The group signals the forking thread had blocked itself before the fork, by thread.
_blocked_before: dict[int, set[int]] = {}
_PR_SET_PDEATHSIG = 1


def _block_group_signals() -> None:
    """Before a worker forks: hold ``GROUP_SIGNALS`` in the forking thread, so that one sent
    to the child before it has put the defaults back waits in the kernel, not lost.

    Without it, a signal that reached the child before ``_restore_group_signals`` ran went to
    the inherited handler that does nothing (or was dropped by Python's own after-fork
    reset): a ``Pool`` in ``__getitem__``, its second process not yet scheduled on a busy
    host when ``Pool.__exit__`` SIGTERMed it, kept that process alive, waiting on the
    pool's task-queue lock (``Pool.terminate`` holds it), and ``terminate`` joined it for
    ever: the epoch hung (1 run of 8 beside two busy loops, 2026-11-24)."""
    if not _restore_in_children:
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    _blocked_before[threading.get_ident()] = {int(s) for s in held} & {
        int(s) for s in GROUP_SIGNALS
    }


def _unblock_group_signals() -> None:
    """Let the forking thread have the group signals again (what it had not blocked itself)."""
    already = _blocked_before.pop(threading.get_ident(), None)
    if already is None:
        return
    release = [s for s in GROUP_SIGNALS if int(s) not in already]
    if release:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, release)


def _restore_group_signals() -> None:
    """In what a worker forks: Python's defaults for ``GROUP_SIGNALS``, then the signals
    let in (one that came meanwhile is acted on now, by the default); death with the worker
    for a fork of its main thread."""
    global _restore_in_children
    if not _restore_in_children:
        return
    _restore_in_children = False  # the child's own forks are its business again
    forked_by_main = threading.get_ident() == _worker_main_thread
    try:
        for signum in GROUP_SIGNALS:
            try:
                if signal.getsignal(signum) is _ignore_signal:
                    signal.signal(
                        signum,
                        signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL,
                    )
            except (ValueError, OSError):  # pragma: no cover - forked from a thread: not main
                pass
        if forked_by_main:
            die_with_parent(_worker_pid)
    finally:
        _unblock_group_signals()


def die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when ``parent``, the process that forked it,
    dies (Linux; elsewhere nothing), and die now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:  # it died before the prctl: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


os.register_at_fork(
    before=_block_group_signals,
    after_in_parent=_unblock_group_signals,
    after_in_child=_restore_group_signals,
)


def _settle_process(spec: WorkerSpec) -> None:
    """Prepare a freshly forked worker process: signals, threads and heap (its launcher has
    pinned its CPUs, agents/pipeline/zygote.py)."""
    ignore_group_signals()
    torch = sys.modules.get("torch")
    if torch is not None:
        # As DataLoader does: one intra-op thread per worker, or workers fight over the cores.
        torch.set_num_threads(1)
    if spec.keep_heap:
        heap.keep_freed_memory()


# ----------------------------------------------------------------------------- threads


def serve_thread(spec: WorkerSpec, inbox: Any, outbox: Any, leave: Callable[[], bool]) -> None:
    """A thread worker: take items from ``inbox`` and put results in ``outbox`` until
    ``leave()`` (retired or stopped) or the inboxes close."""
    broken = _setup(spec)
    while not leave():
        try:
            seq, payload = inbox.get(timeout=POLL_S, leave=leave)
        except queue.Empty:
            continue
        except EOFError:
            return
        started = time.perf_counter()
        result, _ = _apply(spec, payload, release=True, broken=broken)
        busy = time.perf_counter() - started
        if not outbox.put((seq, result)):
            return  # closed: the pipeline is stopping
        _count(spec, busy)
