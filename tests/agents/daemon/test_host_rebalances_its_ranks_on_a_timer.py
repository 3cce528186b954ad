"""The host agent splits the allocation in force among its ranks again when their needs drift,
without a new allocation: on a timer, only when the new split lightens a stage's most loaded
rank by agents.budget.REBALANCE_GAIN or more, and shrink before grow."""

import time
import uuid

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agents.budget import REBALANCE_GAIN, split_across_ranks, split_gain
from agents.daemon.ranks import bind_listener, socket_address

from .rank_ends import host_with_ranks


def test_a_rank_that_becomes_busier_gets_more_workers_without_a_new_allocation():
    host, ends = host_with_ranks([({"parse": 4}, 0.5, False), ({"parse": 4}, 0.5, False)])
    host.apply({"parse": 4})
    assert [end.workers for end in ends.values()] == [{"parse": 4}, {"parse": 4}]
    assert not host.rebalance(), "nothing drifted"

    ends[1].report(1.0)  # rank 1's items now cost twice as much: 4 busy workers against 2
    ends[0].report(0.5)
    assert host.rebalance()
    assert ends[0].workers["parse"] < ends[1].workers["parse"]
    assert ends[0].workers["parse"] + ends[1].workers["parse"] == 8, "the host's total kept"
    assert all(running <= 8 for end in ends.values() for running, _ in end.seen)
    assert host.allocation == {"parse": 4}, "the allocation in force is the control plane's"
    assert host.rebalances == 1
    ends[0].report()
    ends[1].report()
    assert not host.rebalance(), "the needs it moved for have not changed"


def test_a_drift_that_would_gain_little_moves_nothing():
    host, ends = host_with_ranks([({"parse": 10}, 0.5, False), ({"parse": 10}, 0.5, False)])
    host.apply({"parse": 10})
    # Needs 5 and 8 busy workers: past ALIKE_WITHIN (1.5x), so the split would change, but the
    # busier rank's load per worker would fall from 0.8 to about 0.67, less than 1.25x.
    ends[1].report(0.8)
    new = host.split({"parse": 10}, [0, 1])
    assert new != {0: {"parse": 10}, 1: {"parse": 10}}
    assert not host.rebalance()
    assert [end.workers["parse"] for end in ends.values()] == [10, 10]


def test_nothing_moves_before_an_allocation_or_while_a_rank_is_silent():
    host, ends = host_with_ranks([({"parse": 4}, 0.1, False), ({"parse": 4}, 0.9, False)])
    assert not host.rebalance(), "no allocation in force yet"
    host.apply({"parse": 4})
    moved = host.rebalances
    ends[0].link.reported_at -= 3600  # rank 0 has said nothing for an hour
    ends[1].report(0.2)
    assert not host.rebalance()
    assert host.rebalances == moved


def test_the_timer_rebalances_the_ranks():
    listener = bind_listener(socket_address(f"@rebalance-test-{uuid.uuid4().hex}"))
    host, ends = host_with_ranks(
        [({"parse": 4}, 0.5, False), ({"parse": 4}, 0.5, False)], rebalance_s=0.1
    )
    host.listener.close()
    host.listener = listener
    host.start()
    try:
        host.apply({"parse": 4})
        ends[1].report(1.0)
        deadline = time.monotonic() + 10
        while host.rebalances == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.rebalances == 1, "rebalanced within 10 s on a 0.1 s timer"
        assert ends[0].workers["parse"] < ends[1].workers["parse"]
    finally:
        host.stop()


stage_shares = st.fixed_dictionaries({s: st.integers(1, 8) for s in ["read", "parse"]})
# A report carries each busy fraction to 4 decimals (agents.daemon.sample.stage_fields): drawn
# at that resolution, the hub splits by the needs this test computes. Drawn finer, a tie the
# test's split breaks one way (needs 3 x 1/3 against 3.0) the hub's 0.9999 breaks the other.
busy = st.fixed_dictionaries(
    {s: st.integers(100, 10_000).map(lambda n: n / 10_000) for s in ["read", "parse"]}
)


@settings(max_examples=150, deadline=None)
@given(stage_shares, st.lists(busy, min_size=2, max_size=4), st.lists(busy, min_size=4, max_size=4))
def test_a_rebalance_keeps_each_stages_total_and_never_exceeds_it_while_moving(
    allocation, busy_then, busy_now
):
    ranks = len(busy_then)
    host, ends = host_with_ranks([(dict(allocation), b, True) for b in busy_then])
    host.apply(allocation)
    for rank, end in ends.items():
        end.seen.clear()
        end.report(busy_now[rank])
    before = {rank: dict(end.workers) for rank, end in ends.items()}
    needs = {r: {s: e.workers[s] * busy_now[r][s] for s in allocation} for r, e in ends.items()}
    expected = split_across_ranks(allocation, needs, {s: 64 for s in allocation})

    gain = split_gain(needs, before, expected)
    # At the threshold itself the hub's sums and these differ in the last bits (seen: 1.25 there,
    # 1.2499999999999998 here); either answer is right for a gain of exactly REBALANCE_GAIN.
    assume(abs(gain - REBALANCE_GAIN) > 1e-9)

    moved = host.rebalance()

    assert moved == (expected != before and gain >= REBALANCE_GAIN)
    for stage, count in allocation.items():
        assert sum(end.workers[stage] for end in ends.values()) == ranks * count
    bound = ranks * sum(allocation.values())
    assert all(r <= bound and p <= bound for end in ends.values() for r, p in end.seen)
