"""The agent: samples the host and pipeline, ships batches, receives and applies allocations.

Three background threads, each with one job, so none can stall another:

- the *sampler* takes a sample every ``interval_s`` (host, stages, trainer) into a bounded
  buffer; it never touches the network;
- the *shipper* sends the buffer in batches every ``batch_seconds`` (sooner after an
  allocation decision), with backoff and jitter while the control plane is away, and removes
  samples only once they are acknowledged;
- the *poller* long-polls for allocations, checks each one and applies it live or refuses it.

Training never waits on any of them: the trainer reads the pipeline in its own thread, and a
control plane that is down, slow or wrong only makes the agent buffer and retry.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agents.budget import WorkerCpuMeter, cpu_slots, default_memory_budget_mb, group_budgets
from agents.client import ControlPlaneClient, ControlPlaneError
from agents.daemon.buffer import SampleBuffer
from agents.daemon.checks import StageLimits, check_allocation
from agents.daemon.sample import NothingToSample, stage_fields, trainer_fields
from agents.host import HostSampler
from agents.layout import SEPARATOR as LAYOUT_SEPARATOR
from agents.layout import layout_problem, workers_problem
from agents.protocol import MAX_SAMPLES_PER_BATCH

log = logging.getLogger("agents.daemon")

THREAD_PREFIX = "intune-agent"
# Leave room under the protocol's body limit (agents.protocol.MAX_BODY_BYTES, 1 MiB) for the
# envelope and JSON overhead.
MAX_BATCH_BYTES = 900_000
MAX_BATCH_SAMPLES = MAX_SAMPLES_PER_BATCH
MAX_REFUSALS_PER_BATCH = 100
# How long applying a new layout waits for the last change to empty (agents.pipeline).
RELAYOUT_TIMEOUT_S = 5.0
# Each wait between batches is drawn within this fraction of ``batch_seconds`` either side (the
# mean period unchanged). Why: the agents of one training job start together, and all of them
# report the allocation they applied in the same instant; with a fixed period they then post
# every batch in the same instant for ever, and each such burst queues at the control plane (200
# agents in step: p99 617 ms against 30 ms spread, docs/benchmarks.md). Drawn afresh each time,
# a fleet's batches drift apart within a few periods.
SHIP_JITTER = 0.2


def shipping_period(batch_seconds: float, draw: Callable[[], float] = random.random) -> float:
    """Seconds until the next batch: ``batch_seconds`` give or take ``SHIP_JITTER`` of it."""
    return batch_seconds * (1.0 + SHIP_JITTER * (2.0 * draw() - 1.0))


class TunablePipeline(Protocol):
    """What the agent needs from a pipeline (``agents.pipeline.Pipeline`` provides it)."""

    stage_names: list[str]

    @property
    def allocation(self) -> dict[str, int]: ...

    def apply(self, allocation: dict[str, int]) -> None: ...

    def metrics(self) -> list[dict]: ...


@dataclass
class AgentConfig:
    """How the agent talks to its control plane and what it allows on this host."""

    url: str
    """Base URL of the control plane, e.g. ``http://intune.internal:8000``."""
    host_id: int
    """This host's id on the control plane (from registration)."""
    token: str
    """This host's agent token (``ia_...``), sent as ``Authorization: Agent <token>``."""
    interval_s: float = 1.0
    """Seconds between samples."""
    batch_seconds: float = 5.0
    """Seconds between batches while the control plane answers, on average (each wait is drawn
    within ``SHIP_JITTER`` of it either side, so that a fleet started together drifts apart)."""
    buffer_samples: int = 3600
    """Most samples held while the control plane is away (one hour at 1 Hz); then oldest go."""
    worker_budget: int | None = None
    """CPU slots of all stages together (:mod:`agents.budget`: a worker that computes takes
    one, a worker that waits the CPU it was measured to use); ``None``: the host's whole CPUs
    plus one per stage."""
    memory_budget_mb: float | None = None
    """Most memory the workers may hold of their own; ``None``: 80% of the host's (cgroup)
    memory limit less what the host holds besides them (:meth:`Agent.memory_budget_now`)."""
    poll_wait_s: float = 30.0
    """How long one long-poll may be held by the control plane (at most 60)."""
    timeout_s: float = 10.0
    """Connect/read timeout of one request (a long-poll adds its wait)."""
    backoff_initial_s: float = 0.5
    """Scale of the first retry's backoff; it doubles per failure, with full jitter."""
    backoff_max_s: float = 15.0
    """Cap of one backoff, so a returning control plane is noticed within this many seconds."""
    max_batch_bytes: int = MAX_BATCH_BYTES
    """Largest request body; a bigger batch is split (the protocol allows 1 MiB)."""
    prometheus_port: int | None = None
    """Serve Prometheus metrics on this port (0: any free port); ``None``: off."""
    first_seq: int | None = None
    """First sequence number; ``None``: milliseconds since the epoch, above any earlier run."""
    rebalance_s: float | None = 10.0
    """On a multi-rank host, seconds between re-splits of the allocation in force among the
    ranks by their measured need, made only when worth it (``agents.budget.REBALANCE_GAIN``);
    ``None``: split only when an allocation arrives."""


class Agent:
    """Reports one pipeline (and its trainer) to the control plane and applies allocations.

    Use :func:`agents.attach` for the common case; construct directly for full control.
    ``trainer_stats`` is a callable returning the trainer's stats (``throughput``,
    ``idle_fraction``, ``step_ms``, ``wait_ms``, ``device``); by default the pipeline's
    ``consumer_stats`` is used. ``on_shipped(last_seq)`` is called after each stored batch that
    carried samples (not after a status-only one).
    """

    def __init__(
        self,
        pipeline: TunablePipeline,
        config: AgentConfig,
        *,
        trainer_stats: Callable[[], dict] | None = None,
        host_sampler: HostSampler | None = None,
        on_shipped: Callable[[int], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.config = config
        self.trainer_stats = trainer_stats or getattr(pipeline, "consumer_stats", None)
        if self.trainer_stats is None:
            raise ValueError(
                "the agent needs the trainer's stats (throughput, idle_fraction, ...): pass "
                "trainer_stats=callable, or a pipeline with consumer_stats()"
            )
        self.host = host_sampler or HostSampler()
        self.on_shipped = on_shipped
        self.buffer = SampleBuffer(config.buffer_samples)
        self._stop = threading.Event()
        self._ship_now = threading.Event()
        self.client = ControlPlaneClient(
            config.url,
            config.host_id,
            config.token,
            timeout_s=config.timeout_s,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=config.backoff_max_s,
            stop_event=self._stop,
        )
        # A pipeline that can change its layout (agents.pipeline.Pipeline.relayout) is known
        # to the control plane by its stages as written, whatever groups run fused.
        self.layouts = callable(getattr(pipeline, "relayout", None)) and bool(
            getattr(pipeline, "unit_names", None)
        )
        self.stage_names = list(pipeline.unit_names if self.layouts else pipeline.stage_names)
        # A host's local ranks (agents.daemon.ranks.HostPipelines) each run the allocation.
        self.ranks = max(1, int(getattr(pipeline, "ranks", 1) or 1))
        host_slots = cpu_slots(self.host.limits.cpus, len(self.stage_names), self.ranks)
        self.worker_budget = config.worker_budget or host_slots
        if self.worker_budget > host_slots:
            # Asked for more than the host has: allowed (the budget is the person's call), but
            # said, since allocations that fit it can oversubscribe the CPUs the host has.
            log.warning(
                "the worker budget of %s CPU slots is more than this host's %s (%.4g CPUs "
                "available to the agent, by its affinity and cgroup, plus one slot per stage "
                "and rank): allocations may ask for more CPU than there is, and the workers "
                "would time-slice. Lower --worker-budget (worker_budget=), or leave it unset",
                self.worker_budget,
                host_slots,
                self.host.limits.cpus,
            )
        self.memory_budget_mb = config.memory_budget_mb or default_memory_budget_mb(
            self.host.limits.memory_limit_mb
        )
        # Milliseconds since the epoch outgrow any sequence an earlier run reached at 1 Hz.
        first = config.first_seq
        self._next_seq = first if first is not None else time.time_ns() // 10**6
        # Allocation state, guarded by _lock: the poller writes it, sampler and shipper read it.
        self._lock = threading.Lock()
        self._applied_version: int | None = None
        self._seen_version = 0
        self._refused: list[dict] = []
        self._decisions = 0  # allocations applied or refused so far
        self._decisions_reported = 0  # of those, how many a stored batch has reported
        self._rss_per_worker: dict[str, float] = {}
        # At the last sample: the memory the pipeline's workers hold of their own, and what the
        # host holds besides (memory_budget_now), in MB; None before the first sample.
        self._memory_held_mb: float | None = None
        self._memory_outside_mb: float | None = None
        self._worker_cpu = WorkerCpuMeter()
        self.refused_total = 0
        self.shipped_total = 0
        self.duplicates_acknowledged = 0  # resent samples the control plane already had
        self.last_error: str | None = None
        self._threads: list[threading.Thread] = []
        self._last_batch: list[dict] = []
        self.prometheus = None
        if config.prometheus_port is not None:
            from agents.daemon.prometheus import AgentMetrics

            self.prometheus = AgentMetrics()

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> Agent:
        """Start the sampler, shipper and poller threads (and the Prometheus endpoint)."""
        if self._threads:
            raise RuntimeError("this agent is already running; create a new Agent to restart")
        if self.prometheus is not None:
            self.prometheus.serve(self.config.prometheus_port or 0)
            log.info("Prometheus metrics on port %d", self.prometheus.port)
        for name, target in (
            ("sampler", self._sample_loop),
            ("shipper", self._ship_loop),
            ("poller", self._poll_loop),
        ):
            t = threading.Thread(target=target, name=f"{THREAD_PREFIX}-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "agent started for host %s at %s (%d rank(s)): stages %s, budget %d CPU slots and "
            "%.0f MB",
            self.config.host_id,
            self.config.url,
            self.ranks,
            ",".join(self.stage_names),
            self.worker_budget,
            self.memory_budget_mb,
        )
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads; the shipper makes one last attempt to send what is buffered.

        The pipeline is left running: it belongs to the caller.
        """
        self._stop.set()
        self._ship_now.set()
        self.client.interrupt_poll()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t.name.endswith("poller"):
                # A held long-poll cannot be woken from here (closing a socket does not wake a
                # blocked read); the daemon thread ends by itself when the poll returns.
                t.join(0.1)
            else:
                t.join(max(0.0, deadline - time.monotonic()))
        self.client.close()
        if self.prometheus is not None:
            self.prometheus.close()
        left = len(self.buffer)
        log.info("agent stopped; %d samples were still buffered", left)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def threads(self) -> list[threading.Thread]:
        """The agent's background threads (for overhead measurement)."""
        return list(self._threads)

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest sample taken (one below the first before any)."""
        return self._next_seq - 1

    @property
    def applied_version(self) -> int | None:
        """The newest allocation version applied, ``None`` before the first."""
        with self._lock:
            return self._applied_version

    # -- sampling ---------------------------------------------------------------------------

    def take_sample(self) -> dict:
        """Measure the host, the stages and the trainer now and return one sample.

        Stage metrics are averages since the previous call, so only the agent should call
        ``pipeline.metrics()``.
        """
        # Per stage as written (the same rows while no stage runs fused), asked for whatever
        # the layout is now: a relayout between a look at the layout and the measurement gave
        # rows named by group ("parse+transform"), which the control plane refuses.
        rows = self.pipeline.metrics(by_unit=True) if self.layouts else self.pipeline.metrics()
        stages = [stage_fields(m) for m in rows]
        per_worker = {
            s["name"]: s["rss_mb"] / s["workers"] for s in stages if s["workers"] and s["rss_mb"]
        }
        self._follow_cpus()
        host = self.host.sample(self.worker_budget)
        held = sum(s["rss_mb"] or 0.0 for s in stages)
        with self._lock:
            self._rss_per_worker.update(per_worker)
            self._memory_held_mb = held
            self._memory_outside_mb = max(0.0, host["memory_used_mb"] - held)
            self._worker_cpu.update(stages, host["cpu_percent"])
            version = self._applied_version
        sample: dict[str, Any] = {
            "seq": self._next_seq,
            "ts": round(time.time(), 3),
            "allocation_version": version,
            "host": host,
            "stages": stages,
        }
        self._next_seq += 1
        sample["trainer"] = trainer_fields(self.trainer_stats())
        rank_fields = getattr(self.pipeline, "rank_fields", None)
        if self.ranks > 1 and rank_fields is not None:
            # One host, N ranks (docs/agent-protocol.md): the totals above, each rank here.
            host["ranks"] = self.ranks
            sample["ranks"] = rank_fields()
        return sample

    def _follow_cpus(self) -> None:
        """When the host's CPUs change under the agent (its cpuset shrunk or grown), the budget
        it checks and reports follows them, unless ``--worker-budget`` fixed it: the control
        plane sees the new budget in the next sample and the tuner allocates within it."""
        if not self.host.refresh() or self.config.worker_budget is not None:
            return
        budget = cpu_slots(self.host.limits.cpus, len(self.stage_names), self.ranks)
        if budget != self.worker_budget:
            log.warning(
                "the host's CPUs changed to %s (%g CPUs): worker budget %d -> %d CPU slots",
                ",".join(map(str, self.host.limits.cpu_ids)),
                self.host.limits.cpus,
                self.worker_budget,
                budget,
            )
            self.worker_budget = budget

    def _sample_loop(self) -> None:
        interval = self.config.interval_s
        next_tick = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            try:
                sample = self.take_sample()
            except NothingToSample as exc:
                log.debug("no sample this interval: %s", str(exc))
            except Exception:
                # A pipeline that cannot report this second must not end reporting for good.
                log.exception("could not take a sample; trying again in %.1f s", interval)
            else:
                self.buffer.append(sample)
                if self.prometheus is not None:
                    self.prometheus.observe(sample)
                    self.prometheus.buffered.set(len(self.buffer))
                    self.prometheus.dropped.set(self.buffer.dropped_total)
            next_tick += interval
            # After a long stall (a suspended VM) skip the missed ticks instead of bursting.
            if next_tick < time.monotonic():
                next_tick = time.monotonic() + interval

    # -- shipping ---------------------------------------------------------------------------

    def _allocation_status(self) -> tuple[dict, int]:
        with self._lock:
            # The protocol takes at most 100 refusals a batch; the rest go in the next ones.
            refused = self._refused[:MAX_REFUSALS_PER_BATCH]
            return {"applied_version": self._applied_version, "refused": refused}, len(refused)

    def _ship_once(self, limit: int, with_status: bool = True) -> int:
        """Send the oldest buffered samples once; return how many were stored."""
        batch, dropped = self.buffer.begin_send(limit)
        self._last_batch = batch
        with self._lock:
            decisions = self._decisions
            report_due = with_status and decisions > self._decisions_reported
        # With no sample to send, a batch still goes when an allocation decision is unreported
        # (the protocol's status-only batch): the control plane learns of it at once.
        if not batch and not report_due:
            self.buffer.release()
            return 0
        status, n_refused = self._allocation_status()
        body: dict[str, Any] = {"samples": batch, "dropped_samples": dropped}
        if with_status:
            body["allocation_status"] = status
        else:
            n_refused = 0
        encoded = json.dumps(body, separators=(",", ":")).encode()
        if len(encoded) > self.config.max_batch_bytes and len(batch) > 1:
            self.buffer.release()
            return self._ship_once(max(1, len(batch) // 2), with_status)
        with self._lock:
            # Held before the batch left, so the control plane had it when it answered: a
            # version newer than its answer names can only be one it no longer has.
            held_at_send = self._seen_version
        try:
            answer = self.client.post_metrics(encoded)
        except BaseException:
            self.buffer.release()
            raise
        self.buffer.ack(batch, dropped)
        latest = answer.get("latest_allocation_version")
        with self._lock:
            del self._refused[:n_refused]
            if with_status:
                self._decisions_reported = max(self._decisions_reported, decisions)
            went_back = (
                isinstance(latest, int)
                and not isinstance(latest, bool)
                and 0 <= latest < held_at_send <= self._seen_version
            )
            if went_back:
                # The control plane's newest version is below one this agent held before it
                # sent the batch: its state went back (a database restored from an older
                # backup). Polls for a version above ours would wait until its versions caught
                # up, ignoring every allocation until then: poll from just below its newest,
                # which comes at once.
                held, self._seen_version = self._seen_version, max(0, latest - 1)
        if went_back:
            log.warning(
                "the control plane's newest allocation is version %d, below the %d this agent "
                "holds: its state went back (a restored database?); following its allocations "
                "from version %d on",
                latest, held, latest,
            )  # fmt: skip
        self.shipped_total += len(batch)
        self.last_error = None
        if self.prometheus is not None:
            self.prometheus.shipped.set(self.shipped_total)
        if answer.get("duplicates"):
            self.duplicates_acknowledged += int(answer["duplicates"])
            log.info("control plane already had %d of %d samples", answer["duplicates"], len(batch))
        if self.on_shipped is not None and batch:  # a status-only batch ships no sequence
            self.on_shipped(batch[-1]["seq"])
        return len(batch)

    def flush(self) -> int:
        """Send everything buffered now, in batches; return how many samples were stored.

        Retries with backoff while the control plane is away (until :meth:`stop`). Of a batch
        the control plane refuses as invalid (400), what the error names (one sample, or the
        allocation report) or else the whole batch is dropped, logged and counted as dropped:
        the same body would be refused forever. An unreported allocation decision goes at once,
        with no samples if none are buffered.
        """
        sent = 0
        limit = MAX_BATCH_SAMPLES
        # What was buffered when the flush began, and no more: the samples taken while a batch
        # was on its way wait for the next period. Sending those too, a control plane slower
        # to answer than the sampling interval was sent a batch after a batch without rest,
        # more load exactly when it was slow (seen: 8 batches a period at load 8).
        upto = self.buffer.newest_seq()
        while self.buffer.holds_upto(upto) or self._report_due():
            try:
                n = self.client.with_retries(
                    lambda limit=limit: self._ship_once(limit), "shipping metrics"
                )
            except ControlPlaneError as exc:
                self.last_error = str(exc)
                if exc.retryable:  # stopping
                    break
                if exc.status == 413 and len(self._last_batch) > 1:
                    limit = len(self._last_batch) // 2
                    continue
                self._drop_what_was_refused(exc)
                continue
            if n == 0 and not self.buffer.holds_upto(upto):
                break  # a status-only batch went, or nothing was left to send
            sent += n
        return sent

    def _report_due(self) -> bool:
        with self._lock:
            return self._decisions > self._decisions_reported

    def _drop_what_was_refused(self, exc: ControlPlaneError) -> None:
        """A batch came back 400: drop only what the error names (the protocol's details start
        with the place: ``samples[3]....`` or ``allocation_status....``), else the batch."""
        detail = exc.detail or ""
        batch = self._last_batch
        bad_sample = re.match(r"samples\[(\d+)\]", detail)
        if bad_sample and int(bad_sample.group(1)) < len(batch):
            sample = batch[int(bad_sample.group(1))]
            self.buffer.discard_seq(sample["seq"])
            log.error("the control plane refused sample %d, dropped: %s", sample["seq"], exc)
        elif detail.startswith("allocation_status") and self._status_refused(exc):
            pass
        else:
            self.buffer.discard(batch)
            log.error("the control plane refused %d samples, dropped: %s", len(batch), exc)
        if not batch:
            # A refused status-only batch: resending the same report would loop.
            with self._lock:
                self._decisions_reported = self._decisions
                self._refused.clear()

    def _status_refused(self, exc: ControlPlaneError) -> bool:
        """After a 400, try the same samples once without ``allocation_status``. If they are
        stored, the report was what the control plane refused (say, a version it never
        published, after its database was restored): drop the report, keep the samples."""
        if self._last_batch:
            try:
                self._ship_once(len(self._last_batch), with_status=False)
            except ControlPlaneError:
                return False
        with self._lock:
            forgotten, self._refused = self._refused, []
            self._applied_version = None
            self._decisions_reported = self._decisions
        log.error(
            "the control plane refused this agent's allocation report (%s); samples sent "
            "without it, %d queued refusals forgotten, applied version reset",
            exc.detail,
            len(forgotten),
        )
        return True

    def _ship_loop(self) -> None:
        # Each period counts from the start of the last batch, so that the time a batch takes to
        # send does not lengthen the period (the mean stays ``batch_seconds``); a batch that took
        # longer than its period (a slow or retried control plane) is followed by at least half
        # a period's rest instead of the next batch at once.
        period = self.config.batch_seconds
        due = time.monotonic() + shipping_period(period)
        while not self._stop.is_set():
            self._ship_now.wait(max(0.0, due - time.monotonic()))
            self._ship_now.clear()
            started = time.monotonic()
            try:
                self.flush()
            except Exception:
                log.exception("unexpected error while shipping; the samples stay buffered")
            due = max(started + shipping_period(period), time.monotonic() + 0.5 * period)
        # One last attempt on the way out (stop is set, so with_retries tries once), after the
        # sampler's last sample so that nothing taken is left behind.
        for t in self._threads:
            if t.name.endswith("sampler"):
                t.join(self.config.interval_s + 1.0)
        try:
            self.flush()
        except Exception as exc:
            log.warning("final flush failed, %d samples not sent: %s", len(self.buffer), str(exc))

    # -- allocations ------------------------------------------------------------------------

    def stage_limits(self) -> list[StageLimits]:
        """Each stage's ``max_workers``, measured CPU slots and memory per worker, for the
        checks."""
        written = getattr(self.pipeline, "units", None) if self.layouts else None
        stages = {
            getattr(s, "name", None): s for s in written or getattr(self.pipeline, "stages", [])
        }
        with self._lock:
            rss = dict(self._rss_per_worker)
            worker_cpu = self._worker_cpu.worker_cpu()
        limits = []
        for name in self.stage_names:
            stage = stages.get(name)
            # Thread workers share the process's memory; adding one costs no resident set.
            is_thread = getattr(stage, "kind", "process") == "thread"
            limits.append(
                StageLimits(
                    name,
                    # agents.pipeline.Stage says "ceiling" for max_workers with its default.
                    max_workers=getattr(stage, "ceiling", None)
                    or getattr(stage, "max_workers", None),
                    worker_cpu=worker_cpu.get(name, 1.0),
                    memory_mb_per_worker=None if is_thread else rss.get(name),
                )
            )
        return limits

    def memory_budget_now(self) -> float:
        """The most memory, in MB, an allocation's workers may hold now.

        A budget given (``--memory-budget-mb``, ``memory_budget_mb=``) is the person's call and
        stands as given. The default, 80% of the host's memory limit, is shared with all else
        the host holds: it is less what the host held outside the pipeline's workers at the last
        sample (the host's memory in use less the workers' own: the trainer and its model or
        embedding tables, the system, other tenants), and never less than what the workers held
        then, so an allocation that needs no more than today's is never refused for memory."""
        if self.config.memory_budget_mb:
            return self.memory_budget_mb
        with self._lock:
            held, outside = self._memory_held_mb, self._memory_outside_mb
        if held is None or outside is None:
            return self.memory_budget_mb
        return max(self.memory_budget_mb - outside, held)

    def handle_allocation(self, allocation: dict) -> str | None:
        """Check one allocation from the control plane and apply it, or refuse it.

        Returns ``None`` when applied (or ignored as not newer), else the reason it was
        refused, which is also queued for ``allocation_status.refused`` in the next batch.
        """
        version = allocation.get("version")
        workers = allocation.get("workers")
        if isinstance(version, bool) or not isinstance(version, int):
            log.error("ignoring an allocation without an integer version: %r", allocation)
            return None
        with self._lock:
            if version <= self._seen_version:
                log.debug("ignoring allocation %d: already at %d", version, self._seen_version)
                return None
            self._seen_version = version
        layout = allocation.get("layout")
        groups, reason = self._layout_of(layout, workers)
        if reason is None:
            reason = check_allocation(
                workers,
                self.stage_limits() if groups is None else self.group_limits(groups),
                self.worker_budget,
                self.memory_budget_now(),
                self.host.limits.cpus,
                self.ranks,
            )
        if reason is None:
            before = dict(self.pipeline.allocation)
            try:
                if groups is not None:
                    self.pipeline.relayout(groups, dict(workers), timeout_s=RELAYOUT_TIMEOUT_S)
                else:
                    self.pipeline.apply(dict(workers))
            except Exception as exc:  # the pipeline's own checks (AllocationError) or a failure
                reason = f"the pipeline refused it: {exc}"
            else:
                with self._lock:
                    self._applied_version = version
                log.info(
                    "applied allocation version %d (%s): %s -> %s",
                    version,
                    allocation.get("source", "?"),
                    before,
                    dict(workers),
                )
        if reason is not None:
            with self._lock:
                self._refused.append({"version": version, "reason": reason})
                self.refused_total += 1
            if self.prometheus is not None:
                self.prometheus.allocations_refused.set(self.refused_total)
            log.warning("refused allocation version %d: %s", version, reason)
        with self._lock:
            self._decisions += 1
        self._ship_now.set()  # tell the control plane at once
        return reason

    def _layout_of(self, layout: object, workers: object) -> tuple[list[str] | None, str | None]:
        """The groups to run for an allocation (``None``: keep the layout, resize only) and
        why it must be refused, if it must. Without ``layout`` an allocation that names every
        stage as written runs them each alone, as it always did."""
        if layout is None:
            if not self.layouts or not isinstance(workers, dict):
                return None, None
            staged = [[name] for name in self.stage_names]
            if set(workers) == set(self.stage_names) and self.pipeline.layout != staged:
                return ["+".join(g) for g in staged], None
            return None, None
        if not self.layouts:
            return None, (
                "this agent's pipeline cannot change its layout (a Pipeline of stages as "
                "written runs it); send the allocation without 'layout'"
            )
        problem = layout_problem(layout, self.stage_names) or workers_problem(layout, workers)
        if problem:
            return None, problem
        return [LAYOUT_SEPARATOR.join(group) for group in layout], None

    def group_limits(self, groups: list[str]) -> list[StageLimits]:
        """The checks' view of a layout's groups (``read+parse``), as the control plane counts
        them (agents.budget.group_budgets)."""
        return group_budgets(
            [group.split(LAYOUT_SEPARATOR) for group in groups], self.stage_limits()
        )

    def _poll_loop(self) -> None:
        wait_s = self.config.poll_wait_s
        while not self._stop.is_set():
            asked = time.monotonic()
            try:
                with self._lock:
                    after = self._seen_version
                allocation = self.client.with_retries(
                    lambda after=after, wait_s=wait_s: self.client.poll_allocation(after, wait_s),
                    "polling for allocations",
                )
            except ControlPlaneError as exc:
                self.last_error = str(exc)
                if exc.status == 400 and wait_s > 1.0:
                    # A control plane may hold polls for less than asked (its own setting):
                    # ask for less rather than stop hearing about allocations.
                    wait_s = max(1.0, wait_s / 2)
                    log.warning("%s; asking to hold polls %.0f s instead", str(exc), wait_s)
                    continue
                if not self._stop.is_set():
                    log.error("%s; polling again in %.0f s", str(exc), self.config.backoff_max_s)
                    self._stop.wait(self.config.backoff_max_s)
                continue
            except Exception:
                if self._stop.is_set():  # the client was closed under a held poll
                    return
                log.exception("unexpected error while polling; polling again")
                self._stop.wait(self.config.backoff_max_s)
                continue
            if allocation is None and time.monotonic() - asked < min(1.0, wait_s / 2):
                # Nothing new, answered long before the wait asked for: a control plane (or a
                # proxy) that does not hold polls, or a web process on its way down answering
                # the polls it held. Re-asking at once would be a busy loop against it, the
                # whole fleet's in the same instant; rest a moment drawn at random instead.
                self._stop.wait(random.uniform(0.5, 1.0) * min(1.0, wait_s))
                continue
            if allocation is not None:
                try:
                    self.handle_allocation(allocation)
                except Exception:
                    log.exception("could not handle %r; keeping the one in force", allocation)
