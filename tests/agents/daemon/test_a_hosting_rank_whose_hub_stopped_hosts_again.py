"""A rank that hosts the agent goes on hosting when its hub stops under it (the hub's agent
failed, or something stopped it): it stops what is left of the old one, binds the ranks' socket
again and starts another, and the ranks reconnect to it.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py: a rank whose hub had
stopped kept the stopped one as "hosted" and never bound the socket again; alone on the host,
it retried connecting to nobody for ever, and no allocation reached it again.
"""

import threading
import time
import uuid

from agents.daemon.ranks import HostPipelines, RankLink

from .rank_stress import INTERVAL_S, RankPipeline

BOUND_S = 6.0  # a reconnect wait (RECONNECT_MAX_S, 2 s) and the new hub's start, with slack


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {BOUND_S} s"
        time.sleep(0.01)


def test_a_hosting_rank_whose_hub_stopped_starts_another_and_takes_allocations_again():
    hubs: list[HostPipelines] = []
    stopped = threading.Event()

    class Hosted:
        def __init__(self, hub: HostPipelines) -> None:
            self.hub = hub

        def stop(self) -> None:
            stopped.set()
            self.hub.stop()

    def host_here(listener):
        hubs.append(HostPipelines(listener, 2, interval_s=INTERVAL_S, rebalance_s=None).start())
        return Hosted(hubs[-1])

    pipeline = RankPipeline(0.5)
    link = RankLink(
        pipeline, 0, 2, f"\0intune-test-{uuid.uuid4().hex}",
        trainer_stats=dict, host_here=host_here, interval_s=INTERVAL_S,
    ).start()  # fmt: skip
    try:
        _wait(lambda: hubs and hubs[0].connected_ranks() == [0], "the rank to host and join")
        hubs[0].stop()

        _wait(lambda: len(hubs) == 2 and hubs[1].connected_ranks() == [0], "a second hub")
        assert stopped.is_set(), "what was left of the first host agent was stopped"
        assert link.hosted.hub is hubs[1]
        hubs[1].apply({"read": 2, "parse": 1, "collate": 3})
        assert pipeline.allocation == {"read": 2, "parse": 1, "collate": 3}
    finally:
        link.stop(2.0)
    assert all(hub._stop.is_set() for hub in hubs)
