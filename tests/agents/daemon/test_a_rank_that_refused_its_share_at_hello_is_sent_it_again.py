"""A rank that refuses the share it is sent when it says hello (its pipeline failed to resize)
is sent it again a few reports later, and not while a move is in flight.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py: a rank that joined late
and refused its share stayed on its own allocation for good while the hub counted it on its
share; had it joined with more workers than its share, the host would have run above its
slots for as long as it lived.
"""

import time

from agents.daemon.ranks import RESEND_INTERVALS

from .rank_ends import host_with_ranks, report_message
from .test_a_rank_joining_mid_move_ends_on_the_share_in_force import Hello


def _answer(host, r, message: dict, kind: str) -> None:
    host._handle(r, {"type": kind, "generation": message["generation"], "reason": "busy"})


def test_a_rank_that_refused_its_share_at_hello_is_sent_it_again_and_not_during_a_move():
    host, _ = host_with_ranks([({"parse": 2}, 0.5, False), ({"parse": 2}, 0.5, False)])
    host.ranks, host.interval_s = 3, 0.1
    host._in_force, host._split = {"parse": 2}, {0: {"parse": 2}, 1: {"parse": 2}}
    lines = Hello(2, {"parse": 5})  # rank 2 restarts with more workers than its share

    r = host._hello(lines)
    assert [m["workers"] for m in lines.sent] == [{"parse": 2}]
    _answer(host, r, lines.sent[-1], "refused")

    def report() -> None:  # what the hub's connection thread does with each report
        host._handle(r, report_message({"parse": 5}, 0.5))
        host._resend_share(r)

    report()
    assert len(lines.sent) == 1, "not again at once: the rank has its report interval to apply"
    time.sleep(RESEND_INTERVALS * host.interval_s + 0.05)
    with host._moving:  # a move is in flight: it sends the shares itself
        report()
    assert len(lines.sent) == 1
    report()
    assert [m["workers"] for m in lines.sent] == [{"parse": 2}, {"parse": 2}]
    host._handle(r, {"type": "applied", "generation": lines.sent[-1]["generation"],
                     "allocation": {"parse": 2}})  # fmt: skip
    time.sleep(RESEND_INTERVALS * host.interval_s + 0.05)
    host._resend_share(r)
    assert len(lines.sent) == 2, "a rank on its share is left alone"
    assert host.rank_workers()[2] == {"parse": 2}
