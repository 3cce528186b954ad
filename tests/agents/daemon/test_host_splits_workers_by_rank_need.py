"""The host agent sends each rank its share of an allocation, split by what each rank measured
it needs (agents.budget.split_across_ranks): a rank whose stage keeps three times as many
workers busy gets three times the workers, the host's total per stage is kept, and ranks that
measure alike get the allocation each."""

import socket

from agents.daemon.ranks import HostPipelines, StageInfo, _Rank


class AnsweringLines:
    """A rank's end of the socket that applies every allocation at once and records it."""

    def __init__(self) -> None:
        self.host: HostPipelines | None = None
        self.rank: _Rank | None = None
        self.received: list[dict] = []

    def send(self, message: dict) -> None:
        self.received.append(message)
        if message["type"] == "allocation" and self.host is not None:
            applied = {"generation": message["generation"], "allocation": message["workers"]}
            self.host._handle(self.rank, {"type": "applied"} | applied)

    def close(self) -> None:
        pass


def report(busy: dict[str, float]) -> dict:
    stages = [{"name": n, "workers": 4, "busy_fraction": b} for n, b in busy.items()]
    return {"stages": stages, "trainer": {}}


def host_with(busy_by_rank: list[dict[str, float]]) -> tuple[HostPipelines, list]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stages = [StageInfo("read", "thread", 16), StageInfo("decode", "process", 16)]
    host = HostPipelines(listener, len(busy_by_rank), stages=stages, apply_timeout_s=2)
    links = []
    for rank, busy in enumerate(busy_by_rank):
        lines = AnsweringLines()
        r = _Rank(rank, 100 + rank, lines, {"read": 1, "decode": 1})
        r.report = report(busy) if busy else None
        lines.host, lines.rank = host, r
        host._connected[rank] = r
        links.append(lines)
    return host, links


def test_the_busier_rank_gets_more_workers_and_the_total_is_kept():
    host, links = host_with([{"read": 0.5, "decode": 0.25}, {"read": 0.5, "decode": 0.75}])
    host.apply({"read": 2, "decode": 4})
    shares = [lines.received[-1]["workers"] for lines in links]
    assert shares == [{"read": 2, "decode": 2}, {"read": 2, "decode": 6}]
    assert host.allocation == {"read": 2, "decode": 4}, "the control plane's, per rank"
    assert host.rank_workers() == {0: shares[0], 1: shares[1]}


def test_ranks_that_measure_alike_or_not_yet_get_the_allocation_each():
    host, links = host_with([{"read": 0.5, "decode": 0.5}, {}])
    host.apply({"read": 3, "decode": 2})
    assert [lines.received[-1]["workers"] for lines in links] == [{"read": 3, "decode": 2}] * 2
