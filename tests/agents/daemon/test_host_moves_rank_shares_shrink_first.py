"""When the host agent moves its ranks to new shares of an allocation, the ranks shrink before
they grow: at no moment do they run, or does the host report, more workers than the old or the
new shares give the host.

A 2-rank torchrun job was once seen at 14 workers on 12 slots: its ranks' shares moved in
opposite directions, each rank was sent its share at once, and the one that grew was counted
before the one that shrank had answered. Here the ranks answer in a generated order, and some
send a fresh report right after they apply (as a real rank does within its report interval)
while the others' last report predates the move.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from .rank_ends import host_with_ranks

STAGES = ["read", "parse", "collate"]
shares = st.fixed_dictionaries({s: st.integers(1, 6) for s in STAGES})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(shares, st.floats(0.05, 1.0), st.booleans()), min_size=2, max_size=4),
    shares,
    st.randoms(use_true_random=False),
)
def test_the_ranks_never_run_more_than_the_old_or_the_new_shares_during_a_move(
    ranks_now, allocation, random
):
    order = list(range(len(ranks_now)))
    random.shuffle(order)  # the order in which the ranks are sent their share and answer
    host, ends = host_with_ranks(ranks_now, order)
    old_total = sum(sum(end.workers.values()) for end in ends.values())

    host.apply(allocation)

    new_total = sum(sum(end.workers.values()) for end in ends.values())
    assert new_total <= len(ends) * sum(allocation.values()), "the split keeps the host's total"
    bound = max(old_total, new_total)
    for end in ends.values():
        for running, reported in end.seen:
            assert running <= bound, (running, old_total, new_total)
            assert reported <= bound, ("the host's report", reported, old_total, new_total)
    assert host.rank_workers() == {rank: end.workers for rank, end in ends.items()}


def test_a_rank_that_shrinks_is_sent_its_share_before_one_that_grows():
    # Rank 1 is connected first, so without the ordering it would be sent its share first.
    host, ends = host_with_ranks([({"parse": 7}, 0.2, False), ({"parse": 5}, 0.9, False)], [1, 0])
    host.apply({"parse": 6})
    sent = sorted(
        (message["generation"], rank, message["workers"]["parse"])
        for rank, end in ends.items()
        for message in end.sent
    )
    assert sent[0][1:] == (0, 3), sent  # rank 0 shrinks from 7 to 3 first
    assert sent[-1][1:] == (1, 9), sent  # then rank 1 grows from 5 to 9
    assert all(running <= 12 for end in ends.values() for running, _ in end.seen)
