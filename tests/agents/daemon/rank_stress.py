"""Generated multi-rank hosts under generated operations, for the stress tests (short and soak).

A scenario is a host of 2 to 4 local ranks, each a real :class:`~agents.daemon.ranks.RankLink`
over a real Unix socket in the abstract namespace, every one able to host the agent
(``host_here`` starts a real :class:`~agents.daemon.ranks.HostPipelines`), and a sequence of
operations: ranks joining (in a generated order, some late), allocations (within and beyond
the stages' bounds), rebalances, a rank leaving cleanly, a rank's connection cut, a rank
that stops answering, a rank whose pipeline refuses, the hosting rank stopping (another takes
over) and the hub stopped under its ranks.

Each rank's pipeline is :class:`RankPipeline`, a stand-in that only holds its allocation: the
hub and the links are under test, not the pipeline (tests/agents/pipeline/stress.py stresses
that), and a stand-in can refuse or stop answering on cue. A sampler thread sums the pipelines'
workers per stage all along, so that a move that grows a rank before another shrank is seen
however briefly it lasts.

Every operation runs under a bound (stress.bounded); a bound that passes fails the case with
every thread's stack and the case's operations.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import strategies as st

from agents.daemon import ranks as ranks_module
from agents.daemon.ranks import HostPipelines, RankLink
from agents.daemon.ranks import _process_lives as real_process_lives
from tests.agents.pipeline.stress import Hang, bounded

STAGES = ["read", "parse", "collate"]
MAX_WORKERS = 4  # each stage's bound per rank
INTERVAL_S = 0.1  # the ranks' report interval
APPLY_TIMEOUT_S = 0.6  # the hub's wait for a rank's answer
# A move is at most two steps (shrink, grow) and a refused one moves back in two more, each
# waiting at most apply_timeout_s; the rest is slack for a 2-core machine kept busy.
APPLY_BOUND_S = 4 * APPLY_TIMEOUT_S + 3.0
STOP_BOUND_S = 5.0  # a link's stop(): its thread's join (2 s) and its hub's stop
SETTLE_S = 8.0  # for the ranks to reconnect (RECONNECT_MAX_S 2) and take their shares
MUTE_S = 20.0  # the longest a muted rank stays silent (it is let go at the case's end)


class RankPipeline:
    """A rank's pipeline as the link sees it: stages, an allocation it applies, metrics.

    ``refuse`` makes it refuse the next allocation (as a pipeline's own checks would);
    ``mute`` makes ``apply`` block until ``release`` (a rank whose process stopped answering).
    """

    def __init__(self, busy: float) -> None:
        self.stage_names = list(STAGES)
        self.stages = [_Stage(name) for name in STAGES]
        self._allocation = dict.fromkeys(STAGES, 1)
        self.busy = busy
        self.refuse = False
        self.muted = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    @property
    def allocation(self) -> dict[str, int]:
        with self._lock:
            return dict(self._allocation)

    def apply(self, allocation: dict[str, int]) -> None:
        if self.muted.is_set():
            self.release.wait(MUTE_S)
        if set(allocation) - set(STAGES) or any(
            not 1 <= int(n) <= MAX_WORKERS for n in allocation.values()
        ):
            raise ValueError(f"allocation {allocation} is outside 1..{MAX_WORKERS} a stage")
        if self.refuse:
            self.refuse = False
            raise ValueError("this rank's pipeline refuses it")
        with self._lock:
            self._allocation.update({k: int(v) for k, v in allocation.items()})

    def metrics(self) -> list[dict]:
        return [
            {"name": name, "workers": count, "busy_fraction": self.busy, "items_per_s": 10.0}
            for name, count in self.allocation.items()
        ]


@dataclass(frozen=True)
class _Stage:
    name: str
    kind: str = "process"
    max_workers: int = MAX_WORKERS


#: The pids the stand-in ranks say hello with (above Linux's largest, 2**22).
PSEUDO_PID = 2**30


class _Hosted:
    """What ``host_here`` returns: the hub this rank's process runs."""

    def __init__(self, hub: HostPipelines) -> None:
        self.hub = hub

    def stop(self) -> None:
        self.hub.stop()


@dataclass
class Scenario:
    """A generated host: its ranks' world size, how busy each rank's stages are, whether the
    hub rebalances on a timer, and the operations."""

    ranks: int
    busy: list[float]
    rebalance_s: float | None
    operations: list[tuple] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"Scenario(ranks={self.ranks}, busy={self.busy}, rebalance_s={self.rebalance_s}, "
            f"operations={self.operations})"
        )


@st.composite
def scenarios(draw, max_operations: int = 10) -> Scenario:
    """Random hosts with random operations."""
    n = draw(st.integers(2, 4))
    rank = st.integers(0, n - 1)
    count = st.integers(1, MAX_WORKERS) | st.integers(MAX_WORKERS + 1, MAX_WORKERS + 2)
    allocation = st.fixed_dictionaries({s: st.integers(1, MAX_WORKERS) for s in STAGES}) | (
        st.fixed_dictionaries({s: count for s in STAGES})
    )
    operation = st.one_of(
        st.tuples(st.just("join"), rank),
        st.tuples(st.just("apply"), allocation),
        st.tuples(st.just("apply"), allocation),
        st.tuples(st.just("busy"), rank, st.sampled_from([0.1, 0.5, 0.95])),
        st.tuples(st.just("rebalance")),
        st.tuples(st.just("leave"), rank),
        st.tuples(st.just("cut"), rank),
        st.tuples(st.just("mute"), rank),
        st.tuples(st.just("refuse"), rank),
        st.tuples(st.just("refuse"), rank),
        st.tuples(st.just("stop_host")),
        st.tuples(st.just("stop_hub")),
        st.tuples(st.just("wait"), st.sampled_from([0.0, 0.05, 0.3])),
    )
    # Some ranks join first, in a random order; the others may join late, as operations.
    first = draw(st.lists(rank, min_size=1, max_size=n, unique=True))
    return Scenario(
        ranks=n,
        busy=draw(st.lists(st.sampled_from([0.1, 0.5, 0.95]), min_size=n, max_size=n)),
        rebalance_s=draw(st.sampled_from([None, 0.2])),
        operations=[("join", r) for r in first]
        + draw(st.lists(operation, max_size=max_operations)),
    )


class Host:
    """The scenario's ranks, their links, the hubs they started, and a sampler of the host's
    workers per stage."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.address = f"\0intune-rankfuzz-{uuid.uuid4().hex}"
        self.pipelines = [RankPipeline(busy) for busy in scenario.busy]
        self.links: dict[int, RankLink] = {}
        self.left: set[int] = set()  # ranks that left cleanly: their workers ended
        self.hubs: list[HostPipelines] = []
        self._hubs_lock = threading.Lock()
        # The per-rank allocations a sample is allowed to reach: the one in force and the one
        # being moved to (max of old and new, stage by stage).
        self.allowed = dict.fromkeys(STAGES, 1)
        self.over: list[str] = []
        self._sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="test-sampler", daemon=True)

    # -- the ranks' side ------------------------------------------------------------------

    def host_here(self, listener: socket.socket) -> _Hosted:
        hub = HostPipelines(
            listener,
            self.scenario.ranks,
            interval_s=INTERVAL_S,
            apply_timeout_s=APPLY_TIMEOUT_S,
            rebalance_s=self.scenario.rebalance_s,
        )
        with self._hubs_lock:
            self.hubs.append(hub)
        return _Hosted(hub.start())

    def join(self, rank: int) -> None:
        if rank in self.links:
            return
        self.links[rank] = RankLink(
            self.pipelines[rank],
            rank,
            self.scenario.ranks,
            self.address,
            trainer_stats=lambda: {"throughput": 100.0, "idle_fraction": 0.1},
            host_here=self.host_here,
            interval_s=INTERVAL_S,
        )
        # Every rank runs in this one process: each says hello with a pid of its own, which
        # the hub finds alive (_process_lives, patched by run_scenario) until the rank left.
        self.links[rank].pid = PSEUDO_PID + rank
        self.links[rank].start()

    def process_lives(self, pid: int) -> bool:
        """Whether a rank's process lives: a stand-in rank's until it left."""
        if pid >= PSEUDO_PID:
            return pid - PSEUDO_PID in self.links and pid - PSEUDO_PID not in self.left
        return real_process_lives(pid)

    def live(self) -> list[int]:
        """The ranks whose pipelines run: joined and not left."""
        return sorted(r for r in self.links if r not in self.left)

    def hub(self) -> HostPipelines | None:
        """The hub running now (the newest not stopped)."""
        with self._hubs_lock:
            running = [h for h in self.hubs if not h._stop.is_set()]
        return running[-1] if running else None

    # -- the sampler ------------------------------------------------------------------------

    def start_sampling(self) -> None:
        self._sampling.set()
        self._sampler.start()

    def stop_sampling(self) -> None:
        self._sampling.clear()
        self._sampler.join(2.0)

    def _sample(self) -> None:
        while self._sampling.is_set():
            hub = self.hub()
            ranks = hub.ranks if hub else self.scenario.ranks
            total = sum((Counter(self.pipelines[r].allocation) for r in self.live()), Counter())
            allowed = dict(self.allowed)
            for stage, count in total.items():
                if count > allowed[stage] * ranks and len(self.over) < 5:
                    self.over.append(
                        f"{stage}: {count} workers on the host, above {allowed[stage]} x {ranks}"
                    )
            time.sleep(0.001)

    # -- the end ----------------------------------------------------------------------------

    def stop(self) -> list[int]:
        """Let the muted ranks go, stop every link (bounded), then every hub; return the ranks
        whose link's thread had not ended when its stop returned.

        The ranks that left are stopped again: a muted rank's link may have outlived its stop
        inside its pipeline's apply (its stop said so); let go, it must end now."""
        for pipeline in self.pipelines:
            pipeline.release.set()
        unended = []
        for rank, link in list(self.links.items()):
            ended, _ = bounded(f"rank {rank}'s stop at the end", STOP_BOUND_S, link.stop, 2.0)
            if not ended:
                unended.append(rank)
        for hub in list(self.hubs):
            bounded("a hub's stop at the end", STOP_BOUND_S, hub.stop)
        return unended


def rank_threads() -> set[threading.Thread]:
    """The threads of the ranks' links and hubs alive now."""
    return {t for t in threading.enumerate() if t.name.startswith("intune-rank")}


def unix_sockets() -> int:
    """How many Unix sockets this process holds (its descriptors that are sockets)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
    return count


def wait_until(condition, seconds: float, what, scenario: Scenario) -> None:
    """Poll ``condition()`` for at most ``seconds``; fail naming ``what`` (a string, or a
    function that says what is left) and the scenario, with every thread's stack on stderr."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            said = what() if callable(what) else what
            raise Hang(f"{said}: not within {seconds} s in {scenario}")
        time.sleep(0.01)


@dataclass
class Tally:
    """What the stress runs did, for docs/reliability.md."""

    runs: int = 0
    operations: int = 0
    applied: int = 0
    refused: int = 0
    takeovers: int = 0
    hangs: int = 0
    longest_apply_s: float = 0.0
    longest_stop_s: float = 0.0
    outlived_stops: int = 0  # a muted rank's link held in its apply past its stop (said so)


def _expected_share(hub: HostPipelines, rank: int) -> dict[str, int] | None:
    with hub._lock:
        share = hub._split.get(rank, hub._in_force)
    return dict(share) if share is not None else None


def _on_their_shares(host: Host, hub: HostPipelines) -> bool:
    """Whether every rank connected to ``hub`` runs the share the hub holds for it."""
    for rank in hub.connected_ranks():
        share = _expected_share(hub, rank)
        if share is not None and host.pipelines[rank].allocation != share:
            return False
    return True


def _apply(host: Host, hub: HostPipelines, allocation: dict[str, int], tally: Tally) -> None:
    scenario = host.scenario
    before = hub._in_force, dict(hub._split)
    valid = all(1 <= n <= MAX_WORKERS for n in allocation.values())
    known = bool(hub.stage_names)  # else the hub cannot check it, and may refuse it
    host.allowed = {s: max(host.allowed[s], allocation[s] if valid else 0) for s in STAGES}
    try:
        _, took = bounded(f"apply {allocation} in {scenario}", APPLY_BOUND_S, hub.apply, allocation)
        tally.longest_apply_s = max(tally.longest_apply_s, took)
        assert valid, f"apply {allocation} beyond the stages' bounds was taken in {scenario}"
        tally.applied += 1
        host.allowed = dict(allocation)
    except ValueError as exc:
        assert not valid or not known, f"apply {allocation} refused ({exc}) in {scenario}"
        assert (hub._in_force, hub._split) == before, f"a refused one changed the host: {scenario}"
    except RuntimeError:
        tally.refused += 1  # a rank refused: the host is back on ``before``
        if hub._in_force is not None:
            host.allowed = {s: max(host.allowed[s], hub._in_force[s]) for s in STAGES}
    wait_until(
        lambda: hub._stop.is_set() or _on_their_shares(host, hub),
        SETTLE_S,
        "every connected rank on its share after an apply",
        scenario,
    )


def run_scenario(scenario: Scenario, tally: Tally) -> None:
    """Run one scenario; raise on a hang or a broken invariant, naming the scenario."""
    threads_before, sockets_before = rank_threads(), unix_sockets()
    host = Host(scenario)
    tally.runs += 1
    host.start_sampling()
    ranks_module._process_lives = host.process_lives
    try:
        for operation in scenario.operations:
            tally.operations += 1
            kind = operation[0]
            hub = host.hub()
            if kind == "join" and operation[1] not in host.left:
                host.join(operation[1])
            elif kind == "apply" and hub is not None:
                _apply(host, hub, operation[1], tally)
            elif kind == "rebalance" and hub is not None:
                bounded(f"rebalance in {scenario}", APPLY_BOUND_S, hub.rebalance)
            elif kind in ("leave", "stop_host"):
                rank = operation[1] if kind == "leave" else _hosting(host)
                if rank is None or rank not in host.links or rank in host.left:
                    continue
                tally.takeovers += host.links[rank].hosting
                ended, took = bounded(
                    f"rank {rank}'s stop in {scenario}", STOP_BOUND_S, host.links[rank].stop, 2.0
                )
                tally.longest_stop_s = max(tally.longest_stop_s, took)
                # Only a muted rank's apply may hold its link past the stop (its stop says so).
                assert ended or host.pipelines[rank].muted.is_set(), (
                    f"rank {rank}'s link outlived its stop(2.0) with nothing holding it in "
                    f"{scenario}"
                )
                tally.outlived_stops += not ended
                host.left.add(rank)
            elif kind == "cut" and operation[1] in host.links:
                lines = host.links[operation[1]]._lines
                if lines is not None:
                    with contextlib.suppress(OSError):
                        lines.sock.shutdown(socket.SHUT_RDWR)
            elif kind == "mute":
                host.pipelines[operation[1]].muted.set()
            elif kind == "busy":
                host.pipelines[operation[1]].busy = operation[2]
                time.sleep(2 * INTERVAL_S)  # its next report says so
            elif kind == "refuse":
                host.pipelines[operation[1]].refuse = True
            elif kind == "stop_hub" and hub is not None:
                bounded(f"hub.stop() in {scenario}", STOP_BOUND_S, hub.stop)
            elif kind == "wait":
                time.sleep(operation[1])
        _finish(host, tally)
    except Hang:
        tally.hangs += 1
        raise
    finally:
        host.stop_sampling()
        unended = host.stop()
        ranks_module._process_lives = real_process_lives
    assert not unended, f"ranks {unended}' links outlived their stop at the end in {scenario}"
    assert not host.over, f"the host ran more workers than allowed: {host.over} in {scenario}"
    left = sorted(t.name for t in rank_threads() - threads_before)
    assert not left, f"threads {left} left after stop in {scenario}"
    wait_until(  # a closed socket leaves the descriptor table when its last user lets go
        lambda: unix_sockets() <= sockets_before,
        1.0,
        lambda: f"{unix_sockets() - sockets_before} sockets left after stop",
        scenario,
    )


def _hosting(host: Host) -> int | None:
    return next((r for r, link in host.links.items() if link.hosting and r not in host.left), None)


def _finish(host: Host, tally: Tally) -> None:
    """Let the muted ranks go; once every live rank is back with a hub, one more allocation
    reaches every rank: each on its share, the shares summing to ranks x per rank."""
    scenario = host.scenario
    for pipeline in host.pipelines:
        pipeline.muted.clear()
        pipeline.release.set()
        pipeline.refuse = False
    live = host.live()
    if not live:
        return
    allocation = {"read": 2, "parse": 1, "collate": MAX_WORKERS}
    for _ in range(3):  # a rank cut at the end may be away a moment: its process still runs
        wait_until(
            lambda: host.hub() is not None and host.hub().connected_ranks() == live,
            SETTLE_S,
            f"ranks {live} connected to one hub",
            scenario,
        )
        hub = host.hub()
        refused = tally.refused
        _apply(host, hub, allocation, tally)
        if tally.refused == refused:
            break
    expected = {s: len(live) * n for s, n in allocation.items()}

    def settled() -> bool:
        shares = [host.pipelines[r].allocation for r in live]
        total = sum((Counter(share) for share in shares), Counter())
        return (
            hub.connected_ranks() == live
            and _on_their_shares(host, hub)
            and all(min(share.values()) >= 1 for share in shares)
            and total == expected
        )

    wait_until(
        settled,
        SETTLE_S,
        lambda: (
            f"every rank on its share of {allocation}, {expected} in all; connected "
            f"{hub.connected_ranks()}, shares {[host.pipelines[r].allocation for r in live]}"
        ),
        scenario,
    )
