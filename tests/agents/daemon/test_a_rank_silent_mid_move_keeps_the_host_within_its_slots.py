"""A rank that stops answering while its share shrinks still runs its workers: the host agent
must not grow the other ranks into the slots it has not given back.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py: the hub dropped the silent
rank after apply_timeout_s and went on to grow the others, so a 2-rank host with 4 slots ran
3 + 3 workers until the silent rank came back. A silence in the shrink step now stops the move
like a refusal (the ranks that shrank go back); a silence once every rank has shrunk does not.
"""

import os
import time
import uuid

import pytest

from agents.daemon.ranks import HostPipelines, RankLink, bind_listener

from .rank_ends import RankEnd, host_with_ranks
from .rank_stress import INTERVAL_S, RankPipeline
from .test_a_rank_joining_mid_move_ends_on_the_share_in_force import Hello


def ADDRESS() -> str:  # noqa: N802 - reads as the constant it stands for
    return f"\0intune-test-{uuid.uuid4().hex}"


class SilentEnd(RankEnd):
    """A rank whose process stopped answering: it takes in nothing the host sends."""

    def send(self, message: dict) -> None:
        self.sent.append(message)


def _two_ranks(silent: int):
    # Per rank 2 workers of parse, split 3 / 1 by need; rank 0 has since gone quiet, rank 1 busy.
    host, ends = host_with_ranks([({"parse": 3}, 0.1, False), ({"parse": 1}, 0.9, False)])
    host.apply_timeout_s = 0.3
    host._in_force, host._split = {"parse": 2}, {0: {"parse": 3}, 1: {"parse": 1}}
    quiet = ends[silent] = SilentEnd(host, ends, silent, False)
    quiet.workers, quiet.link = dict(host._connected[silent].allocation), host._connected[silent]
    quiet.link.lines = quiet
    for end in ends.values():
        end.link.pid = os.getpid()  # a living process, as a rank's is
    return host, ends


def test_a_rank_silent_while_it_shrinks_stops_the_move_and_the_others_do_not_grow():
    host, ends = _two_ranks(silent=0)

    with pytest.raises(RuntimeError, match="rank 0 did not answer"):
        host.apply({"parse": 2})  # by need: rank 0 to 1, rank 1 to 3

    assert [m["workers"] for m in ends[0].sent] == [{"parse": 1}], "rank 0 was asked to shrink"
    assert ends[1].sent == [], "rank 1 never grew while rank 0 still ran 3"
    assert ends[0].workers["parse"] + ends[1].workers["parse"] <= 4
    assert host.connected_ranks() == [1], "the silent rank is disconnected (it will reconnect)"
    assert host._in_force == {"parse": 2} and host._split[1] == {"parse": 1}


def test_a_rank_silent_while_it_grows_leaves_the_others_on_their_new_shares():
    host, ends = _two_ranks(silent=1)

    host.apply({"parse": 2})  # rank 0 shrank to 1 and answered; rank 1's growth goes unanswered

    assert ends[0].workers == {"parse": 1}
    assert [m["workers"] for m in ends[1].sent] == [{"parse": 3}]
    assert host.connected_ranks() == [0]


def test_a_silent_rank_may_still_apply_what_it_was_sent_so_the_next_allocation_counts_it():
    # Found by the generated test: rank 1 went quiet while it was sent a larger share (the grow
    # step), was dropped, and the next allocation gave rank 0 more, counting rank 1 at what it
    # ran before. Rank 1 then woke and applied the share it had been sent: 10 workers on 9.
    host, ends = _two_ranks(silent=1)
    host.apply({"parse": 2})  # rank 1 was sent 3 and said nothing: it may run 3 when it wakes
    assert host.connected_ranks() == [0]
    before = dict(host._in_force), {rank: dict(s) for rank, s in host._split.items()}

    with pytest.raises(RuntimeError, match=r"rank 1 is not connected .* still runs \{'parse': 3\}"):
        host.apply({"parse": 1})  # its share of it would be 1: it cannot shrink now

    assert ends[0].workers == {"parse": 1}, "rank 0 was not grown into rank 1's slots"
    assert (host._in_force, host._split) == before, "nothing changed"
    host.apply({"parse": 3})  # rank 1's share of this one is 3 or more: it can go through
    assert ends[0].workers["parse"] + 3 <= 2 * 3
    assert host.rebalance() is False, "no rebalance while a silent rank holds its workers"


def test_a_silent_rank_whose_process_ended_holds_nothing(monkeypatch):
    host, ends = _two_ranks(silent=1)
    host.apply({"parse": 2})
    monkeypatch.setattr("agents.daemon.ranks._process_lives", lambda pid: False)

    host.apply({"parse": 1})  # rank 1's process has ended: its workers with it

    assert ends[0].workers == {"parse": 1} and host._in_force == {"parse": 1}
    assert host._holding() == {}


def test_a_rank_whose_connection_ended_while_its_process_lives_keeps_its_slots():
    # Found by the generated test: rank 0's connection was cut while it ran 2 of a stage; the
    # next allocation went to rank 1 alone, which grew, and the host ran 3 on 2 slots until
    # rank 0 came back. A rank whose process lives is held until it says hello again.
    host, ends = _two_ranks(silent=1)
    ends[1] = RankEnd(host, ends, 1, False)  # rank 1 answers; rank 0's connection ends
    ends[1].workers, ends[1].link = {"parse": 1}, host._connected[1]
    ends[1].link.lines = ends[1]
    gone = host._connected[0]
    host._mark_silent(gone)  # what the connection's thread does when its socket ends
    host._drop(gone)

    with pytest.raises(RuntimeError, match=r"rank 0 is not connected .* still runs \{'parse': 3\}"):
        host.apply({"parse": 1})

    assert ends[1].workers == {"parse": 1}, "rank 1 did not grow into rank 0's slots"
    back = Hello(0, {"parse": 3}, ranks=2)
    host._hello(back)  # rank 0 is back: it runs 3 and is sent its share
    assert host._holding() == {}
    assert back.sent == [], "it runs its share, 3: nothing to send"


def test_over_a_real_socket_a_rank_that_stopped_reporting_keeps_its_slots():
    # RankAttachment.stop(): the rank stops reporting and its pipeline goes on, in a process
    # that lives. Before, the hub forgot its workers and the next allocation grew the other.
    hub = HostPipelines(bind_listener(ADDRESS()), 2, interval_s=INTERVAL_S, rebalance_s=None)
    hub.start()
    pipelines = [RankPipeline(0.95), RankPipeline(0.1)]
    links = [
        RankLink(p, rank, 2, hub.listener.getsockname(), trainer_stats=dict, interval_s=INTERVAL_S)
        for rank, p in enumerate(pipelines)
    ]
    try:
        for link in links:
            link.start()
        deadline = time.monotonic() + 5
        while hub.connected_ranks() != [0, 1] or len(hub._live_reports()) < 2:
            assert time.monotonic() < deadline, "the ranks did not connect"
            time.sleep(0.01)
        alike = {"read": 2, "parse": 2, "collate": 2}
        hub.apply(alike)  # by need: rank 0 takes 3 of a stage, rank 1 takes 1
        assert [p.allocation["parse"] for p in pipelines] == [3, 1]
        links[0].stop(2.0)
        while hub.connected_ranks() != [1]:
            assert time.monotonic() < deadline + 5, "the hub did not see rank 0 go"
            time.sleep(0.01)

        hub.apply(alike)

        assert sum(p.allocation["parse"] for p in pipelines) <= 2 * 2
    finally:
        for link in links:
            link.stop(2.0)
        hub.stop()
