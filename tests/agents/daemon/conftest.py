"""Fixtures for the agent daemon's tests: a stand-in control plane and a real counting pipeline.

The stand-in (tests.support.standin_control_plane) speaks protocol v1 in memory; the Django control plane is
exercised against the agent in tests/e2e. The pipeline is the real agents.pipeline.Pipeline.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from agents.daemon.agent import Agent, AgentConfig
from agents.pipeline import Pipeline, Stage, consume_until
from tests.support.standin_control_plane import StandinControlPlane

STAGES = ["parse", "transform"]


def parse(n: int) -> int:
    return n * 2


def transform(n: int) -> int:
    return n + 1


_held: list[bytes] = []  # a worker's own memory (holding), made at its first item


def holding(n: int, own_mb: int) -> int:
    """``n``, from a worker that holds ``own_mb`` MB of its own (written, so resident) from its
    first item on."""
    if own_mb and not _held:
        _held.append(b"\x01" * (own_mb << 20))
    time.sleep(0.001)
    return n


def counting_pipeline(**stage_options: dict) -> Pipeline:
    """A pipeline over 0, 1, 2, ... whose item n arrives as 2n + 1."""
    return Pipeline(
        itertools.count(),
        [
            Stage("parse", parse, workers=1, max_workers=4, **stage_options.get("parse", {})),
            Stage("transform", transform, workers=1, kind="thread", max_workers=4),
        ],
        queue_size=8,
        name="counting",
    )


def applied_shares(pipelines, per_rank: dict[str, int]) -> bool:
    """Whether every rank runs a share of ``per_rank`` (at least one worker a stage) and the
    shares keep the host's total, ``len(pipelines) x per_rank``. The shares are equal only when
    the ranks measure alike (agents.budget.split_across_ranks); under CPU load two identical
    pipelines may not, and the host agent splits the same total by their needs."""
    host_total = sum((Counter(p.allocation) for p in pipelines), Counter())
    return all(min(p.allocation.values()) >= 1 for p in pipelines) and host_total == {
        stage: len(pipelines) * count for stage, count in per_rank.items()
    }


class Consumer:
    """The trainer's stand-in: takes items from the pipeline at a steady pace in a thread and
    records when each arrived, so a test can tell whether training ever paused."""

    def __init__(self, pipeline: Pipeline, step_s: float = 0.002) -> None:
        self.pipeline = pipeline
        self.step_s = step_s
        self.items: list[int] = []
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-consumer", daemon=True)

    def _run(self) -> None:
        def step(item) -> None:
            self.items.append(item)
            self.times.append(time.monotonic())
            if not self._stop.is_set():
                time.sleep(self.step_s)  # the "training step"

        consume_until(self.pipeline, self._stop, step)

    def start(self) -> Consumer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def consumed_between(self, start: float, end: float) -> list[float]:
        """Arrival times within [start, end]."""
        return [t for t in self.times if start <= t <= end]


def _wait_for(condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def control_plane():
    plane = StandinControlPlane().start()
    yield plane
    plane.stop()


@pytest.fixture
def pipeline():
    p = counting_pipeline().start()
    yield p
    p.stop()


@pytest.fixture
def consumer(pipeline):
    c = Consumer(pipeline).start()
    yield c
    c.stop()


@pytest.fixture
def wait_for():
    """``wait_for(condition, timeout=10, what=...)``: poll until true or fail saying what."""
    return _wait_for


# --- the outage drill, shared by the stand-in and real control plane tests ---------------------


def agent_config(url: str, host_id: int, token: str) -> AgentConfig:
    return AgentConfig(
        url=url,
        host_id=host_id,
        token=token,
        interval_s=0.2,  # five samples a second, so a short outage still buffers many
        batch_seconds=0.5,
        poll_wait_s=2.0,
        backoff_initial_s=0.2,
        backoff_max_s=2.0,  # notice the return within 2 s
    )


def ride_out_outage(
    agent, consumer, go_away, come_back, outage_s, wait_for, server_log=lambda: ""
) -> dict:
    """Run the agent, take the control plane away for ``outage_s``, bring it back, wait until
    the agent has sent everything, stop the agent; return what the test needs to judge.
    ``server_log()`` is shown when the control plane does not take the samples back."""
    agent.start()
    try:
        wait_for(lambda: agent.applied_version == 1, timeout=30, what="the default allocation")
        wait_for(lambda: agent.shipped_total >= 5, timeout=30, what="the first samples")
        allocation_before = dict(agent.pipeline.allocation)
        went_away = time.monotonic()
        go_away()
        time.sleep(outage_s)
        buffered_at_return = len(agent.buffer)
        come_back()
        came_back = time.monotonic()
        try:
            wait_for(
                lambda: len(agent.buffer) <= 2 and agent.last_error is None,
                timeout=60,
                what="the agent to send what it held",
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; the agent's last error: {agent.last_error}\n"
                f"control plane log:\n{server_log()[-3000:]}"
            ) from None
        allocation_after = dict(agent.pipeline.allocation)
    finally:
        agent.stop()
    return {
        "first_seq": agent.config.first_seq,
        "last_seq": agent.last_seq,
        "buffered_at_return": buffered_at_return,
        "allocation": (allocation_before, allocation_after),
        "arrivals": consumer.consumed_between(went_away, came_back),
        "outage": (went_away, came_back),
        "dropped": agent.buffer.dropped_total,
    }


class ShippingLog:
    """What an agent sent and what it was told, seen from the agent: wraps the agent's
    ``client.post_metrics`` (and calls it through; nothing is mocked).

    The protocol is at-least-once: a batch the control plane stored but whose answer never
    reached the agent (the connection cut as it went away, a timeout) must be sent again, and
    the control plane stores each sequence number once. So a resend is a defect only when the
    agent had received the acknowledgement of those samples (``resent_acknowledged``);
    ``resent_unacknowledged`` counts the correct resends."""

    def __init__(self, agent: Agent) -> None:
        self.acknowledged: set[int] = set()
        self.sent: set[int] = set()
        self.resent_unacknowledged = 0
        self.resent_acknowledged: list[int] = []
        self._post = agent.client.post_metrics
        agent.client.post_metrics = self._post_metrics  # one shipper thread calls it

    def _post_metrics(self, body: bytes) -> dict:
        seqs = [sample["seq"] for sample in json.loads(body)["samples"]]
        for seq in seqs:
            if seq in self.acknowledged:
                self.resent_acknowledged.append(seq)
            elif seq in self.sent:
                self.resent_unacknowledged += 1
        self.sent.update(seqs)
        answer = self._post(body)
        self.acknowledged.update(seqs)
        return answer


def assert_nothing_lost_duplicated_or_paused(run: dict, stored_seqs: list[int], outage_s: float):
    expected = list(range(run["first_seq"], run["last_seq"] + 1))
    assert run["buffered_at_return"] >= outage_s / 0.2 * 0.5, "the outage really buffered samples"
    assert len(stored_seqs) == len(set(stored_seqs)), "a sample was stored twice"
    assert sorted(stored_seqs) == expected, (
        f"{len(set(expected) - set(stored_seqs))} samples lost, "
        f"{len(set(stored_seqs) - set(expected))} unexpected"
    )
    assert run["dropped"] == 0
    before, after = run["allocation"]
    assert before == after, "the allocation in force changed while the control plane was away"
    arrivals = run["arrivals"]
    start, end = run["outage"]
    assert arrivals, "the trainer consumed nothing during the outage"
    gaps = [b - a for a, b in zip([start, *arrivals], [*arrivals, end], strict=True)]
    assert max(gaps) < 1.0, f"training paused for {max(gaps):.2f} s during the outage"


@pytest.fixture
def outage():
    """The outage drill: ``outage.config(url, host_id, token)``, ``outage.watch(agent)`` (a
    :class:`ShippingLog`), ``outage.ride_out(...)`` and
    ``outage.assert_nothing_lost_duplicated_or_paused(...)``."""
    return SimpleNamespace(
        config=agent_config,
        watch=ShippingLog,
        ride_out=ride_out_outage,
        assert_nothing_lost_duplicated_or_paused=assert_nothing_lost_duplicated_or_paused,
    )


@pytest.fixture
def agent(control_plane, pipeline, consumer, wait_for):
    """An agent on the counting pipeline (parse, transform) with a budget of 4 slots, its
    default allocation applied; yields (agent, host)."""
    host = control_plane.add_host(["parse", "transform"])
    config = AgentConfig(
        url=control_plane.url,
        host_id=host.id,
        token=host.token,
        interval_s=0.2,
        batch_seconds=0.3,
        worker_budget=4,
        poll_wait_s=2.0,
    )
    agent = Agent(pipeline, config).start()
    wait_for(lambda: agent.applied_version == 1, what="the default allocation to be applied")
    yield agent, host
    agent.stop()


def refusals(host) -> dict[int, str]:
    """The reasons the agent reported for the allocations it refused, by version."""
    return {
        r["version"]: r["reason"] for status in host.statuses for r in status.get("refused", [])
    }
