"""A host with two local ranks has one agent: each rank's attach() reports to it over a local
socket, the control plane sees one host whose stages sum the ranks', every rank applies the
allocation, and neither a rank leaving nor the host agent's rank ending stops the others.

Both ranks run in this one process (two real pipelines, two consumers, two links over a real Unix
socket) so that the test can end one of them at a chosen moment; tests/e2e runs them as two
torchrun processes."""

from __future__ import annotations

import uuid

import pytest

from agents import attach
from agents.daemon.ranks import local_rank_and_world

from .conftest import Consumer, applied_shares, counting_pipeline


@pytest.fixture
def two_ranks():
    pipelines = [counting_pipeline().start() for _ in range(2)]
    consumers = [Consumer(p).start() for p in pipelines]
    yield pipelines
    for c in consumers:
        c.stop()
    for p in pipelines:
        p.stop()


def attach_ranks(control_plane, host, pipelines, socket_name):
    return [
        attach(
            pipelines[rank],
            url=control_plane.url,
            host_id=host.id,
            token=host.token,
            rank=rank,
            local_world_size=2,
            rank_socket=socket_name,
            interval_s=0.2,
            batch_seconds=0.3,
            poll_wait_s=1.0,
        )  # fmt: skip
        for rank in range(2)
    ]


def test_two_ranks_report_as_one_host_and_both_apply_its_allocation(
    control_plane, two_ranks, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    attached = attach_ranks(control_plane, host, two_ranks, f"\0intune-test-{uuid.uuid4().hex}")
    try:
        wait_for(lambda: all(a.link.connected.is_set() for a in attached), what="both connected")
        hosts = [a for a in attached if a.agent is not None]
        assert len(hosts) == 1, "exactly one rank's process runs the host agent"
        wait_for(
            lambda: host.samples and len(host.samples[max(host.samples)].get("ranks", [])) == 2,
            what="a sample with both ranks",
        )
        sample = host.samples[max(host.samples)]
        assert sample["host"]["ranks"] == 2
        assert {s["name"]: s["workers"] for s in sample["stages"]} == {"parse": 2, "transform": 2}
        assert sample["trainer"]["throughput"] == pytest.approx(
            sum(r["throughput"] for r in sample["ranks"]), rel=1e-3
        )
        # The allocation is per rank, and the ranks share the host's budget: on this host's
        # 2 CPUs, 6 slots (2 CPUs + 2 stages x 2 ranks) hold 2 x (2 + 1) workers, not 2 x (3 + 1).
        agent = hosts[0].agent
        budget = agent.worker_budget
        assert budget == 2 + 2 * 2 or agent.host.limits.cpus >= 3
        too_many = {"parse": budget // 2, "transform": 1}
        control_plane.publish(host.id, too_many)
        wait_for(lambda: agent.refused_total == 1, what="the host agent to refuse it")
        assert [p.allocation for p in two_ranks] == [{"parse": 1, "transform": 1}] * 2
        fits = {"parse": budget // 2 - 1, "transform": 1}
        control_plane.publish(host.id, fits)
        wait_for(lambda: applied_shares(two_ranks, fits), what="both ranks to apply their shares")
        assert all(p.allocation.keys() == fits.keys() for p in two_ranks)
        wait_for(lambda: agent.applied_version == 3, what="the host to report it")
        wait_for(
            lambda: (
                {s["name"]: s["workers"] for s in host.samples[max(host.samples)]["stages"]}
                == {"parse": 2 * fits["parse"], "transform": 2}
            ),
            what="samples summing both ranks' workers",
        )
    finally:
        for a in attached:
            a.stop()


def test_the_other_rank_takes_over_when_the_host_agents_rank_ends(
    control_plane, two_ranks, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    attached = attach_ranks(control_plane, host, two_ranks, f"\0intune-test-{uuid.uuid4().hex}")
    try:
        wait_for(lambda: all(a.link.connected.is_set() for a in attached), what="both connected")
        control_plane.publish(host.id, {"parse": 2, "transform": 1})
        wait_for(
            lambda: applied_shares(two_ranks, {"parse": 2, "transform": 1}),
            what="both ranks to apply their shares",
        )
        hosting = next(a for a in attached if a.agent is not None)
        other = next(a for a in attached if a is not hosting)
        share = dict(two_ranks[other.rank].allocation)
        hosting.stop()  # the host agent's rank ends; the other keeps training
        assert two_ranks[other.rank].allocation == share
        # Alone on the host, it is the whole job: the next host agent (its own) gives it the
        # allocation in force whole.
        wait_for(lambda: other.agent is not None, timeout=15, what="the other rank to take over")
        wait_for(lambda: other.agent.applied_version == 2, timeout=15, what="it to catch up")
        assert two_ranks[other.rank].allocation == {"parse": 2, "transform": 1}
        control_plane.publish(host.id, {"parse": 1, "transform": 1})
        wait_for(
            lambda: two_ranks[other.rank].allocation == {"parse": 1, "transform": 1},
            timeout=15,
            what="the remaining rank to apply the next allocation",
        )
        wait_for(
            lambda: (
                host.samples
                and [r["rank"] for r in host.samples[max(host.samples)].get("ranks", [])]
                == [other.rank]
            ),
            timeout=15,
            what="samples of the one rank left",
        )
    finally:
        for a in attached:
            a.stop()


def test_a_rank_beyond_the_local_world_size_is_refused_with_a_reason(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="local rank 2 of 2 ranks"):
        local_rank_and_world()
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ValueError, match="LOCAL_RANK='one' is not a whole number"):
        local_rank_and_world()
