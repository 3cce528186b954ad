"""A host agent's ranks without processes: each rank's end of the socket applies what the host
sends at once and records how many workers the host's ranks ran, and reported, after each."""

from __future__ import annotations

import socket

from agents.daemon.ranks import HostPipelines, StageInfo, _Rank


class RankEnd:
    """One rank's end of the socket: applies each allocation at once, checks the host's sum."""

    def __init__(self, host: HostPipelines, ends: dict, rank: int, report_after: bool) -> None:
        self.host = host
        self.ends = ends  # rank -> RankEnd, every rank of the host
        self.rank = rank
        self.report_after = report_after
        self.workers: dict[str, int] = {}
        self.busy = 0.5
        self.link: _Rank | None = None
        self.sent: list[dict] = []
        self.seen: list[tuple[int, int]] = []  # (running, reported) after each answer

    def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] != "allocation":
            return
        self.workers = dict(message["workers"])
        answer = {"generation": message["generation"], "allocation": dict(self.workers)}
        self.host._handle(self.link, {"type": "applied"} | answer)
        if self.report_after:
            self.report()
        running = sum(sum(end.workers.values()) for end in self.ends.values())
        reported = sum(s["workers"] for s in self.host.metrics())
        self.seen.append((running, reported))

    def report(self, busy: float | dict[str, float] | None = None) -> None:
        """Send a report of this rank's workers, each stage busy ``busy`` of the time."""
        if busy is not None:
            self.busy = busy
        self.host._handle(self.link, report_message(self.workers, self.busy))

    def close(self) -> None:
        pass


def report_message(workers: dict[str, int], busy: float | dict[str, float]) -> dict:
    """A rank's report: its workers per stage, each stage ``busy`` (or ``busy[stage]``)."""
    stages = [
        {"name": n, "workers": c, "busy_fraction": busy if isinstance(busy, float) else busy[n]}
        for n, c in workers.items()
    ]
    return {"type": "report", "stages": stages, "trainer": {}, "allocation": dict(workers)}


def host_with_ranks(
    ranks_now: list[tuple[dict[str, int], float | dict[str, float], bool]],
    order: list[int] | None = None,
    **options,
) -> tuple[HostPipelines, dict[int, RankEnd]]:
    """A host agent whose ranks run ``(workers, busy, report_after)`` each, connected in
    ``order`` (the order they are sent their shares and answer)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    names = list(ranks_now[0][0])
    stages = [StageInfo(name, "process", 64) for name in names]
    host = HostPipelines(listener, len(ranks_now), stages=stages, apply_timeout_s=2, **options)
    ends: dict[int, RankEnd] = {}
    for rank in order if order is not None else range(len(ranks_now)):
        workers, busy, report_after = ranks_now[rank]
        end = ends[rank] = RankEnd(host, ends, rank, report_after)
        end.workers = dict(workers)
        end.link = _Rank(rank, 100 + rank, end, dict(workers))
        end.report(busy)
        host._connected[rank] = end.link
    return host, ends
