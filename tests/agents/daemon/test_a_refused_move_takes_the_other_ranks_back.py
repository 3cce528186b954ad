"""When one rank refuses its share, the hub takes the other ranks back to their previous shares
and says which rank refused, for an allocation and for a rebalance alike.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py: the move back was given
every rank's previous share but only the ranks that had not refused, and raised ``KeyError``
on the one left out; the others stayed on the refused allocation while the hub held the
previous one in force, and the agent saw a KeyError instead of the rank's reason.
"""

import pytest

from .rank_ends import RankEnd, host_with_ranks, report_message


class RefusingEnd(RankEnd):
    """A rank whose pipeline refuses whatever it is sent."""

    def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "allocation":
            answer = {"type": "refused", "generation": message["generation"], "reason": "no"}
            self.host._handle(self.link, answer)


def _refusing(host, ends, rank: int) -> None:
    end = ends[rank]
    refusing = ends[rank] = RefusingEnd(host, ends, rank, False)
    refusing.workers, refusing.link = end.workers, end.link
    refusing.link.lines = refusing


@pytest.mark.parametrize("refuser", [0, 1, 2])
def test_an_allocation_one_rank_refuses_leaves_every_rank_on_its_previous_share(refuser):
    host, ends = host_with_ranks([({"parse": 2}, 0.5, False)] * 3)
    host.apply({"parse": 2})
    _refusing(host, ends, refuser)

    with pytest.raises(RuntimeError, match=f"rank {refuser} refused it: no"):
        host.apply({"parse": 1 if refuser == 0 else 3})

    assert {rank: end.workers for rank, end in ends.items()} == dict.fromkeys(ends, {"parse": 2})
    assert host._in_force == {"parse": 2}


def test_a_rebalance_one_rank_refuses_leaves_every_rank_where_it_was():
    host, ends = host_with_ranks([({"parse": 3}, 0.5, False), ({"parse": 3}, 0.5, False)])
    host.apply({"parse": 3})
    for rank, busy in ((0, 0.1), (1, 1.0)):  # rank 1 now needs more than rank 0
        host._handle(ends[rank].link, report_message(ends[rank].workers, busy))
    _refusing(host, ends, 1)

    assert host.rebalance() is False

    assert [end.workers for end in ends.values()] == [{"parse": 3}, {"parse": 3}]
    assert host.rebalances == 0
