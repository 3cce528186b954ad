"""One agent per host for every local rank: the host's pipelines, and each rank's link to them.

A host that trains with ``torchrun --nproc-per-node N`` runs N training processes (ranks), each
with its own input pipeline, all on the same CPUs. The control plane sees one host
(docs/architecture.md, "Multi-rank hosts"):

- :class:`HostPipelines` listens on a local Unix socket (by default in Linux's abstract
  namespace, so a dead owner leaves no file behind) and gathers the ranks' reports. To the
  agent (:class:`agents.daemon.Agent`) it is one pipeline: a stage's workers, rates, queues,
  CPU and memory summed over the ranks, the trainer's throughput summed (the host's samples/s),
  and ``apply`` sends the allocation, which is per rank, to every rank and waits (bounded) for
  each to apply it.
- :class:`RankLink` runs in each rank, in a background thread: it connects, says hello (rank,
  stages, allocation), reports its stage metrics and trainer stats every interval and applies
  what it receives. When nobody listens, the first rank to bind the socket hosts the agent in
  its own process (``host_here``); the others connect to it. When the host agent dies, the
  ranks keep their allocation and reconnect, and one of them takes over, with bounded waits.
  Nothing here runs in the training thread: a step never waits on the socket.

The wire format is one JSON object per line; a line is at most :data:`MAX_LINE_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents.budget import (
    REBALANCE_GAIN,
    StageBudget,
    rank_need,
    shape_problems,
    split_across_ranks,
    split_gain,
)
from agents.daemon.sample import NothingToSample, stage_fields, trainer_fields

log = logging.getLogger("agents.daemon.ranks")

#: Largest message on the local socket (a report of 16 stages is a few kB).
MAX_LINE_BYTES = 2**20
#: A rank that has said nothing for this many report intervals is left out of the host's sums.
STALE_INTERVALS = 5
#: A rank that runs other than its share (it refused the share it was sent when it joined, or
#: failed to apply it) is sent its share again after this many report intervals.
RESEND_INTERVALS = 5
#: Bounds of a rank's wait between two attempts to reach (or become) the host agent.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0
SOCKET_ENV = "INTUNE_RANK_SOCKET"
#: How long a rank's process may take to end after its connection did (a SIGKILLed process's
#: socket closes a moment before it becomes a zombie) before the host counts its workers on.
EXIT_GRACE_S = 0.5
#: The longest HostPipelines.stop() waits for its threads (each ends within RECEIVE_SLICE_S
#: of its connection's close, or within its move's apply_timeout_s).
STOP_TIMEOUT_S = 2.0
#: Seconds between two looks of the host agent at its ranks' needs (:meth:`HostPipelines.rebalance`).
REBALANCE_S = 10.0


def socket_address(spec: str) -> str:
    """A socket given as a path, or as ``@name`` for Linux's abstract namespace (as ``ss``
    writes it: an environment variable cannot hold the leading NUL byte)."""
    return "\0" + spec[1:] if spec.startswith("@") else spec


def default_address(url: str, host_id: int) -> str:
    """The host agent's socket: ``INTUNE_RANK_SOCKET`` (a path or ``@name``) or an abstract name
    for this user, control plane and host (Linux's abstract namespace: gone with its owner)."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return socket_address(explicit)
    key = hashlib.sha256(f"{url.rstrip('/')}|{int(host_id)}".encode()).hexdigest()[:16]
    return f"\0intune-agent-{os.getuid()}-{key}"


# The ranks' sockets of this process (the host agent's listener and connections, a rank's
# connection), closed in every process it forks. A fork keeps every descriptor open: a
# loader's worker launcher, a torch DataLoader worker, any child the script forks after the
# agent started held the listener, so the abstract name stayed bound after the hub stopped
# (its rank, still alive, got EADDRINUSE and a refused connect, and so did every other rank:
# nobody hosted the agent while that child lived, for the whole job with persistent workers),
# and held the ranks' connections open after the hosting rank died.
_RANK_SOCKETS: weakref.WeakSet[socket.socket] = weakref.WeakSet()


def _ranks_socket(sock: socket.socket) -> socket.socket:
    """Note ``sock`` as one of the ranks' sockets (closed in a fork of this process)."""
    _RANK_SOCKETS.add(sock)
    return sock


def _close_rank_sockets_in_child() -> None:
    """In a process just forked: close its copies of the ranks' sockets (the parent's stay
    open; ``detach`` first, so that the copied objects never close a reused descriptor)."""
    for sock in list(_RANK_SOCKETS):
        with contextlib.suppress(OSError):
            fd = sock.detach()
            if fd >= 0:
                os.close(fd)
    _RANK_SOCKETS.clear()


os.register_at_fork(after_in_child=_close_rank_sockets_in_child)


def bind_listener(address: str) -> socket.socket | None:
    """Bind and listen on ``address``; ``None`` when another process holds it already.

    A path left behind by a dead owner (nobody accepts on it) is removed and bound again.
    """
    listener = _ranks_socket(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        listener.bind(address)
    except OSError as exc:
        listener.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        if address.startswith("\0") or someone_listens(address):
            return None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
        return bind_listener_once(address)
    listener.listen(64)
    return listener


def bind_listener_once(address: str) -> socket.socket | None:
    """One more bind after a stale path was removed (another rank may have won the race)."""
    listener = _ranks_socket(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return None
    listener.listen(64)
    return listener


def someone_listens(address: str) -> bool:
    """Whether a process accepts connections on ``address`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(address)
    except OSError:
        return False
    finally:
        probe.close()
    return True


#: The longest one wait for the socket lasts before it looks whether the connection was closed
#: here (a thread blocked in ``recv`` is not woken by another thread's ``close``).
RECEIVE_SLICE_S = 0.2


class _Lines:
    """Newline-delimited JSON over a stream socket, bounded."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._send_lock = threading.Lock()
        self._closed = threading.Event()

    def send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            self.sock.sendall(data)

    def receive(self, timeout_s: float) -> dict | None:
        """The next message, or ``None`` when none came within ``timeout_s``; raises
        ``ConnectionError`` when the other side closed or this side was closed meanwhile,
        ``ValueError`` on a bad line."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if self._closed.is_set():
                raise ConnectionError("the connection was closed here")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(min(left, RECEIVE_SLICE_S))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise ConnectionError("the other side closed the connection")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE_BYTES and b"\n" not in self._buffer:
                raise ValueError(f"a message longer than {MAX_LINE_BYTES} bytes")
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ValueError(f"not a message: {line[:200]!r}")
        return message

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@dataclass(frozen=True)
class StageInfo:
    """What the agent's checks need of a stage that runs in another process."""

    name: str
    kind: str = "process"
    max_workers: int | None = None


def stage_infos(pipeline: Any) -> list[StageInfo]:
    """The stages of a local pipeline (``agents.pipeline.Pipeline`` or ``agents.DataLoader``)."""
    stages = {getattr(s, "name", None): s for s in getattr(pipeline, "stages", [])}
    infos = []
    for name in pipeline.stage_names:
        stage = stages.get(name)
        bound = getattr(stage, "ceiling", None) or getattr(stage, "max_workers", None)
        infos.append(
            StageInfo(name, str(getattr(stage, "kind", "process")), int(bound) if bound else None)
        )
    return infos


def sum_stages(reports: list[list[dict]], names: list[str]) -> list[dict]:
    """The host's stages from each rank's: counts, rates, queues, CPU and memory summed; the
    busy fraction weighted by workers (so workers x busy is the host's busy workers)."""
    out = []
    for name in names:
        rows = [s for stages in reports for s in stages if s.get("name") == name]
        workers = sum(int(r.get("workers", 0)) for r in rows)
        busy = sum(int(r.get("workers", 0)) * float(r.get("busy_fraction", 0.0)) for r in rows)
        stage = {
            "name": name,
            "workers": workers,
            "busy_fraction": busy / workers if workers else 0,
        }
        for key in (
            "items_per_s", "in_queue", "out_queue", "queue_capacity", "cpu_percent",
            "runqueue_percent",
        ):  # fmt: skip
            stage[key] = sum(float(r.get(key, 0.0)) for r in rows)
        stage["rss_mb"] = sum(float(r.get("rss_mb", 0.0)) for r in rows)
        out.append(stage)
    return out


class _Rank:
    """One connected rank, as the host sees it."""

    def __init__(self, rank: int, pid: int, lines: _Lines, allocation: dict) -> None:
        self.rank = rank
        self.pid = pid
        self.lines = lines
        self.allocation = dict(allocation)
        self.report: dict | None = None
        self.reported_at = time.monotonic()
        self.answers: dict[int, str | None] = {}  # generation -> None (applied) or the reason
        self.share_sent_at = float("-inf")  # when it was last sent its share outside a move


class HostPipelines:
    """Every local rank's pipeline, as one pipeline for the agent (see the module docstring).

    ``listener`` is a bound, listening Unix socket (:func:`bind_listener`); ``ranks`` the
    host's local world size; ``stages`` the pipeline's stages, or ``None`` to learn them from
    the first rank's hello (:meth:`wait_for_stages`).
    """

    def __init__(
        self,
        listener: socket.socket,
        ranks: int,
        *,
        stages: list[StageInfo] | None = None,
        interval_s: float = 1.0,
        apply_timeout_s: float = 10.0,
        rebalance_s: float | None = REBALANCE_S,
    ) -> None:
        if ranks < 1:
            raise ValueError(f"a host runs at least one rank, got {ranks}")
        self.listener = listener
        self.ranks = int(ranks)
        self.interval_s = interval_s
        self.apply_timeout_s = apply_timeout_s
        self.rebalance_s = rebalance_s
        self.rebalances = 0  # moves made by rebalance(), without a new allocation
        self._stages = list(stages) if stages else None
        self._lock = threading.Condition()
        self._connected: dict[int, _Rank] = {}
        # The live reports the last metrics() summed: the same sample's trainer figures and
        # ranks list come from them (a rank whose first report came in between is in the next
        # sample; read afresh, one sample summed one rank's stages and listed two ranks).
        self._sampled: list[tuple[int, dict, dict]] | None = None
        self._in_force: dict[str, int] | None = None
        # Each rank's share of the allocation in force (split_across_ranks), by rank.
        self._split: dict[int, dict[str, int]] = {}
        self._generation = 0
        # Held for the whole of a move of the ranks' shares (an allocation, a rebalance).
        self._moving = threading.Lock()
        # The ranks that said hello while a move was in flight (None when none is): they are
        # sent their share once the move has ended, of the allocation in force by then.
        self._joined_mid_move: list[_Rank] | None = None
        # The ranks disconnected for their silence, by rank, until they say hello again: their
        # process lives (stopped, starved of CPU) and so do their workers, as far as the hub
        # knows (_holding).
        self._silent: dict[int, _Rank] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []  # under self._lock
        self._connections: set[_Lines] = set()  # under self._lock

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> HostPipelines:
        """Accept ranks in a background thread."""
        threads = [
            threading.Thread(target=self._accept_loop, name="intune-ranks-accept", daemon=True)
        ]
        if self.rebalance_s:
            threads.append(
                threading.Thread(
                    target=self._rebalance_loop, name="intune-ranks-rebalance", daemon=True
                )
            )
        with self._lock:  # started under the lock: stop() joins only started threads
            self._threads.extend(threads)
            for t in threads:
                t.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Close the socket and every rank's connection (the ranks keep their allocation), and
        wait (at most ``timeout_s``) for the hub's threads to end."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            self._connected.clear()
            self._lock.notify_all()
            # Every connection, those still to say hello among them.
            connections = list(self._connections)
            threads = list(self._threads)
        for lines in connections:
            lines.close()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in threads if t.is_alive() and t is not threading.current_thread()]
        if left:
            log.warning("the host agent's threads %s did not end within %g s", left, timeout_s)

    def wait_for_stages(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the stages are known from a rank's hello."""
        with self._lock:
            return self._lock.wait_for(lambda: self._stages is not None, timeout_s)

    # -- what the agent reads ---------------------------------------------------------------

    @property
    def stages(self) -> list[StageInfo]:
        """The pipeline's stages (each rank runs the same)."""
        return list(self._stages or [])

    @property
    def stage_names(self) -> list[str]:
        """The pipeline's stage names."""
        return [s.name for s in self._stages or []]

    @property
    def allocation(self) -> dict[str, int]:
        """The allocation in force per rank: the last applied, else rank 0's (or the lowest)."""
        with self._lock:
            if self._in_force is not None:
                return dict(self._in_force)
            if self._connected:
                return dict(self._connected[min(self._connected)].allocation)
        return {name: 1 for name in self.stage_names}

    def connected_ranks(self) -> list[int]:
        """The ranks connected now."""
        with self._lock:
            return sorted(self._connected)

    def _live_reports(self) -> list[tuple[int, dict, dict]]:
        fresh_after = time.monotonic() - STALE_INTERVALS * max(self.interval_s, 0.2)
        with self._lock:
            return [
                (r.rank, r.report, dict(r.allocation))
                for r in sorted(self._connected.values(), key=lambda r: r.rank)
                if r.report is not None and r.reported_at >= fresh_after
            ]

    def metrics(self) -> list[dict]:
        """Each stage summed over the ranks that reported lately (:func:`sum_stages`)."""
        live = self._live_reports()
        if not live:
            raise NothingToSample("no rank has reported lately")
        self._sampled = live
        return sum_stages([report["stages"] for _, report, _ in live], self.stage_names)

    def _sampled_reports(self) -> list[tuple[int, dict, dict]]:
        """The reports the last ``metrics()`` summed (those live now before any)."""
        sampled = self._sampled
        return sampled if sampled is not None else self._live_reports()

    def consumer_stats(self) -> dict:
        """The host's trainer over the ranks the last ``metrics()`` summed: samples/s summed,
        the other figures averaged."""
        live = self._sampled_reports()
        trainers = [report["trainer"] for _, report, _ in live]
        if not trainers:
            return {"throughput": 0.0, "idle_fraction": 0.0, "device": "cpu"}
        n = len(trainers)
        return {
            "throughput": sum(t["throughput"] for t in trainers),
            "idle_fraction": sum(t["idle_fraction"] for t in trainers) / n,
            "step_ms": sum(t["step_ms"] for t in trainers) / n,
            "wait_ms": sum(t["wait_ms"] for t in trainers) / n,
            "device": trainers[0].get("device", "cpu"),
        }

    def rank_fields(self) -> list[dict]:
        """Each rank's trainer figures and allocation, of the ranks the last ``metrics()``
        summed, for the sample's ``ranks`` list."""
        return [
            {
                "rank": rank,
                "throughput": report["trainer"]["throughput"],
                "idle_fraction": report["trainer"]["idle_fraction"],
                "step_ms": report["trainer"]["step_ms"],
                "wait_ms": report["trainer"]["wait_ms"],
                "workers": allocation,
            }
            for rank, report, allocation in self._sampled_reports()
        ]

    def rank_workers(self) -> dict[int, dict[str, int]]:
        """Each connected rank's workers per stage now (its share of the allocation)."""
        with self._lock:
            return {rank: dict(r.allocation) for rank, r in sorted(self._connected.items())}

    # -- allocations ------------------------------------------------------------------------

    def split(self, workers: dict[str, int], ranks: list[int]) -> dict[int, dict[str, int]]:
        """``workers`` (per rank) split among ``ranks`` by each one's measured need
        (:func:`agents.budget.split_across_ranks`): the host's total per stage is kept, ranks
        that measure alike get ``workers`` each, and a rank that has not reported counts as
        the mean of the others."""
        return split_across_ranks(workers, self._needs(ranks), self._bounds())

    def _needs(self, ranks: list[int]) -> dict[int, dict[str, float]]:
        with self._lock:
            known = {**self._silent, **self._connected}
            reports = {rank: known[rank].report for rank in ranks}
        return {
            rank: rank_need(report["stages"]) if report else {} for rank, report in reports.items()
        }

    def _bounds(self) -> dict[str, int | None]:
        return {s.name: s.max_workers for s in self.stages}

    def rebalance(self) -> bool:
        """Split the allocation in force again by the ranks' newest needs, and move the ranks
        to the new split when it lightens a stage's most loaded rank by
        :data:`~agents.budget.REBALANCE_GAIN` or more (:func:`agents.budget.split_gain`);
        return whether they moved.

        An allocation is split when it arrives; the ranks' needs drift after (one rank's shard
        is slower, its cache colder), and the control plane may keep its decision for long.
        Nothing moves until every connected rank reported lately, nor when fewer than two
        are connected. The move is :meth:`_move`'s, shrink first; a rank that refuses leaves
        the ranks where they were."""
        with self._a_move():
            with self._lock:
                in_force = None if self._in_force is None else dict(self._in_force)
                targets = list(self._connected.values())
                current = {r.rank: dict(r.allocation) for r in targets}
            live = {rank for rank, _, _ in self._live_reports()}
            if in_force is None or len(targets) < 2 or any(r.rank not in live for r in targets):
                return False
            if self._holding():  # a silent rank's workers cannot move: leave the split be
                return False
            needs = self._needs([r.rank for r in targets])
            new = split_across_ranks(in_force, needs, self._bounds())
            if new == current:
                return False
            gain = split_gain(needs, current, new)
            if gain < REBALANCE_GAIN:
                return False
            refused = self._move(targets, new)
            if refused:
                log.warning("rebalance %s refused (%s); moving back", new, refused)
                self._move([r for r in targets if r.rank not in refused], current)
                return False
            with self._lock:
                self._split = new
            self.rebalances += 1
        log.info(
            "rebalanced the ranks' shares of %s by their needs (%.2fx lighter): %s -> %s",
            in_force, gain, current, new,
        )  # fmt: skip
        return True

    def _rebalance_loop(self) -> None:
        while not self._stop.wait(self.rebalance_s):
            try:
                self.rebalance()
            except Exception:  # the next look may do better; the agent goes on meanwhile
                log.exception("rebalancing the ranks failed")

    def apply(self, workers: dict[str, int]) -> None:
        """Send a per-rank allocation to every connected rank, split among them by what each
        measured it needs (:meth:`split`), and wait (bounded) for each to apply its share; a
        rank that refuses refuses it for the host (the ranks go back to their previous share),
        a rank silent past ``apply_timeout_s`` is disconnected (it reconnects and is sent its
        share in force). Ranks that connect later get theirs too, those that connect during
        the move once it has ended.

        A rank disconnected for its silence still runs its workers while its process lives
        (:meth:`_holding`): the allocation is split among it too, and refused (nothing moves)
        when its share is below what it may run; a silence while the ranks shrink refuses it.

        The ranks move shrink first (:meth:`_move`): at no moment do they run more workers of
        a stage than the old or the new allocation gives the host.

        An allocation that leaves out or invents a stage, or asks a stage for fewer than one
        or more than its ``max_workers`` workers, raises ``ValueError`` and changes nothing:
        the split could not give every rank its part of it (a rank's share is capped at the
        stage's bound), and a rank joining later would be sent it whole and refuse it. So does
        one that comes before any rank said hello (the stages and their bounds are unknown)."""
        if not self.stage_names:
            raise ValueError(
                "no rank has said hello yet, so the pipeline's stages are unknown; wait for "
                "them (wait_for_stages) before applying an allocation"
            )
        problems = shape_problems(
            workers, [StageBudget(s.name, s.max_workers) for s in self.stages]
        )
        if problems:
            raise ValueError("; ".join(problems))
        workers = {str(k): int(v) for k, v in workers.items()}
        with self._a_move():
            with self._lock:
                previous = self._in_force
                previous_split = dict(self._split)
                targets = list(self._connected.values())
            holding = self._holding()
            split = self.split(workers, [r.rank for r in targets] + sorted(holding))
            stuck = {
                rank: (r.allocation, split[rank])
                for rank, r in holding.items()
                if any(
                    count > split[rank].get(stage, count) for stage, count in r.allocation.items()
                )
            }
            if stuck:
                raise RuntimeError(
                    "; ".join(
                        f"rank {rank} is not connected (silent, or its connection ended) and its "
                        f"process still runs {running}, more than its "
                        f"share {share} of this allocation (the host would run more than its "
                        "slots); nothing moved"
                        for rank, (running, share) in stuck.items()
                    )
                )
            with self._lock:
                self._in_force = dict(workers)
                self._split = split
            refused = self._move(targets, {r.rank: split.get(r.rank, workers) for r in targets})
            if not refused:
                return
            with self._lock:
                self._in_force = previous
                self._split = previous_split
            if previous is not None:
                back = {r.rank: previous_split.get(r.rank, previous) for r in targets}
                self._move([r for r in targets if r.rank not in refused], back)
        raise RuntimeError("; ".join(f"rank {rank} {said}" for rank, said in refused.items()))

    @contextlib.contextmanager
    def _a_move(self):
        """Hold the move lock, and send the ranks that joined meanwhile their share at the end.

        A rank that says hello in the middle of a move is not one of its targets: sent the
        share in force when it joined, it would keep the previous allocation's share when the
        move goes through (or the new one when the move is refused and the others go back),
        while the hub counts it on the other."""
        with self._moving:
            with self._lock:
                self._joined_mid_move = []
            try:
                yield
            finally:
                self._end_of_move()

    def _end_of_move(self) -> None:
        with self._lock:
            joined, self._joined_mid_move = self._joined_mid_move or [], None
            sends = []
            for r in joined:
                share = self._split.get(r.rank, self._in_force)
                if self._connected.get(r.rank) is r and share is not None:
                    if share != r.allocation:
                        sends.append((r, dict(share)))
            generation = self._generation
        for r, share in sends:
            log.info("rank %d joined during a move; sending it its share %s", r.rank, share)
            r.share_sent_at = time.monotonic()
            self._send(r, {"type": "allocation", "generation": generation, "workers": share})

    def _move(self, targets: list[_Rank], shares: dict[int, dict[str, int]]) -> dict[int, str]:
        """Bring each of ``targets`` to its share, shrink before grow; return the ranks that
        refused it or stayed silent while they shrank, each with what it did ("refused it:
        <reason>", "did not answer ..."); then the move stopped where it was.

        Sent at once, a share that grows could start its workers before another rank's share
        that shrinks had stopped its own, and the host would run more than its slots in
        between (a 2-rank job was seen at 14 workers on 12 slots). So each rank first goes to
        the smaller of its current and its new count per stage, and once every rank has
        answered, the ranks that grow are sent their share. A rank silent while it shrinks
        still runs its workers as far as the host knows (its process may be stopped, or
        starved of CPU): growing the others into its slots would overrun the host, so its
        silence stops the move as a refusal does."""
        with self._lock:
            current = {r.rank: dict(r.allocation) for r in targets}
        # A move back after a refusal leaves the rank that refused out of ``targets``.
        shares = {rank: share for rank, share in shares.items() if rank in current}
        shrunk = {
            rank: {
                stage: min(count, current[rank].get(stage, count)) for stage, count in share.items()
            }
            for rank, share in shares.items()
        }
        for step, silence_refuses in ((shrunk, True), (shares, False)):
            moving = [r for r in targets if step[r.rank] != current[r.rank]]
            refused = self._send_and_wait(moving, step, silence_refuses)
            if refused:
                return refused
            current = {rank: dict(share) for rank, share in step.items()}
        return {}

    def _send_and_wait(
        self, targets: list[_Rank], shares: dict[int, dict[str, int]], silence_refuses: bool
    ) -> dict[int, str]:
        """Send each rank its share under a new generation and wait (bounded) for the answers;
        disconnect the ranks silent past ``apply_timeout_s``; return those that refused (and
        the silent ones when ``silence_refuses``), each with what it did."""
        if not targets:
            return {}
        with self._lock:
            self._generation += 1
            generation = self._generation
        for r in targets:
            self._send(
                r, {"type": "allocation", "generation": generation, "workers": shares[r.rank]}
            )
        deadline = time.monotonic() + self.apply_timeout_s
        with self._lock:
            self._lock.wait_for(
                lambda: all(
                    generation in r.answers or self._connected.get(r.rank) is not r for r in targets
                ),
                max(0.0, deadline - time.monotonic()),
            )
            answers = {r.rank: r.answers.get(generation, "") for r in targets}
            still = {r.rank: self._connected.get(r.rank) is r for r in targets}
        said = {rank: f"refused it: {reason}" for rank, reason in answers.items() if reason}
        if silence_refuses:
            holding = self._holding()
            for r in targets:
                if answers[r.rank] == "" and not still[r.rank] and holding.get(r.rank) is r:
                    said[r.rank] = (
                        f"lost its connection before it answered its smaller share "
                        f"{shares[r.rank]}; its process lives and may still run its workers, so "
                        "no rank grew into them"
                    )
        for r in targets:
            if answers[r.rank] == "" and still[r.rank]:
                log.warning(
                    "rank %d did not answer allocation %s in time; disconnecting it",
                    r.rank,
                    shares[r.rank],
                )
                self._mark_silent(r, shares[r.rank])
                self._drop(r)
                if silence_refuses:
                    said[r.rank] = (
                        f"did not answer its smaller share {shares[r.rank]} within "
                        f"{self.apply_timeout_s:g} s (apply_timeout_s); it may still run its "
                        "workers, so no rank grew into them"
                    )
        return said

    # -- the socket -------------------------------------------------------------------------

    def _send(self, r: _Rank, message: dict) -> None:
        try:
            r.lines.send(message)
        except OSError as exc:
            log.info("rank %d is gone (%s)", r.rank, str(exc))
            self._drop(r)

    def _drop(self, r: _Rank) -> None:
        with self._lock:
            if self._connected.get(r.rank) is r:
                del self._connected[r.rank]
            self._lock.notify_all()
        r.lines.close()

    def _accept_loop(self) -> None:
        # In slices: stop() shuts the listener down, which wakes a blocked accept() on Linux,
        # but nothing says so elsewhere; a slice bounds the wait wherever it runs.
        try:
            self.listener.settimeout(RECEIVE_SLICE_S)
        except OSError:
            return  # closed: stop() came first
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
                _ranks_socket(conn)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)
                continue
            t = threading.Thread(
                target=self._serve, args=(conn,), name="intune-ranks-conn", daemon=True
            )
            with self._lock:  # started under the lock: stop() joins only started threads
                self._threads = [old for old in self._threads if old.is_alive()] + [t]
                t.start()

    def _hello(self, lines: _Lines) -> _Rank | None:
        hello = lines.receive(10.0)
        if hello is None or hello.get("type") != "hello":
            raise ValueError(f"expected a hello first, got {hello!r}"[:300])
        rank, ranks = hello.get("rank"), hello.get("ranks")
        stages = [StageInfo(**s) for s in hello.get("stages", [])]
        names = [s.name for s in stages]
        problem = None
        if not isinstance(rank, int) or not 0 <= rank < self.ranks:
            problem = f"rank {rank!r} is not one of this host's {self.ranks} local ranks"
        elif ranks != self.ranks:
            problem = (
                f"this rank says the host runs {ranks} local ranks but the host agent serves "
                f"{self.ranks}; start every rank with the same LOCAL_WORLD_SIZE"
            )
        with self._lock:
            if problem is None and self._stages is None:
                self._stages = stages
                self._lock.notify_all()
            if problem is None and names != self.stage_names:
                problem = (
                    f"rank {rank}'s pipeline has stages {names} but the host's has "
                    f"{self.stage_names}; every rank must run the same pipeline"
                )
            if problem is None:
                r = _Rank(rank, int(hello.get("pid", 0)), lines, hello.get("allocation") or {})
                replaced = self._connected.get(rank)
                self._connected[rank] = r
                self._silent.pop(rank, None)  # back: its hello says what it runs
                in_force = self._split.get(rank, self._in_force)
                generation = self._generation
                if self._joined_mid_move is not None:
                    # The share in force may change before the move ends (it may be refused, the
                    # split is of the ranks it started with); _end_of_move sends the final one.
                    self._joined_mid_move.append(r)
                    in_force = None
        if problem is not None:
            # Sent without the lock: a rank that does not read would hold every other holder
            # (the agent's sampler among them) for the socket's timeout.
            lines.send({"type": "error", "reason": problem})
            log.error("refused a rank: %s", problem)
            return None
        if replaced is not None:
            replaced.lines.close()
        if in_force is not None and in_force != r.allocation:
            r.share_sent_at = time.monotonic()
            self._send(r, {"type": "allocation", "generation": generation, "workers": in_force})
        log.info(
            "rank %d (pid %d) joined; ranks connected: %s", rank, r.pid, self.connected_ranks()
        )
        return r

    def _serve(self, conn: socket.socket) -> None:
        lines = _Lines(conn)
        r = None
        with self._lock:
            if self._stop.is_set():
                lines.close()
                return
            self._connections.add(lines)
        try:
            r = self._hello(lines)
            if r is None:
                return
            silence = STALE_INTERVALS * max(self.interval_s, 0.2) * 4
            while not self._stop.is_set():
                message = lines.receive(silence)
                if message is None:
                    self._mark_silent(r)
                    raise TimeoutError(f"rank {r.rank} said nothing for {silence:.0f} s")
                self._handle(r, message)
                self._resend_share(r)
        except (OSError, ValueError, TypeError, KeyError, ConnectionError) as exc:
            if not self._stop.is_set():
                log.info("rank connection ended: %s", str(exc))
        finally:
            if r is not None:
                if not self._stop.is_set():
                    self._mark_silent(r)  # its process may live on, and its workers with it
                self._drop(r)
                if self._stop.is_set():
                    log.info("rank %d disconnected: the host agent stops", r.rank)
                else:
                    self._say_left(r)
            else:
                lines.close()
            with self._lock:
                self._connections.discard(lines)

    def _mark_silent(self, r: _Rank, sent: Mapping[str, int] | None = None) -> None:
        """Keep ``r`` among the ranks away (silent, or its connection ended: its process may
        live on, and so its workers, until it says hello again); ``sent`` is the share it was
        sent and did not answer: it may apply it when it wakes (a stopped process resumed),
        so it counts as running the larger of that and what it ran, stage by stage."""
        with self._lock:
            if self._connected.get(r.rank) is r:
                for stage, count in (sent or {}).items():
                    r.allocation[stage] = max(int(count), int(r.allocation.get(stage, count)))
                self._silent[r.rank] = r

    def _holding(self) -> dict[int, _Rank]:
        """The ranks disconnected for their silence whose process still lives, by rank: their
        workers still run, so an allocation is split among them too (their share is kept for
        their return) and one that would need them to shrink is refused; until then the others
        cannot grow into their slots. A rank whose process has ended is forgotten."""
        with self._lock:
            silent = {rank: r for rank, r in self._silent.items() if rank not in self._connected}
        gone = [rank for rank, r in silent.items() if not _process_lives(r.pid)]
        if gone:
            with self._lock:
                for rank in gone:
                    self._silent.pop(rank, None)
            log.info("silent ranks %s have ended; their workers with them", gone)
        return {rank: r for rank, r in silent.items() if rank not in gone}

    def _resend_share(self, r: _Rank) -> None:
        """Send ``r`` its share again when it runs something else and was last sent it
        :data:`RESEND_INTERVALS` reports ago: a rank that refused the share it was sent at
        hello (its pipeline failed to resize, say) would otherwise run its own allocation for
        good while the hub counts it on its share, and one that joined with more workers than
        its share would keep the host above its slots. Never during a move (the move sends
        the shares then, and a share sent beside it could land after the move's own)."""

        def due() -> tuple[dict, int] | None:
            with self._lock:
                share = self._split.get(r.rank, self._in_force)
                wait = RESEND_INTERVALS * max(self.interval_s, 0.1)
                if (
                    share is None
                    or share == r.allocation
                    or self._connected.get(r.rank) is not r
                    or time.monotonic() - r.share_sent_at < wait
                ):
                    return None
                return dict(share), self._generation

        if due() is None or not self._moving.acquire(blocking=False):
            return
        try:
            again = due()  # a move may have ended between the two looks
            if again is None:
                return
            share, generation = again
            log.warning(
                "rank %d runs %s, not its share %s of the allocation in force; sending it again",
                r.rank, r.allocation, share,
            )  # fmt: skip
            r.share_sent_at = time.monotonic()
            self._send(r, {"type": "allocation", "generation": generation, "workers": share})
        finally:
            self._moving.release()

    def _say_left(self, r: _Rank) -> None:
        """Log a rank's leaving and what becomes of its share. A rank whose process lives on
        keeps its workers, counted until it comes back (:meth:`_holding`). Shares are per
        rank: a rank's workers end with it, so the host runs fewer and no other rank's share grows (the
        host's slots it held are free, not handed on: the job has one rank fewer until it
        comes back); its share is kept, and sent again when it (or its restart) says hello.
        Nothing waits on it: a move in progress counts it as answered."""
        with self._lock:
            left = r.rank not in self._connected  # not replaced by its own new connection
            kept = self._split.get(r.rank, self._in_force)
            others = {rank: dict(o.allocation) for rank, o in sorted(self._connected.items())}
        # A killed process's socket ends a moment before its process does.
        deadline = time.monotonic() + EXIT_GRACE_S
        lives = left and _process_lives(r.pid)
        while lives and time.monotonic() < deadline and not self._stop.wait(0.01):
            lives = _process_lives(r.pid)
        if left and not lives:
            with self._lock:
                if self._silent.get(r.rank) is r:
                    del self._silent[r.rank]
        if lives:
            log.warning(
                "rank %d (pid %d) lost its connection but its process lives: its workers %s are "
                "counted as running until it says hello again (no rank grows into them); the "
                "ranks connected, %s, keep theirs: %s",
                r.rank, r.pid, r.allocation, sorted(others), others,
            )  # fmt: skip
        elif left:
            log.warning(
                "rank %d (pid %d) left; its share %s ended with it and is kept for its return; "
                "the ranks connected, %s, keep theirs: %s",
                r.rank, r.pid, kept if kept is not None else r.allocation, sorted(others), others,
            )  # fmt: skip

    def _handle(self, r: _Rank, message: dict) -> None:
        kind = message["type"]
        with self._lock:
            if kind == "report":
                r.report = {
                    "stages": [stage_fields(s) for s in message["stages"]],
                    "trainer": trainer_fields(message["trainer"]),
                }
                r.allocation = dict(message.get("allocation") or r.allocation)
                r.reported_at = time.monotonic()
            elif kind in ("applied", "refused"):
                generation = int(message["generation"])
                r.answers[generation] = (
                    None if kind == "applied" else str(message.get("reason") or "refused")
                )
                if kind == "applied":
                    r.allocation = dict(message.get("allocation") or r.allocation)
                    _restate_workers(r.report, r.allocation)
                # Keep the answers of the last few generations only.
                for old in [g for g in r.answers if g < generation - 8]:
                    del r.answers[old]
                self._lock.notify_all()
            else:
                raise ValueError(f"unknown message type {kind!r}")


def _process_lives(pid: int) -> bool:
    """Whether process ``pid`` lives (a rank on this host; an unknown pid counts as living)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped by its parent) runs nothing
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _restate_workers(report: dict | None, allocation: Mapping[str, int]) -> None:
    """Make a rank's last report say the workers it has applied since.

    The host sums the ranks' last reports; one sent before a rank shrank, summed with another
    rank's sent after it grew, would count workers that no longer run. The busy workers the
    report measured stay (they are the rank's need), spread over the new count."""
    for stage in (report or {}).get("stages", []):
        count = allocation.get(stage.get("name"))
        if count is None or count == stage.get("workers"):
            continue
        busy = float(stage.get("workers") or 0) * float(stage.get("busy_fraction") or 0)
        stage["workers"] = int(count)
        stage["busy_fraction"] = min(1.0, busy / count) if count else 0.0


_STDLIB = os.path.dirname(threading.__file__) + os.sep


class RankLink:
    """A rank's side: report to the host agent and apply what it sends (see the module doc).

    ``host_here(listener)`` is called when this rank bound the socket first: it must start the
    host agent on it (a :class:`HostPipelines` and an agent) and return an object with
    ``stop()``. ``trainer_stats`` returns the rank's trainer stats (``consumer_stats`` keys).
    """

    def __init__(
        self,
        pipeline: Any,
        rank: int,
        ranks: int,
        address: str,
        *,
        trainer_stats: Callable[[], dict],
        host_here: Callable[[socket.socket], Any] | None = None,
        interval_s: float = 1.0,
    ) -> None:
        self.pipeline = pipeline
        self.rank = rank
        self.ranks = ranks
        self.address = address
        self.trainer_stats = trainer_stats
        self.host_here = host_here
        self.interval_s = interval_s
        self.hosted: Any = None  # what host_here returned, while this rank hosts the agent
        self.pid = os.getpid()  # the process the host agent watches while this rank is silent
        self.applied_total = 0
        self.refused_total = 0
        self.connections = 0
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._hosting_lock = threading.Lock()  # around self.hosted's changes
        self._thread: threading.Thread | None = None
        self._lines: _Lines | None = None
        # What the link's thread is inside that a stop cannot cut, and since when (monotonic):
        # the pipeline's apply or metrics, the trainer's stats, starting or stopping a host
        # agent. A stop that outlasts its bound says it (:meth:`stop`).
        self._inside: tuple[str, float] | None = None
        # Set by a stop that gave up waiting for the thread to start a host agent: the thread
        # stops that agent itself as it ends.
        self._hosted_left_to_thread = threading.Event()

    @contextlib.contextmanager
    def _uncut(self, what: str):
        """Note that the link's thread is inside ``what`` (a call a stop cannot cut)."""
        self._inside = (what, time.monotonic())
        try:
            yield
        finally:
            self._inside = None

    def start(self) -> RankLink:
        """Start the link's background thread."""
        self._thread = threading.Thread(
            target=self._run, name=f"intune-rank{self.rank}-link", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop reporting, and the host agent too when this rank hosts it; return whether the
        link's thread has ended (it is waited for at most ``timeout_s``).

        The thread ends within a receive slice of the stop, unless it is inside a call that a
        stop cannot cut: the pipeline's ``apply`` (a resize) or ``metrics``, the trainer's
        stats, starting or stopping a host agent. Then ``stop`` returns ``False`` after
        ``timeout_s`` and logs what the thread is inside, for how long and where; the thread
        ends as that call returns (it applies nothing more; its answer meets a closed socket),
        and stops the host agent it was starting itself. Calling ``stop`` again waits for it
        again.

        A stand-in pipeline whose ``apply`` blocked (the generated rank-moves test's muted
        rank) held the thread past a 2 s stop; the test read the thread still alive after it.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        lines = self._lines
        if lines is not None:
            lines.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        ended = thread is None or not thread.is_alive() or thread is threading.current_thread()
        if not ended:
            log.warning(
                "rank %d's link did not end within %g s of its stop: its thread is %s; it ends "
                "when that returns",
                self.rank, timeout_s, self._holding_it(thread),
            )  # fmt: skip
        # Not while the link's thread is starting a host agent: bounded, since host_here may
        # take its time (the thread then stops the agent it started itself, in _run).
        if not self._hosting_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._hosted_left_to_thread.set()
            # The thread may have let go of the lock since, and be past its look at the flag.
            if not self._hosting_lock.acquire(blocking=False):
                log.warning(
                    "rank %d's stop did not wait for its link's thread to start the host agent "
                    "(%s); the thread stops that agent itself once it has started",
                    self.rank, self._holding_it(thread),
                )  # fmt: skip
                return False
        try:
            hosted, self.hosted = self.hosted, None
        finally:
            self._hosting_lock.release()
        if hosted is not None:
            hosted.stop()
        return ended

    def _holding_it(self, thread: threading.Thread | None) -> str:
        """What the link's thread is inside and where (for the log of a stop it outlasted)."""
        inside = self._inside
        what = (
            f"inside {inside[0]} for {time.monotonic() - inside[1]:.1f} s"
            if inside is not None
            else "not inside a call it is known to wait on"
        )
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        if frame is None:
            return what
        # The innermost calls outside Python's own library (threading's waits say nothing).
        calls = [
            f"{f.filename}:{f.lineno} {f.name}"
            for f in traceback.extract_stack(frame)
            if not f.filename.startswith(_STDLIB)
        ][-3:]
        return f"{what}, at {' < '.join(reversed(calls))}"

    @property
    def hosting(self) -> bool:
        """Whether this rank's process runs the host agent."""
        return self.hosted is not None

    def _connect(self) -> socket.socket | None:
        sock = _ranks_socket(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.settimeout(2.0)
        try:
            sock.connect(self.address)
        except OSError:
            sock.close()
            return None
        return sock

    def _reach_host(self) -> socket.socket | None:
        sock = self._connect()
        if sock is not None or self.host_here is None:
            return sock
        listener = bind_listener(self.address)
        if listener is None:
            return None  # another rank is (becoming) the host agent: connect next time
        with self._hosting_lock:
            if self._stop.is_set():
                listener.close()
                return None
            # The address was free: a host agent this rank runs no longer listens on it (its
            # hub stopped under it), and while it is held no rank would ever host another.
            stale, self.hosted = self.hosted, None
        if stale is not None:
            log.warning(
                "rank %d's host agent no longer listens on the ranks' socket; stopping it and "
                "starting another",
                self.rank,
            )
            try:
                with self._uncut("stopping its old host agent"):
                    stale.stop()
            except Exception:
                log.exception("rank %d could not stop its old host agent", self.rank)
        log.info("rank %d hosts the agent for the host's %d ranks", self.rank, self.ranks)
        with self._hosting_lock:
            if self._stop.is_set():
                listener.close()
                return None
            try:
                with self._uncut("starting the host agent (host_here)"):
                    self.hosted = self.host_here(listener)
            except Exception:
                listener.close()
                raise
        return self._connect()

    def _run(self) -> None:
        wait = RECONNECT_MIN_S
        while not self._stop.is_set():
            try:
                sock = self._reach_host()
            except Exception:
                log.exception("rank %d could not start the host agent", self.rank)
                sock = None
            if sock is None:
                self._stop.wait(wait)
                wait = min(RECONNECT_MAX_S, wait * 2)
                continue
            wait = RECONNECT_MIN_S
            self._lines = _Lines(sock)
            try:
                self._serve(self._lines)
            except (OSError, ValueError, TypeError, KeyError, ConnectionError) as exc:
                if not self._stop.is_set():
                    log.warning(
                        "rank %d lost the host agent (%s); keeping allocation %s, reconnecting",
                        self.rank,
                        str(exc),
                        self.pipeline.allocation,
                    )
            finally:
                self.connected.clear()
                self._lines.close()
                self._lines = None
        # A stop that gave up waiting while this thread started a host agent left it to us.
        if not self._hosted_left_to_thread.is_set():
            return
        with self._hosting_lock:
            hosted, self.hosted = self.hosted, None
        if hosted is not None:
            log.info("rank %d's link stops the host agent it started as it was stopped", self.rank)
            hosted.stop()

    def _serve(self, lines: _Lines) -> None:
        lines.send(
            {
                "type": "hello",
                "rank": self.rank,
                "ranks": self.ranks,
                "pid": self.pid,
                "stages": [s.__dict__ for s in stage_infos(self.pipeline)],
                "allocation": dict(self.pipeline.allocation),
            }
        )
        self.connections += 1
        self.connected.set()
        next_report = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            message = lines.receive(max(0.0, next_report - time.monotonic()))
            if message is not None:
                self._handle(lines, message)
            if time.monotonic() >= next_report:
                with self._uncut("the pipeline's metrics() or the trainer's stats"):
                    report = {
                        "type": "report",
                        "stages": [stage_fields(m) for m in self.pipeline.metrics()],
                        "trainer": trainer_fields(self.trainer_stats()),
                        "allocation": dict(self.pipeline.allocation),
                    }
                lines.send(report)
                next_report += self.interval_s
                if next_report < time.monotonic():
                    next_report = time.monotonic() + self.interval_s

    def _handle(self, lines: _Lines, message: dict) -> None:
        kind = message["type"]
        if kind == "error":
            # The host agent refused this rank (another pipeline, another world size): say so
            # and try again slowly; training goes on with the allocation it has.
            log.error("the host agent refused rank %d: %s", self.rank, message.get("reason"))
            self._stop.wait(RECONNECT_MAX_S * 5)
            raise ConnectionError("refused by the host agent")
        if kind != "allocation":
            raise ValueError(f"unknown message type {kind!r}")
        generation = message["generation"]
        if self._stop.is_set():
            # Stopped: the rank's pipeline is being stopped (or is); an allocation read just
            # before is not applied, and no answer is sent on a connection being closed.
            log.info("rank %d stopped; not applying allocation %s", self.rank, message["workers"])
            return
        try:
            with self._uncut(f"the pipeline's apply({dict(message['workers'])})"):
                self.pipeline.apply(dict(message["workers"]))
        except Exception as exc:  # the pipeline's own checks, or a failure to resize
            self.refused_total += 1
            log.warning(
                "rank %d refused allocation %s: %s", self.rank, message["workers"], str(exc)
            )
            lines.send({"type": "refused", "generation": generation, "reason": str(exc)})
            return
        self.applied_total += 1
        log.info("rank %d applied allocation %s", self.rank, message["workers"])
        lines.send(
            {
                "type": "applied",
                "generation": generation,
                "allocation": dict(self.pipeline.allocation),
            }
        )


class HostedAgent:
    """The host agent a rank's process runs: the ranks' socket and the agent that reports them."""

    def __init__(self, hub: HostPipelines, agent: Any) -> None:
        self.hub = hub
        self.agent = agent

    def stop(self) -> None:
        """Stop the agent (its last batch goes out), then close the ranks' socket."""
        self.agent.stop()
        self.hub.stop()


class RankAttachment:
    """What :func:`agents.attach` returns in a rank of a multi-rank host."""

    def __init__(self, link: RankLink) -> None:
        self.link = link

    @property
    def rank(self) -> int:
        """This process's local rank."""
        return self.link.rank

    @property
    def ranks(self) -> int:
        """The host's local world size."""
        return self.link.ranks

    @property
    def agent(self) -> Any:
        """The host's agent when this rank's process runs it, else ``None``."""
        return self.link.hosted.agent if self.link.hosted is not None else None

    @property
    def applied_total(self) -> int:
        """Allocations this rank applied."""
        return self.link.applied_total

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop reporting (and the host agent when this rank runs it); the pipeline goes on.
        Whether the link's thread has ended (:meth:`RankLink.stop`)."""
        return self.link.stop(timeout_s)

    def __enter__(self) -> RankAttachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Where launchers put a process's local rank and its host's count of ranks, in the order they
# are read: the first family whose rank is set is the one used (torchrun inside a SLURM
# allocation sets both torchrun's and SLURM's; torchrun's describe its own processes).
LAUNCHER_ENV = (
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),  # torchrun, accelerate, DeepSpeed, Lightning (rank only)
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # Open MPI's mpirun
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),  # MVAPICH2
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # MPICH's Hydra, Intel MPI
    ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),  # srun (the count: see _slurm_tasks_here)
)


def _whole(env: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env}={raw!r} is not a whole number (its launcher sets it)") from None


def _slurm_tasks_here() -> str | None:
    """This node's count of tasks from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of
    the first three nodes, 1 on the fourth) at ``SLURM_NODEID``, for an ``srun`` started
    without ``--ntasks-per-node``."""
    spec, node = os.environ.get("SLURM_TASKS_PER_NODE"), os.environ.get("SLURM_NODEID")
    if not spec or node in (None, ""):
        return None
    counts: list[str] = []
    for part in spec.split(","):
        count, _, times = part.partition("(x")
        counts += [count] * (_whole("SLURM_TASKS_PER_NODE", times.rstrip(")")) if times else 1)
    index = _whole("SLURM_NODEID", node)
    return counts[index] if 0 <= index < len(counts) else None


def local_rank_and_world(rank: int | None = None, ranks: int | None = None) -> tuple[int, int]:
    """This process's local rank and the host's local world size: the arguments, else what
    its launcher set (``LAUNCHER_ENV``: torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``,
    Open MPI's, MVAPICH2's, MPICH's, SLURM's), else rank 0 of 1."""
    family = next(
        (pair for pair in LAUNCHER_ENV if os.environ.get(pair[0]) not in (None, "")),
        LAUNCHER_ENV[0],
    )
    rank_env, size_env = family
    if rank is None:
        raw = os.environ.get(rank_env)
        rank = 0 if raw in (None, "") else _whole(rank_env, raw)
    if ranks is None:
        raw = os.environ.get(size_env)
        if raw in (None, "") and rank_env == "SLURM_LOCALID":
            raw = _slurm_tasks_here()
        ranks = 1 if raw in (None, "") else _whole(size_env, raw)
    rank, ranks = int(rank), int(ranks)
    if ranks < 1 or not 0 <= rank < ranks:
        hint = ""
        if rank_env == "LOCAL_RANK" and not os.environ.get(size_env):
            hint = (
                f"; {rank_env} is set without {size_env} (PyTorch Lightning's own launcher "
                f"does that): export {size_env}, the ranks (devices) on each host"
            )
        raise ValueError(
            f"local rank {rank} of {ranks} ranks: a rank is between 0 and the local world size "
            f"minus one ({rank_env}, {size_env}){hint}"
        )
    return rank, ranks
