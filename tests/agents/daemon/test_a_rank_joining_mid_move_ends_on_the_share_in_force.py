"""A rank that says hello while the hub moves the others is sent its share once the move has
ended, of the allocation in force then: the new one when the move went through, the previous
one when another rank refused it.

Sent its share at hello, as before, a rank joining mid-move was sent the new allocation's, was
no target of the move, and so was not taken back when another rank refused: it ran the refused
allocation while the hub held the previous one in force (and counted it on that one).
"""

import pytest

from agents.daemon.ranks import _Lines

from .rank_ends import RankEnd, host_with_ranks


class Hello(_Lines):
    """A new rank's connection as the hub reads it: a hello, then what the hub sends it."""

    def __init__(self, rank: int, allocation: dict, ranks: int = 3) -> None:
        self.hello = {
            "type": "hello", "rank": rank, "ranks": ranks, "pid": 200 + rank,
            "stages": [{"name": "parse", "kind": "process", "max_workers": 64}],
            "allocation": allocation,
        }  # fmt: skip
        self.sent: list[dict] = []

    def receive(self, timeout_s: float) -> dict:
        return self.hello

    def send(self, message: dict) -> None:
        self.sent.append(message)

    def close(self) -> None:
        pass


class JoinsMidMove(RankEnd):
    """Rank 0: when it is sent its share, rank 2 says hello (the move is in flight)."""

    joiner: Hello | None = None

    def send(self, message: dict) -> None:
        if message["type"] == "allocation" and self.joiner is None:
            self.joiner = Hello(2, {"parse": 1})
            self.host._hello(self.joiner)
        super().send(message)


class Refuses(RankEnd):
    def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "allocation":
            answer = {"type": "refused", "generation": message["generation"], "reason": "no"}
            self.host._handle(self.link, answer)


def _host(refuse: bool):
    host, ends = host_with_ranks([({"parse": 2}, 0.5, False), ({"parse": 2}, 0.5, False)])
    host.ranks = 3  # rank 2 joins later
    host._in_force, host._split = {"parse": 2}, {0: {"parse": 2}, 1: {"parse": 2}}
    for rank, kind in ((0, JoinsMidMove), (1, Refuses if refuse else RankEnd)):
        old = ends[rank]
        end = ends[rank] = kind(host, ends, rank, False)
        end.workers, end.link = old.workers, old.link
        end.link.lines = end
        end.report(0.5)
    return host, ends


def test_a_rank_joining_during_a_refused_move_is_sent_the_previous_share():
    host, ends = _host(refuse=True)

    with pytest.raises(RuntimeError, match="rank 1 refused it"):
        host.apply({"parse": 3})

    sent = [m["workers"] for m in ends[0].joiner.sent if m["type"] == "allocation"]
    assert sent == [{"parse": 2}], "the joiner ends on the share in force, not the refused one"
    assert ends[0].workers == {"parse": 2} and host._in_force == {"parse": 2}


def test_a_rank_joining_during_a_move_that_goes_through_is_sent_the_new_share():
    host, ends = _host(refuse=False)

    host.apply({"parse": 3})

    sent = [m["workers"] for m in ends[0].joiner.sent if m["type"] == "allocation"]
    assert sent == [{"parse": 3}]
    assert [end.workers for end in ends.values()] == [{"parse": 3}, {"parse": 3}]
