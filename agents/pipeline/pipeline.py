"""The pipeline: a source, stages joined by bounded queues, and the consumer's iterator."""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil

from agents.pipeline import shm
from agents.pipeline.errors import (
    AllocationError,
    LauncherFailed,
    LayoutBusy,
    PipelineStalled,
    PipelineStopped,
    StageFailed,
)
from agents.pipeline.fusion import SEPARATOR, Span, boundaries, fuse, layout_spans
from agents.pipeline.inbox import Inbox
from agents.pipeline.pool import StagePool, join_unless_current
from agents.pipeline.schedstat import process_runqueue_seconds, thread_runqueue_seconds
from agents.pipeline.signals import Held, deferred
from agents.pipeline.stage import Stage
from agents.pipeline.worker import POLL_S, Failure, decode, error_type_name, serve_process
from agents.pipeline.zygote import Zygote

log = logging.getLogger("agents.pipeline")

_END = object()  # the collector's mark that the source is exhausted and everything delivered
_INTERRUPTED = object()  # _take's answer when a Ctrl-C came while the consumer waited

# How long the consumer's wait lasts before it looks whether a Ctrl-C is being held.
_CONSUMER_SLICE_S = 0.1

# How often the pipeline replaces dead workers (and a dead launcher).
_MONITOR_S = 0.1
# Launchers in a row that may die before they start a worker (a crash at their start): the
# second starts at once (the first may have been killed), the next after 0.2, 0.4 and 0.8 s;
# then the consumer gets LauncherFailed rather than a launcher started again for ever.
LAUNCHER_STARTS = 5
_LAUNCHER_BACKOFF_S = 0.2


class _Items:
    """A consumer's iterator over a pipeline (``Pipeline.__iter__``): each ``next()`` takes
    one item; an exception it raises (a stage's failure, a Ctrl-C) does not end it."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> Any:
        return self._pipeline._next_item()


@dataclasses.dataclass
class _Flow:
    """What the source thread tells the collector: the number of items, once all are read."""

    total: int | None = None


# The pipelines started and not yet stopped in this process (a stop under way included),
# stopped at its exit (below).
_RUNNING: weakref.WeakSet[Pipeline] = weakref.WeakSet()
# The threads that run torch or user code (the source, the collector that rebuilds the
# results' tensors), or that may drop the last reference to a tensor (a stop's own thread,
# which holds what it stops until it ends), waited for at exit (below).
_CODE_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
# How long the interpreter's exit waits for those threads, all together, once stopped.
EXIT_JOIN_S = 2.0
# Set as the exit's stop begins (under the lock): a stop asked for from then on runs in the
# caller's thread, never in a new one the exit would not wait for.
_exit_lock = threading.RLock()
_exiting = False


def exiting() -> bool:
    """Whether the interpreter's exit has begun stopping the pipelines (or finalizing)."""
    return _exiting or sys.is_finalizing()


def joined_at_exit(thread: threading.Thread) -> bool:
    """Have the interpreter's exit wait for ``thread`` (not yet started; bounded, with the
    pipelines' own threads); ``False`` once the exit has begun: then run its work in place.

    For a daemon thread that runs torch code or may drop the last reference to a tensor: one
    still doing so once the teardown has begun is ended by ``pthread_exit`` inside torch's
    C++ code (a tensor's dealloc lets the GIL go and takes it back), and the process aborts
    ("terminate called without an active exception", exit status 134)."""
    with _exit_lock:
        if exiting():
            return False
        _CODE_THREADS.add(thread)
        return True


def in_thread_joined_at_exit(target: Callable[[], None], name: str) -> None:
    """Run ``target`` in a daemon thread the interpreter's exit waits for, or in this thread
    once the exit has begun (``joined_at_exit``)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    if joined_at_exit(thread):
        thread.start()
    else:
        target()


@atexit.register
def _stop_running() -> None:
    """Stop the pipelines still running when the interpreter exits, while their threads still
    run: later, at the interpreter's teardown, its daemon threads are frozen, and a pipeline
    collected then (a training loop ended by Ctrl-C: the traceback holds its iterator until
    then) waited out its whole stop bound for relays that could no longer move; a training
    script took 2 to 5 s to exit after Ctrl-C, now about 1 s.

    A stop under way in another thread (a loader's epoch left by ``break`` is stopped in a
    thread of its own) is waited for, and so are the threads that rebuild tensors: a daemon
    thread that comes back from torch's C++ code (which lets the GIL go) once the teardown
    has begun is ended by ``pthread_exit`` inside it, and the process aborted ("terminate
    called without an active exception", exit status 134) in 1 run in 8 of a script whose
    last epoch ended with ``break``; torch's loader runs no such thread.

    A child forked from the training process (``os.fork()``, left by ``sys.exit``) holds
    copies of its parent's running pipelines: ``stop()`` leaves those alone (it killed the
    parent's workers and removed their shared memory: the parent's epoch failed).

    A stop's own thread (a loader's epoch left by ``return``, a pipeline collected) is waited
    for too: as it ends it drops the last reference to what it stopped (the loader, its
    generator states' tensors; the pipeline), and a tensor freed once the teardown had begun
    aborted the process so in 2 runs of 99 of a script returning from its loop
    (``tests.agents.torch.exit_hunt``). From here on a stop runs in the thread that asks for
    it (``joined_at_exit``)."""
    global _exiting
    with _exit_lock:
        _exiting = True
    for pipeline in list(_RUNNING):
        try:
            pipeline.stop()
        except Exception:  # noqa: BLE001 - every other pipeline is still stopped
            log.exception("pipeline '%s' could not be stopped at exit", pipeline.name)
    deadline = time.monotonic() + EXIT_JOIN_S
    for thread in list(_CODE_THREADS):
        join_unless_current(thread, max(0.0, deadline - time.monotonic()))


def anonymous_memory(memory: Any) -> float:
    """A process's resident memory (``psutil``'s ``memory_info()``) less its pages of files and
    shared memory (Linux's statm ``shared``; the whole resident set where the system does not
    say): what a worker holds of its own once what it inherited is taken off."""
    return float(memory.rss - getattr(memory, "shared", 0))


Readings = dict[tuple[str, int], tuple[float, float]]


def _runqueue_or_before(seen: Readings, key: tuple[str, int], seconds: float | None) -> float:
    # Not said this time: no growth, rather than all of it at the next reading.
    return seen.get(key, (0.0, 0.0))[1] if seconds is None else seconds


def process_readings(
    processes: Iterable[psutil.Process], seen: Readings, inherited: float
) -> tuple[Readings, float]:
    """Each process's CPU seconds and run-queue seconds now, keyed ``("p", pid)`` (``seen``:
    the previous readings), and the memory they hold of their own, in bytes: each one's
    anonymous memory less ``inherited``, what it maps of the process it was forked from. A
    process gone meanwhile is left out."""
    current: Readings = {}
    rss = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            rss += max(0.0, anonymous_memory(process.memory_info()) - inherited)
        except psutil.Error:
            continue
        key = ("p", process.pid)
        delay = _runqueue_or_before(seen, key, process_runqueue_seconds(process.pid))
        current[key] = (times.user + times.system, delay)
    return current, rss


def usage_since(seen: Readings, current: Readings) -> tuple[float, float]:
    """CPU and run-queue seconds from the readings ``seen`` to ``current``; a worker not seen
    before started since: all its time is new."""
    cpu_s = runqueue_s = 0.0
    for key, (cpu, runqueue) in current.items():
        cpu_before, runqueue_before = seen.get(key, (0.0, 0.0))
        cpu_s += cpu - cpu_before
        runqueue_s += runqueue - runqueue_before
    return max(cpu_s, 0.0), max(runqueue_s, 0.0)


class Pipeline:
    """A live-resizable pipeline: ``source -> stage 1 -> ... -> stage n -> consumer``.

    ``source`` is an iterable, or a callable that returns one. Every item is numbered at the
    source; when every stage is ``ordered`` the consumer gets items in source order, whatever
    the worker counts and however often they change. ``apply()`` resizes stages while items
    flow: workers are added at once, removed after the items they hold; nothing is lost or
    repeated. A process worker that dies (killed, out of memory) is replaced, and the items
    it held go to another worker. Iterate the pipeline to consume it; the time spent inside
    ``next()`` is the consumer's "waiting for input".

    Every wait has a bound: ``stop()`` returns within ``stop_timeout_s`` plus a second
    whatever the workers are doing (process workers that do not leave are killed), and
    leaves no process or shared-memory file behind. A pipeline that nothing refers to any
    more (built per epoch and only iterated) is stopped when it is collected; ``with`` or
    ``stop()`` stops it at a moment of your choosing.

    - ``queue_size``: capacity of each queue between stages (items).
    - ``prefetch``: items the pipeline keeps ready for the consumer (default ``queue_size``).
    - ``pin_cpus``: ``True`` pins each stage's workers to cores of their own (from the cores
      this process may use), re-planned at each ``apply()``; a list of CPU ids pins to those.
    - ``samples_per_item``: samples in one item (a batch's size), for samples/s figures.
    - ``start_method``: only ``"fork"`` (or ``None``): worker processes are forked from a
      launcher process the pipeline forks when it starts (see ``agents.pipeline.zygote``).
    - ``keep_worker_heap``: worker processes reuse the memory they free rather than map it
      afresh for every item (``agents.pipeline.heap``); ``False`` keeps the allocator's
      defaults.
    - ``max_item_retries``: how many times an item whose worker died is sent to another
      worker before it fails, as the stage's error.
    - ``stop_timeout_s``: how long ``stop()`` lets workers finish before it kills them.
    - ``layout``: which neighbouring stages run fused, as for ``fuse_groups``
      (``"read+parse,transform+collate"``); ``relayout()`` changes it live.
    - ``item_timeout_s``: the longest the consumer waits for one item before the iterator
      raises ``PipelineStalled`` (as DataLoader's ``timeout``); ``None`` (default) waits on.
    - ``stall_warning_s``: while the consumer has waited this long for an item, and again
      every as long, the pipeline logs a warning saying where the items stand, stage by stage
      (a function that blocks forever is found in the log, not by attaching a debugger).
    """

    def __init__(
        self,
        source: Iterable[Any] | Callable[[], Iterable[Any]],
        stages: list[Stage],
        queue_size: int = 8,
        name: str = "pipeline",
        prefetch: int | None = None,
        pin_cpus: bool | list[int] = False,
        samples_per_item: int = 1,
        start_method: str | None = None,
        keep_worker_heap: bool = True,
        max_item_retries: int = 2,
        stop_timeout_s: float = 2.0,
        layout: str | Iterable[str | list[str]] | None = None,
        item_timeout_s: float | None = None,
        stall_warning_s: float | None = 60.0,
    ) -> None:
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        names = [s.name for s in stages]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"stage names must be unique; repeated: {', '.join(duplicates)}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        if start_method not in (None, "fork"):
            raise ValueError(
                f"start_method={start_method!r}: worker processes are forked from the "
                "pipeline's launcher process; use None or 'fork'"
            )
        if any(s.kind == "process" for s in stages) and not hasattr(os, "fork"):
            raise ValueError("process stages need os.fork (Linux or macOS); use kind='thread'")
        if max_item_retries < 0:
            raise ValueError(f"max_item_retries must be 0 or more, got {max_item_retries}")
        # A prefetch below 1 left the collector no room for any item: the consumer waited for
        # ever; a negative stop_timeout_s named the pipeline's own threads as stuck in user code.
        if prefetch is not None and (
            isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1
        ):
            raise ValueError(
                f"prefetch must be a whole number of 1 or more (or None), got {prefetch!r}"
            )
        if not stop_timeout_s >= 0:
            raise ValueError(f"stop_timeout_s must be 0 or more, got {stop_timeout_s!r}")
        for option, value in (
            ("item_timeout_s", item_timeout_s),
            ("stall_warning_s", stall_warning_s),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{option} must be above 0 (or None), got {value!r}")
        self.source = source
        # The stages as written; the layout groups neighbours of them into the stages that run.
        self.units = list(stages)
        self.unit_names = names
        self._spans: list[Span] = layout_spans(names, layout)
        self.stages = [self._group_stage(span) for span in self._spans]
        self.stage_names: list[str] = [s.name for s in self.stages]
        self.queue_size = queue_size
        self.prefetch = prefetch or queue_size
        self.name = name
        self.pin_cpus = pin_cpus
        self.samples_per_item = samples_per_item
        self.keep_worker_heap = keep_worker_heap
        self.max_item_retries = max_item_retries
        self.stop_timeout_s = stop_timeout_s
        self.item_timeout_s = item_timeout_s
        self.stall_warning_s = stall_warning_s
        self.ordered = all(s.ordered for s in stages)
        self._boundaries: dict[int, Inbox] = {}  # the queue at each place the layout has one
        self._all_pools: list[StagePool] = []  # one per possible group, made before the fork
        self._pool_of: dict[Span, StagePool] = {}
        self._draining: list[list[StagePool]] = []  # groups of a former layout, emptying
        self._context = multiprocessing.get_context("fork" if hasattr(os, "fork") else None)
        self._targets = {s.name: s.workers for s in self.stages}
        self._lock = threading.RLock()
        self._stop_lock = threading.Lock()  # one stop() at a time, to its end
        self._started = False
        self._stopped = False
        self._pools: list[StagePool] = []
        self._inboxes: list[Inbox] = []
        self._zygote: Zygote | None = None
        self._launcher_deaths = 0  # launchers in a row that died before starting a worker
        self._launcher_retry_at = 0.0  # when the next launcher may start (monotonic)
        self._launcher_counted = 0  # the dead launcher already counted (its pid)
        self._failed: LauncherFailed | None = None  # the pipeline cannot go on: why
        self._prefix = f"intune-{uuid.uuid4().hex[:10]}"
        self._last_resize: dict[str, Any] | None = None
        self._flow = _Flow()  # what the source thread tells the collector
        self._stats_lock = threading.Lock()
        self._taken = 0
        self._waiting_since: float | None = None
        self._reset_consumer_counters(time.monotonic())
        self._metrics_at = time.monotonic()
        self._last_totals: dict[str, tuple[float, float, float]] = {}
        self._last_parts: dict[str, list[float]] = {}
        self._last_fn_cpu: dict[str, float] = {}
        # Per stage: each worker's (CPU seconds, run-queue seconds) at the last call, to take
        # differences; a worker seen for the first time started from zero.
        self._usage_seen: dict[str, dict[tuple[str, int], tuple[float, float]]] = {}
        # The launcher's process and its last resident set (see _inherited_rss).
        self._launcher_process: psutil.Process | None = None
        self._launcher_rss = 0.0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._ended = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Pipeline:
        """Start the workers, the source feeder and the collector; return the pipeline.

        A Ctrl-C meanwhile is held until it is done (``agents.pipeline.signals``): a start cut
        halfway would leave a launcher forked and no thread to end it."""
        with deferred(), self._lock:
            if self._started:
                return self
            if self._stopped:
                raise RuntimeError(f"pipeline '{self.name}' was stopped; build a new one")
            self._started = True
            # One inbox in front of each stage, and one in front of the consumer.
            self._boundaries = {b: Inbox(self.queue_size) for b in boundaries(self._spans)}
            self._ready = Inbox(self.prefetch)
            use_shm = shm.available()
            # A pool for every group of neighbouring stages a layout may have, made now: the
            # launcher forked below knows only what exists before it (their functions, their
            # shared counters), and ``relayout()`` must not fork another while threads run.
            n = len(self.units)
            for i in range(n):
                for j in range(i + 1, n + 1):
                    pool = StagePool(
                        self._group_stage((i, j)),
                        len(self._all_pools),
                        self._boundaries.get(i),
                        self._boundaries.get(j),
                        self._context,
                        self._stop,
                        self._prefix if use_shm else None,
                        self.keep_worker_heap,
                        self.max_item_retries,
                    )
                    self._all_pools.append(pool)
                    self._pool_of[(i, j)] = pool
            self._use_layout(self._spans)
            # The launcher is forked before the pipeline runs any thread of its own.
            self._start_launcher()
            self._plan_pinning(self._targets)
            for pool in self._pools:
                pool.resize(self._targets[pool.stage.name])
            now = time.monotonic()
            self._metrics_at = now
            self._reset_consumer_counters(now)
            me = weakref.ref(self)
            self._owner_pid = os.getpid()
            self._threads = [
                threading.Thread(
                    target=_feed, args=(me, self._flow), name=f"{self.name}-source", daemon=True
                ),
                threading.Thread(
                    target=_collect,
                    args=(me, self._flow, self._stop),
                    name=f"{self.name}-collect",
                    daemon=True,
                ),
                threading.Thread(
                    target=_monitor, args=(me, self._stop), name=f"{self.name}-monitor", daemon=True
                ),
            ]
            for thread in self._threads:
                thread.start()
            source, collector, _ = self._threads
            _CODE_THREADS.update((source, collector))
            _RUNNING.add(self)
        return self

    def _start_launcher(self) -> None:
        if not any(pool.stage.kind == "process" for pool in self._all_pools):
            return

        def serve(request: dict[str, Any], items_fd: int, results_fd: int) -> None:
            pool = self._all_pools[request["stage_index"]]
            serve_process(pool.spec(request["slot"]), items_fd, results_fd)

        zygote = Zygote(serve, [pool.statuses for pool in self._all_pools], self._prefix)
        self._zygote = zygote
        for pool in self._all_pools:
            pool.zygote = zygote

    def stop(self) -> None:
        """Stop every worker and thread, drop what is in flight; leaves no process behind.

        Returns within ``stop_timeout_s`` plus about a second, whatever the workers are
        doing; a thread worker stuck in the stage's function is left running (a thread
        cannot be killed) and named in a warning.

        In a child forked from the process that started it, it does nothing: the workers,
        launcher and shared memory are that process's. A child leaving a ``with pipeline:``
        block (``sys.exit()`` after ``os.fork()``) killed them through inherited pidfds and
        removed the files in flight, and the parent's loop failed.
        """
        if getattr(self, "_owner_pid", os.getpid()) != os.getpid():
            return
        with deferred(), self._stop_lock:
            # Before the lock: an apply() or a worker's replacement holds it while it waits
            # for the launcher to fork a worker, up to 10 s a worker for one that does not
            # answer (stopped, swapped out); a stop waited behind them all (62 s, 3 workers).
            zygote = self._zygote
            if self._started and zygote is not None:
                zygote.abandon()
            with self._lock:
                if not self._started or self._stopped:
                    self._stopped = True
                    return
                self._stopped = True
                self._stop.set()
                deadline = time.monotonic() + self.stop_timeout_s
                draining = [p.inbox for pools in self._draining for p in pools[1:]]
                for inbox in [*self._inboxes, *draining, self._ready]:
                    inbox.close()
                stuck = []
                for pool in self._all_pools:
                    stuck += pool.shutdown(deadline)
            # Joined without the lock: the monitor takes it to look at the pools, and waited
            # for it here until the join gave up (0.5 s lost, and the monitor named as a
            # thread stuck in user code).
            # join_unless_current: stop() from one of the pipeline's own threads raised on
            # joining itself, and left the launcher and its workers running.
            # The monitor runs no user code, and once the stop has held the lock it can only
            # see the stop and return: joined as the others, never named as stuck. On a loaded
            # host it was not scheduled within the join, and the script's stderr said it was
            # "still inside user code" (the parity hunter at load 16, seed 2425).
            monitor = self._threads[2] if len(self._threads) == 3 else None
            stuck += [
                t.name
                for t in self._threads
                if join_unless_current(t, min(0.5, deadline - time.monotonic()))
                and t is not monitor
            ]
            if self._zygote is not None:
                self._zygote.close()
            shm.sweep(self._prefix)
            shm.forget(self._prefix)
            # Only now: until its stop is done, the interpreter's exit waits for it (above).
            _RUNNING.discard(self)
        if stuck:
            log.warning(
                "pipeline '%s' stopped, leaving %d thread(s) still inside user code: %s",
                self.name,
                len(stuck),
                ", ".join(stuck),
            )

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(
        self,
        _getpid: Callable[[], int] = os.getpid,
        _finalizing: Callable[[], bool] = sys.is_finalizing,
    ) -> None:
        # (Both bound now: one collected at the interpreter's teardown finds this module's
        # ``os`` and ``sys`` None.)
        # A pipeline nobody can reach any more stops, as torch's DataLoader iterators end their
        # workers: one built per epoch and only iterated (no ``with``, no ``stop()``) kept its
        # launcher, its workers and its threads until the interpreter's exit, 3 processes and
        # 5 threads more every epoch. Its threads hold it only weakly (``_feed`` and the rest)
        # so that it can be collected at all.
        if _getpid() != getattr(self, "_owner_pid", None):
            return  # a copy in a forked launcher or worker: the pipeline is not its to stop
        if not getattr(self, "_started", False) or getattr(self, "_stopped", True):
            return
        if _finalizing():
            return  # atexit stopped it already; no thread may start now
        # In a thread of its own: a collection runs wherever an allocation triggers it, and
        # a stop's waits there (another pipeline's start, a lock held) hold that caller up.
        # Joined at exit: it drops this pipeline, and the tensors in it, as it ends.
        in_thread_joined_at_exit(self.stop, f"{self.name}-collected")

    def _monitor_once(self) -> bool:
        """Replace dead workers, and the launcher if it died; ``False`` once stopping."""
        with self._lock:
            if self._stop.is_set():
                return False
            if self._zygote is not None and not self._zygote.alive():
                if not self._replace_launcher():
                    return True  # none yet (a wait between tries), or none any more
            for pool in self._pools:
                pool.maintain()
            self._drain()
        return True

    def _replace_launcher(self) -> bool:
        """The launcher died: start another (the lock held); ``False`` while none runs.

        One that dies before it has started a worker (an exception in its first steps, a
        kill at its start) is tried again after a growing wait, ``LAUNCHER_STARTS`` times in
        all; then the consumer gets ``LauncherFailed`` naming how the last one ended. Before,
        such a launcher was started again every 0.1 s for ever, and the consumer waited for
        items no worker would ever make."""
        zygote = self._zygote
        assert zygote is not None
        if self._failed is not None:
            return False
        if zygote.pid != self._launcher_counted:
            self._launcher_counted = zygote.pid
            how = zygote.how_it_ended()
            if zygote.started_workers:
                self._launcher_deaths = 0  # it had worked: a kill, not a crash at start
            self._launcher_deaths += 1
            if self._launcher_deaths >= LAUNCHER_STARTS:
                self._failed = LauncherFailed(
                    f"pipeline '{self.name}': its worker launcher died before starting a "
                    f"worker {self._launcher_deaths} times in a row (the last {how}); no "
                    "worker can start, so no item will come. Look at what the launcher "
                    "runs first (the pipeline's process at start: at-fork hooks, memory "
                    "limits)"
                    + (
                        f"\n--- traceback in the launcher ---\n{zygote.crash}"
                        if zygote.crash
                        else ""
                    )
                )
                log.error("%s", str(self._failed))
                zygote.close()
                self._ready.wake()
                return False
            wait = _LAUNCHER_BACKOFF_S * 2 ** (self._launcher_deaths - 2)
            self._launcher_retry_at = time.monotonic() + (wait if self._launcher_deaths > 1 else 0)
            log.warning(
                "pipeline '%s': the worker launcher (pid %d) %s; starting another%s",
                self.name,
                zygote.pid,
                how,
                f" in {wait:.1f} s" if self._launcher_deaths > 1 else "",
            )
        if time.monotonic() < self._launcher_retry_at:
            return False
        zygote.close()
        self._start_launcher()
        return True

    def _cannot_read(self, exc: Exception) -> Failure:
        # Of the type unpickling raised: torch's loader raises it as it is, from the queue's
        # get in the training process.
        return Failure(
            self.stage_names[-1],
            f"cannot read the result: {type(exc).__name__}: {exc}",
            traceback.format_exc(),
            error_type_name(exc),
        )

    def __iter__(self) -> Iterator[Any]:
        """Yield the last stage's results; raises ``StageFailed`` where a stage raised, and
        ``PipelineStopped`` where the pipeline was stopped before the source's end.

        The iterator outlives what it raises: after a ``StageFailed`` or a Ctrl-C's
        ``KeyboardInterrupt`` caught by the caller, its next ``next()`` goes on with the next
        item, as a DataLoader's iterator does. (A generator ends at the first exception out
        of it: a training loop that caught a Ctrl-C in ``next(it)`` and went on got
        ``StopIteration``, an epoch ended early without a word, and
        ``agents.torch.DataLoader`` raised ``PipelineStopped`` for a pipeline still
        running.)"""
        return _Items(self)

    def _next_item(self) -> Any:
        """The next item for a consumer (``_Items``), ``StopIteration`` at the source's end."""
        if not self._started:
            self.start()
        if self._owner_pid != os.getpid():
            # A forked child's copy: the threads that fill it are its parent's, so a loop
            # here waited for ever.
            raise RuntimeError(
                f"pipeline '{self.name}' was started in process {self._owner_pid}; a child "
                "forked from it cannot take its items: build and start a pipeline in the child"
            )
        if self._ended:
            # Exhausted already: a second loop over the pipeline ends at once instead of
            # waiting for items that will never come. (After a StageFailed, looping again
            # goes on with the items after the failed one, as DataLoader's iterator does.)
            raise StopIteration
        while True:
            # Ctrl-C is held from the take to the count: raised in between, it lost the item
            # taken (a loop run again, as in a notebook, missed it, or waited for good for an
            # epoch's end it had dropped). The wait ends early instead, and the item goes back.
            with deferred() as held:
                began = time.monotonic()
                self._waiting_since = began
                try:
                    item = self._take(held)
                    if held.pending:
                        if item is not _INTERRUPTED:
                            self._ready.put_front([item])
                        continue  # leaving the block raises KeyboardInterrupt
                finally:
                    ended = time.monotonic()
                    with self._stats_lock:
                        self._waiting_since = None
                        # What lies before _consumer_at was already counted by consumer_stats().
                        self._wait_s += ended - max(began, self._consumer_at)
                with self._stats_lock:
                    self._taken += 1
            if item is _END:
                self._ended = True
                # Left for the pipeline's other consumers (threads that iterate it side by
                # side): the one that took the end returned, the others waited for ever.
                self._ready.put_front([_END])
                raise StopIteration
            if isinstance(item, Failure):
                raise StageFailed(
                    item.stage,
                    self._taken - 1,
                    item.error,
                    item.traceback_text,
                    item.error_type,
                    item.source_seq,
                    worker=item.worker,
                )
            return item

    def _take(self, held: Held) -> Any:
        began = time.monotonic()
        warn_at = self.stall_warning_s
        while True:
            if held.pending:
                return _INTERRUPTED
            try:
                return self._ready.get(
                    _CONSUMER_SLICE_S,
                    leave=lambda: self._stopped or held.pending or self._failed is not None,
                )
            except queue.Empty:
                if self._stopped:
                    raise self._stopped_error() from None
                if self._failed is not None:
                    raise self._failed from None
            except EOFError:
                raise self._stopped_error() from None
            waited = time.monotonic() - began
            if self.item_timeout_s is not None and waited >= self.item_timeout_s:
                raise PipelineStalled(
                    f"pipeline '{self.name}': no item for {waited:.1f} s (item_timeout_s="
                    f"{self.item_timeout_s:g}); {self._where_items_stand()}"
                )
            if warn_at is not None and waited >= warn_at:
                log.warning(
                    "pipeline '%s': the consumer has waited %.0f s for an item; %s",
                    self.name,
                    waited,
                    self._where_items_stand(),
                )
                warn_at += self.stall_warning_s

    def _stopped_error(self) -> PipelineStopped:
        return PipelineStopped(
            f"pipeline '{self.name}' was stopped after its consumer took {self._taken} "
            "item(s), before the source's end: the items in flight were dropped. Stop it "
            "after the loop ends (or catch PipelineStopped where stopping it early is meant)"
        )

    def _stopped_for(self, what: str) -> PipelineStopped:
        return PipelineStopped(
            f"pipeline '{self.name}' was stopped: it cannot {what} any more (its workers "
            "are gone); build a new pipeline"
        )

    def _where_items_stand(self) -> str:
        """Each stage's queue and workers, source to consumer: the stage that blocks is the
        one whose queue is full (or holds items) while the queues after it are empty."""
        parts = []
        for pool in list(self._pools):
            part = (
                f"'{pool.stage.name}' {pool.inbox.qsize()} item(s) waiting, {pool.target} worker(s)"
            )
            # A worker stopped by a signal (SIGSTOP, SIGTSTP) keeps its items and looks alive:
            # the only hang the pipeline cannot end itself, so the one the message must name.
            stopped = []
            for process in pool.processes():
                try:
                    if process.status() == psutil.STATUS_STOPPED:
                        stopped.append(str(process.pid))
                except psutil.Error:
                    continue
            if stopped:
                part += (
                    f" ({'pid' if len(stopped) == 1 else 'pids'} {', '.join(stopped)} stopped "
                    "by a signal, holding their items: kill -CONT to go on)"
                )
            parts.append(part)
        parts.append(f"ready for the consumer {self._ready.qsize()}")
        return "; ".join(parts)

    # ----------------------------------------------------------------- allocation

    @property
    def allocation(self) -> dict[str, int]:
        """The worker count of each stage, in stage order."""
        with self._lock:
            return dict(self._targets)

    def check(self, allocation: dict[str, int]) -> list[str]:
        """Say what is wrong with an allocation (empty list: nothing) without applying it."""
        problems = []
        if not isinstance(allocation, dict):
            return [f"an allocation is a mapping of stage name to workers, got {allocation!r}"]
        for name, count in allocation.items():
            if name not in self._targets:
                problems.append(
                    f"unknown stage '{name}'; this pipeline's stages are "
                    f"{', '.join(self.stage_names)}"
                )
                continue
            stage = self.stages[self.stage_names.index(name)]
            if isinstance(count, bool) or not isinstance(count, int):
                problems.append(f"stage '{name}' asks for {count!r} workers; give an integer")
            elif count < 1:
                problems.append(f"stage '{name}' asks for {count} workers; every stage needs 1")
            elif count > stage.ceiling:
                problems.append(
                    f"stage '{name}' asks for {count} workers but its max_workers is "
                    f"{stage.ceiling}"
                )
        return problems

    def apply(self, allocation: dict[str, int]) -> None:
        """Change the worker count of the named stages, live; stages not named keep theirs.

        Raises ``AllocationError`` (and changes nothing) when a stage is unknown, or a count
        is not an integer from 1 to the stage's ``max_workers``; ``PipelineStopped`` once the
        pipeline was stopped.
        """
        problems = self.check(allocation)
        if problems:
            raise AllocationError("; ".join(problems))
        with self._lock:
            if self._stopped:
                raise self._stopped_for("apply an allocation")
            targets = dict(self._targets)
            targets.update(allocation)
            if not self._started:
                self._targets = targets
                return
            self._plan_pinning(targets)
            applied_at = time.time()
            started: dict[str, list[int]] = {}
            for pool in self._pools:
                new = pool.resize(targets[pool.stage.name])
                if new:
                    started[pool.stage.name] = new
            self._targets = targets
            self._last_resize = {"applied_at": applied_at, "started": started}

    # ----------------------------------------------------------------- layout

    @property
    def layout(self) -> list[list[str]]:
        """The groups of stages that run fused, in pipeline order (a stage alone: a group of
        one)."""
        with self._lock:
            return [self.unit_names[i:j] for i, j in self._spans]

    def _group_stage(self, span: Span) -> Stage:
        i, j = span
        return fuse(self.units[i:j])

    def _use_layout(self, spans: list[Span]) -> None:
        """Make ``spans`` the layout the pipeline's names, pools and queues describe."""
        self._spans = list(spans)
        self.stages = [self._group_stage(span) for span in spans]
        self.stage_names = [s.name for s in self.stages]
        if self._all_pools:
            self._pools = [self._pool_of[span] for span in spans]
            for (i, j), pool in zip(spans, self._pools, strict=True):
                pool.inbox, pool.outbox = self._boundaries[i], self._boundaries[j]
            self._inboxes = [self._boundaries[b] for b in sorted(boundaries(spans))]

    def _layout_targets(self, spans: list[Span], allocation: dict[str, int] | None) -> dict:
        """Worker counts for ``spans``: those given, else a group kept keeps its count and a
        new group starts with its share of the workers of the groups it overlaps (fused: their
        sum; split: the whole's shared by stages), within its ceiling."""
        old = dict(zip(self._spans, (self._targets[n] for n in self.stage_names), strict=True))
        targets = {}
        for span in spans:
            stage = self._group_stage(span)
            if allocation and stage.name in allocation:
                targets[stage.name] = allocation[stage.name]
                continue
            # Each old group's workers go to the new groups in proportion to its stages each
            # takes: the total stays about what it was.
            count = old.get(span) or sum(
                c * (min(j, span[1]) - max(i, span[0])) / (j - i)
                for (i, j), c in old.items()
                if i < span[1] and span[0] < j
            )
            targets[stage.name] = max(1, min(round(count), stage.ceiling))
        return targets

    def relayout(
        self,
        groups: str | Iterable[str | list[str]] | None,
        allocation: dict[str, int] | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        """Fuse or split neighbouring stages while items flow; nothing is lost or repeated.

        ``groups`` as for ``fuse_groups`` (``None``: every stage alone); ``allocation`` the
        worker counts of the new layout's stages (the others as ``_layout_targets`` says).
        The new groups' workers start at once on the queue in front of what changed; the
        replaced groups stop taking new items and empty themselves, through their own queues,
        into the queue after it, in the background. Order is restored at the consumer as
        always. A change while the previous one still empties waits up to ``timeout_s``, then
        raises ``LayoutBusy``; a bad layout raises ``AllocationError``; either way the
        pipeline keeps the layout it runs.
        """
        try:
            spans = layout_spans(self.unit_names, groups)
        except ValueError as exc:
            raise AllocationError(str(exc)) from None
        names = [SEPARATOR.join(self.unit_names[i:j]) for i, j in spans]
        if allocation:
            ceilings = {
                n: self._group_stage(sp).ceiling for n, sp in zip(names, spans, strict=True)
            }
            problems = []
            for name, count in allocation.items():
                if name not in ceilings:
                    problems.append(
                        f"unknown stage '{name}'; the new layout's stages are {', '.join(names)}"
                    )
                elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
                    problems.append(f"stage '{name}' asks for {count!r} workers; give 1 or more")
                elif count > ceilings[name]:
                    problems.append(
                        f"stage '{name}' asks for {count} workers but its max_workers is "
                        f"{ceilings[name]}"
                    )
            if problems:
                raise AllocationError("; ".join(problems))
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._stopped:
                    raise self._stopped_for("change its layout")
                if not self._started:
                    targets = self._layout_targets(spans, allocation)
                    self._use_layout(spans)
                    self._targets = targets
                    return
                self._drain()
                if not self._draining:
                    self._switch(spans, self._layout_targets(spans, allocation))
                    return
            if time.monotonic() >= deadline:
                raise LayoutBusy(
                    f"pipeline '{self.name}' is still emptying the groups its last layout "
                    f"change replaced after {timeout_s:.1f} s (a worker is inside a long "
                    "item); it keeps its layout: try again later"
                )
            time.sleep(0.02)

    def _switch(self, spans: list[Span], targets: dict[str, int]) -> None:
        """Change the layout (the lock held, nothing draining): start the new groups, retire
        the replaced ones. Where it fails midway, the old layout stays and what was started
        of the new one empties itself like a replaced layout."""
        old_spans = list(self._spans)
        old_boundaries = dict(self._boundaries)
        common = sorted(boundaries(old_spans) & boundaries(spans))
        replaced: list[list[StagePool]] = []
        started: list[list[StagePool]] = []
        for c0, c1 in itertools.pairwise(common):
            before = [sp for sp in old_spans if c0 <= sp[0] and sp[1] <= c1]
            after = [sp for sp in spans if c0 <= sp[0] and sp[1] <= c1]
            if before != after:
                replaced.append([self._pool_of[sp] for sp in before])
                started.append([self._pool_of[sp] for sp in after])
        if not replaced:
            self.apply(targets)
            return
        for b in boundaries(spans) - boundaries(old_spans):
            self._boundaries[b] = Inbox(self.queue_size)
        for b in boundaries(old_spans) - boundaries(spans):
            del self._boundaries[b]  # its pools still hold it, and empty it
        old_targets = dict(self._targets)
        self._use_layout(spans)
        self._targets = targets
        try:
            self._plan_pinning(targets)
            for pools in started:
                for pool in pools:
                    pool.resize(targets[pool.stage.name])
        except BaseException:
            log.exception("pipeline '%s': a layout change failed; keeping the old", self.name)
            self._boundaries = old_boundaries
            self._use_layout(old_spans)
            self._targets = old_targets
            self._draining += started
            for pools in started:
                pools[0].resize(0)
            raise
        self._draining += replaced
        for pools in replaced:
            pools[0].resize(0)  # the new groups take the items in front of them from now on
        self._drain()
        log.info("pipeline '%s': layout now %s", self.name, ", ".join(self.stage_names))

    def _drain(self) -> None:
        """Let the groups of a replaced layout empty themselves (the lock held).

        The first pool of a replaced run of groups retires at once. Each later one keeps its
        workers until the pool before it has left and its own queue is empty, then retires;
        if its queue fills again (a retiring worker died holding items, which went back) it
        takes a worker again. A run has drained when every pool has no worker, no thread of
        its still runs, and its queues are empty."""
        still = []
        for pools in self._draining:
            upstream_quiet = True
            for k, pool in enumerate(pools):
                empty = k == 0 or pool.inbox.qsize() == 0
                if upstream_quiet and empty:
                    if pool.target:
                        pool.resize(0)
                elif k > 0 and pool.target == 0:
                    pool.resize(1)
                else:
                    pool.maintain()
                upstream_quiet = upstream_quiet and pool.target == 0 and empty and pool.quiet()
            if not upstream_quiet:
                still.append(pools)
        self._draining = still

    def last_resize(self) -> dict[str, Any] | None:
        """The latest ``apply()``: when, how many workers it started, and its latency.

        ``latency_s`` is the time from ``apply()`` to the moment every worker it started had
        produced an item (``None`` while one has not yet).
        """
        with self._lock:
            if self._last_resize is None:
                return None
            applied_at = self._last_resize["applied_at"]
            started = self._last_resize["started"]
            firsts = []
            for pool in self._pools:
                firsts += pool.first_outputs(started.get(pool.stage.name, []))
        done = bool(firsts) and all(t > 0.0 for t in firsts)
        return {
            "applied_at": applied_at,
            "workers_started": len(firsts),
            "latency_s": (max(firsts) - applied_at) if done else None,
        }

    def _plan_pinning(self, targets: dict[str, int]) -> None:
        """Give each stage cores of its own, in stage order, wrapping round when short."""
        if not self.pin_cpus:
            return
        if isinstance(self.pin_cpus, list):
            cores = list(self.pin_cpus)
        else:
            cores = sorted(os.sched_getaffinity(0))
        cursor = 0
        for pool in self._pools:
            count = targets[pool.stage.name]
            mine = sorted({cores[(cursor + k) % len(cores)] for k in range(count)})
            cursor += count
            pool.pin(mine)

    # ----------------------------------------------------------------- measurements

    def metrics(self, by_unit: bool = False) -> list[dict[str, Any]]:
        """One dict per stage, averaged since the previous call (see the module docs).

        ``by_unit``: one dict per stage as written, whatever the layout: a fused group's row
        is shared among its stages in proportion to the time each of its functions took
        (its workers, throughput and memory are the group's; busy time and CPU are split;
        the queue in front goes to its first stage, the one after to its last), and each
        such row names its ``group``."""
        # One hold of the lock for the rows and the layout they are split by: a relayout in
        # between (the agent applies one while its sampler measures) gave rows of one layout
        # and groups of the other ("zip() argument 2 is shorter than argument 1").
        with self._lock:
            rows = self._metrics()
            if not by_unit:
                return rows
            units = []
            parts = {}
            for (i, j), row in zip(self._spans, rows, strict=True):
                parts[row["name"]] = (i, j, self._part_shares(self._pool_of.get((i, j)), j - i))
        for row in rows:
            i, j, shares = parts[row["name"]]
            if j - i == 1:
                units.append(row)
                continue
            for k, share in enumerate(shares):
                unit = dict(row)
                unit.update(
                    name=self.unit_names[i + k],
                    group=row["name"],
                    busy_fraction=row["busy_fraction"] * share,
                    cpu_percent=row["cpu_percent"] * share,
                    fn_cpu_percent=row["fn_cpu_percent"] * share,
                    runqueue_percent=row["runqueue_percent"] * share,
                    rss_mb=row["rss_mb"] / (j - i),
                    in_queue=row["in_queue"] if k == 0 else 0,
                    out_queue=row["out_queue"] if k == j - i - 1 else 0,
                )
                units.append(unit)
        return units

    def _part_shares(self, pool: StagePool | None, n: int) -> list[float]:
        """Each function's share of a fused group's time since the last call (even shares
        before any item)."""
        totals = pool.part_totals() if pool is not None else []
        if len(totals) != n:
            return [1.0 / n] * n
        before = self._last_parts.get(pool.stage.name, [0.0] * n)
        self._last_parts[pool.stage.name] = totals
        spent = [max(0.0, t - b) for t, b in zip(totals, before, strict=True)]
        whole = sum(spent)
        if whole <= 0:
            return [1.0 / n] * n
        return [x / whole for x in spent]

    def _metrics(self) -> list[dict[str, Any]]:
        with self._lock:
            now = time.monotonic()
            wall = max(now - self._metrics_at, 1e-9)
            self._metrics_at = now
            thread_cpu = self._thread_cpu_times() if self._started else {}
            inherited = self._inherited_rss() if self._started else 0.0
            rows = []
            for i, stage in enumerate(self.stages):
                if not self._started:
                    rows.append(self._idle_row(stage))
                    continue
                pool = self._pools[i]
                pool.reap()
                items, busy = pool.totals()
                worker_s = pool.worker_seconds()
                last_items, last_busy, last_worker_s = self._last_totals.get(
                    stage.name, (0.0, 0.0, 0.0)
                )
                self._last_totals[stage.name] = (items, busy, worker_s)
                span = worker_s - last_worker_s
                busy_fraction = (busy - last_busy) / span if span > 0 else 0.0
                cpu_s, runqueue_s, rss = self._stage_usage(pool, thread_cpu, inherited)
                fn_cpu = pool.fn_cpu_total()
                fn_cpu_s = fn_cpu - self._last_fn_cpu.get(stage.name, 0.0)
                self._last_fn_cpu[stage.name] = fn_cpu
                rows.append(
                    {
                        "name": stage.name,
                        "workers": pool.target,
                        "items_per_s": (items - last_items) / wall,
                        "busy_fraction": min(1.0, max(0.0, busy_fraction)),
                        "in_queue": self._inboxes[i].qsize(),
                        "out_queue": self._inboxes[i + 1].qsize(),
                        "queue_capacity": self.queue_size,
                        "cpu_percent": 100.0 * cpu_s / wall,
                        # CPU in the stage's function(s) alone; the rest is hand-off.
                        "fn_cpu_percent": 100.0 * max(fn_cpu_s, 0.0) / wall,
                        "runqueue_percent": 100.0 * runqueue_s / wall,
                        "rss_mb": rss / 2**20,
                    }
                )
            return rows

    def _idle_row(self, stage: Stage) -> dict[str, Any]:
        return {
            "name": stage.name,
            "workers": self._targets[stage.name],
            "items_per_s": 0.0,
            "busy_fraction": 0.0,
            "in_queue": 0,
            "out_queue": 0,
            "queue_capacity": self.queue_size,
            "cpu_percent": 0.0,
            "fn_cpu_percent": 0.0,
            "runqueue_percent": 0.0,
            "rss_mb": 0.0,
        }

    def _stage_usage(
        self, pool: StagePool, thread_cpu: dict[int, float], inherited: float = 0.0
    ) -> tuple:
        """CPU seconds the stage's workers used since the last call, seconds they spent runnable
        but waiting for a CPU (:mod:`agents.pipeline.schedstat`; 0 where the kernel does not
        say), and the memory the stage's workers hold of their own now: each process worker's
        resident set less ``inherited``, what it shares with the launcher it was forked from
        (:meth:`_inherited_rss`)."""
        seen = self._usage_seen.get(pool.stage.name, {})
        rss = 0.0
        if pool.stage.kind == "process":
            current, rss = process_readings(pool.processes(), seen, inherited)
        else:
            current = {}
            for tid in pool.thread_ids():
                if tid in thread_cpu:
                    key = ("t", tid)
                    delay = _runqueue_or_before(seen, key, thread_runqueue_seconds(tid))
                    current[key] = (thread_cpu[tid], delay)
        # A worker gone since the last call takes its own along.
        self._usage_seen[pool.stage.name] = current
        cpu_s, runqueue_s = usage_since(seen, current)
        return cpu_s, runqueue_s, rss

    def _inherited_rss(self) -> float:
        """The launcher's resident anonymous memory: what every process worker maps from its
        start, shared copy-on-write with the launcher and the training process they were
        forked from.

        A worker's resident set counts every page it maps, shared or not: a worker forked from a
        training process holding 40 GB (a DLRM's embedding tables in host memory, a model, a
        dataset loaded before the loader started) reads as 40 GB, each, and the memory budget
        then refuses a second worker that costs a few MB. The launcher runs no user code and
        holds what it inherited, so a worker's anonymous memory less the launcher's is what the
        worker holds of its own (its heap, its batches). Pages of files (libraries, a dataset
        read through ``mmap``) are the page cache's, shared by every worker and given back
        under pressure: not counted. Nor are the pages a worker copies on write from what it
        inherited (the kernel says which only through ``/proc/<pid>/smaps``, whose read walks
        every page: 0.1 to 0.2 s a worker forked from 1 to 4 GB): a stage declares
        ``memory_mb_per_worker`` at registration where they matter. The last figure read
        stands while the launcher is being replaced."""
        zygote = self._zygote
        if zygote is None:
            return self._launcher_rss
        process = self._launcher_process
        try:
            if process is None or process.pid != zygote.pid:
                process = self._launcher_process = psutil.Process(zygote.pid)
            memory = process.memory_info()
            if memory.rss > 0:  # 0: a launcher that died and is not reaped yet (a zombie)
                self._launcher_rss = anonymous_memory(memory)
        except psutil.Error:
            pass
        return self._launcher_rss

    @staticmethod
    def _thread_cpu_times() -> dict[int, float]:
        try:
            return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
        except psutil.Error:
            return {}

    def _reset_consumer_counters(self, now: float) -> None:
        with self._stats_lock:
            self._consumer_at = now
            self._wait_s = 0.0
            self._taken_at_stats = self._taken

    def consumer_stats(self) -> dict[str, Any]:
        """How the consumer fared since the previous call: throughput and time waiting."""
        with self._stats_lock:
            now = time.monotonic()
            wall = max(now - self._consumer_at, 1e-9)
            wait = self._wait_s
            if self._waiting_since is not None:
                # The consumer is inside next() right now: count that wait up to this moment.
                wait += now - max(self._waiting_since, self._consumer_at)
            self._wait_s = 0.0
            taken = self._taken - self._taken_at_stats
            self._taken_at_stats = self._taken
            self._consumer_at = now
        samples = taken * self.samples_per_item
        return {
            "throughput": samples / wall,
            "idle_fraction": min(1.0, max(0.0, wait / wall)),
            "step_ms": 1000.0 * (wall - wait) / taken if taken else 0.0,
            "wait_ms": 1000.0 * wait / taken if taken else 0.0,
            "device": "cpu",
        }


# The pipeline's own threads hold it by a weak reference, taken for one step at a time, so
# that a pipeline its user dropped is collected and stopped (``Pipeline.__del__``). Their
# waits are sliced for the same reason: a wait for room holds no reference across slices.


def _put(inbox: Inbox, message: Any, pipeline: weakref.ref[Pipeline]) -> bool:
    """Put ``message`` in ``inbox``, waiting for room; ``False`` once the inbox closed or the
    pipeline was collected."""
    while not inbox.put(message, timeout=POLL_S):
        if inbox.closed or pipeline() is None:
            return False
    return True


def _monitor(pipeline: weakref.ref[Pipeline], stop: threading.Event) -> None:
    """Replace dead workers, and the launcher if it died, until the pipeline stops."""
    while not stop.wait(_MONITOR_S):
        current = pipeline()
        if current is None or not current._monitor_once():
            return
        del current


def _feed(pipeline: weakref.ref[Pipeline], flow: _Flow) -> None:
    """Number the source's items and put them in the first inbox."""
    current = pipeline()
    if current is None:
        return
    first, last, source = current._inboxes[0], current._inboxes[-1], current.source
    del current
    seq = 0
    try:
        for item in source() if callable(source) else source:
            if not _put(first, (seq, item), pipeline):
                return
            seq += 1
    except BaseException as exc:  # noqa: BLE001 - a source's SystemExit ends it as an error
        failure = Failure(
            "source",
            f"{type(exc).__name__}: {exc}",
            traceback.format_exc(),
            error_type_name(exc),
        )
        if not _put(first, (seq, failure), pipeline):
            return
        seq += 1
    flow.total = seq
    last.wake()  # the collector may be waiting for an item that never comes


def _collect(pipeline: weakref.ref[Pipeline], flow: _Flow, stop: threading.Event) -> None:
    """Take the last stage's results, restore source order, and hand them to the consumer."""
    current = pipeline()
    if current is None:
        return
    last, ready, ordered = current._inboxes[-1], current._ready, current.ordered
    del current
    pending: dict[int, Any] = {}
    delivered = 0
    while not stop.is_set():
        if flow.total is not None and delivered >= flow.total:
            _put(ready, _END, pipeline)
            return
        try:
            seq, payload = last.get(POLL_S, leave=lambda: flow.total is not None)
        except queue.Empty:
            if pipeline() is None:
                return
            continue
        except EOFError:
            return
        try:
            payload = decode(payload)
        except Exception as exc:  # a result that cannot be rebuilt here
            current = pipeline()
            if current is None:
                return
            payload = current._cannot_read(exc)
            del current
        if isinstance(payload, Failure):
            payload.source_seq = seq  # which source item it was (unordered stages too)
        if not ordered:
            if not _put(ready, payload, pipeline):
                return
            delivered += 1
            continue
        pending[seq] = payload
        while delivered in pending:
            if not _put(ready, pending.pop(delivered), pipeline):
                return
            delivered += 1
