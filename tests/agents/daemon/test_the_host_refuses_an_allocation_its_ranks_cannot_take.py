"""The host agent's hub checks a per-rank allocation before it moves any rank: a stage left out
or unknown, a count below 1 or above the stage's max_workers, or an allocation before any rank
said which stages it runs, is refused with a reason, and nothing changes.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py: ``apply({"collate": 5})``
on stages bounded at 4 returned without error; the split capped the connected ranks at 4 each
(the host's total fell short of ranks x 5), and a rank that joined a moment later was sent 5
whole, refused it, and stayed on its old allocation while the hub counted it on the new one.
"""

import socket

import pytest

from agents.daemon.ranks import HostPipelines, StageInfo, _Rank

from .rank_ends import RankEnd

STAGES = [StageInfo("parse", "process", 4), StageInfo("collate", "thread", 4)]


def _host(stages=STAGES) -> tuple[HostPipelines, dict[int, RankEnd]]:
    host = HostPipelines(socket.socket(socket.AF_UNIX), 2, stages=stages, rebalance_s=None)
    ends: dict[int, RankEnd] = {}
    for rank in (0, 1):
        end = ends[rank] = RankEnd(host, ends, rank, False)
        end.workers = {"parse": 1, "collate": 1}
        end.link = _Rank(rank, 100 + rank, end, dict(end.workers))
        end.report(0.5)
        host._connected[rank] = end.link
    return host, ends


@pytest.mark.parametrize(
    ("workers", "said"),
    [
        ({"parse": 2, "collate": 5}, "stage 'collate' asks for 5 workers but the stage allows at most 4"),
        ({"parse": 0, "collate": 1}, "stage 'parse' asks for 0 workers; every stage needs at least 1"),
        ({"parse": 2}, "the allocation leaves out stage 'collate'"),
        ({"parse": 2, "collate": 1, "decode": 1}, "unknown stage 'decode'"),
    ],
)  # fmt: skip
def test_an_allocation_the_ranks_cannot_take_is_refused_and_changes_nothing(workers, said):
    host, ends = _host()
    host.apply({"parse": 2, "collate": 2})
    before = (dict(host._in_force), dict(host._split), host._generation)

    with pytest.raises(ValueError, match=said):
        host.apply(workers)

    assert (host._in_force, host._split, host._generation) == before
    assert all(end.workers == {"parse": 2, "collate": 2} for end in ends.values())


def test_an_allocation_before_any_rank_said_hello_is_refused():
    host = HostPipelines(socket.socket(socket.AF_UNIX), 2, rebalance_s=None)

    with pytest.raises(ValueError, match="no rank has said hello yet"):
        host.apply({"parse": 1})

    assert host._in_force is None
