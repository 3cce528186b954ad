"""A process forked by the rank that hosts the agent (a loader's worker launcher, a torch
DataLoader worker, any child the script forks) holds none of the ranks' sockets, so the
hosting rank hosts again when its hub stops, while that process lives.

Found by the rank hunter (``tests/agents/torch/rank_hunt.py``, a validation loader iterated
before the training loader is built, as Lightning's sanity check does): under ``intune-run
-- torchrun --nproc-per-node 2``, the tuning moved to the training loader, whose persistent
workers' launcher had been forked after the hub bound the ranks' abstract socket. It kept the
listener open: the stopped hub's name stayed bound, every rank's bind failed (EADDRINUSE) and
its connect was refused, and no rank reached a host agent for the rest of the job.
"""

import os
import select
import time
import uuid

from agents.daemon.ranks import HostPipelines, RankLink

from .rank_stress import INTERVAL_S, RankPipeline

BOUND_S = 6.0  # a reconnect wait (RECONNECT_MAX_S, 2 s) and the new hub's start, with slack
CHILD_LIVES_S = 20.0  # longer than the test: the fork outlives the hub (killed at the end)


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {BOUND_S} s"
        time.sleep(0.01)


def _socket_inodes(pid: int) -> set[str]:
    """The sockets a process has open, as ``socket:[inode]``."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_a_hosting_rank_hosts_again_while_a_process_it_forked_after_the_hub_started_lives():
    hubs: list[HostPipelines] = []

    class Hosted:
        def __init__(self, hub: HostPipelines) -> None:
            self.hub = hub

        def stop(self) -> None:
            self.hub.stop()

    def host_here(listener):
        hubs.append(HostPipelines(listener, 2, interval_s=INTERVAL_S, rebalance_s=None).start())
        return Hosted(hubs[-1])

    link = RankLink(
        RankPipeline(0.5), 0, 2, f"\0intune-test-{uuid.uuid4().hex}",
        trainer_stats=dict, host_here=host_here, interval_s=INTERVAL_S,
    ).start()  # fmt: skip
    child = 0
    try:
        _wait(lambda: hubs and hubs[0].connected_ranks() == [0], "the rank to host and join")
        hub = hubs[0]
        with hub._lock:
            ends = [hub.listener, link._lines.sock] + [c.sock for c in hub._connections]
        ranks_sockets = {f"socket:[{os.fstat(s.fileno()).st_ino}]" for s in ends}
        ready, go = os.pipe()
        child = os.fork()
        if child == 0:  # a worker launcher, say: it never touches the ranks' sockets
            os.close(ready)
            os.write(go, b"1")
            select.select([], [], [], CHILD_LIVES_S)
            os._exit(0)
        os.close(go)
        assert os.read(ready, 1) == b"1"
        os.close(ready)
        held = ranks_sockets & _socket_inodes(child)

        hub.stop()

        _wait(lambda: len(hubs) == 2 and hubs[1].connected_ranks() == [0], "a second hub")
        hubs[1].apply({"read": 2, "parse": 1, "collate": 3})
        assert link.pipeline.allocation == {"read": 2, "parse": 1, "collate": 3}
        assert not held, f"the fork held the ranks' sockets {sorted(held)}"
    finally:
        if child:
            os.kill(child, 9)
            os.waitpid(child, 0)
        link.stop(2.0)
