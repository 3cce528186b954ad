"""One rank of a two-rank host SIGKILLed mid-run, at a generated moment (before, during or
after an allocation is moved): the host agent's ``HostPipelines`` and the surviving rank go
on, no wait of either outlasts its bound, and the log says what became of the dead rank's
share.

Each rank is a process of its own speaking the ranks' socket protocol (hello, reports,
applied), the part of ``RankLink`` the host sees; SIGKILL gives it no chance to say goodbye,
as the OOM killer or a crashed CUDA kernel would not.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.daemon.ranks import HostPipelines, StageInfo, bind_listener

STAGES = [StageInfo("parse", "process", 8), StageInfo("transform", "process", 8)]
APPLY_TIMEOUT_S = 2.0

RANK = r"""
import json, os, socket, sys, time
address, rank = "\0" + sys.argv[1], int(sys.argv[2])  # the abstract namespace
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(address)
workers = {"parse": 1, "transform": 1}
def send(m):
    sock.sendall(json.dumps(m).encode() + b"\n")
send({"type": "hello", "rank": rank, "ranks": 2, "pid": os.getpid(), "allocation": workers,
      "stages": [{"name": "parse", "kind": "process", "max_workers": 8},
                 {"name": "transform", "kind": "process", "max_workers": 8}]})
buf = b""
sock.settimeout(0.1)
while True:
    stages = [{"name": n, "workers": c, "busy_fraction": 0.5} for n, c in workers.items()]
    send({"type": "report", "stages": stages, "trainer": {}, "allocation": workers})
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        if not data:
            sys.exit(0)
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            m = json.loads(line)
            if m["type"] == "allocation":
                workers = dict(m["workers"])
                send({"type": "applied", "generation": m["generation"], "allocation": workers})
"""


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.02)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    victim=st.sampled_from([0, 1]),
    kill_after_s=st.floats(min_value=0.0, max_value=0.3),
    workers=st.fixed_dictionaries({"parse": st.integers(1, 4), "transform": st.integers(1, 4)}),
)
def test_a_rank_killed_mid_run_leaves_the_host_and_the_other_rank_going(
    caplog, victim, kill_after_s, workers
):
    caplog.set_level(logging.INFO, logger="agents.daemon.ranks")
    caplog.clear()
    address = f"\0intune-test-{uuid.uuid4().hex}"
    host = HostPipelines(
        bind_listener(address),
        2,
        stages=STAGES,
        interval_s=0.2,
        apply_timeout_s=APPLY_TIMEOUT_S,
        rebalance_s=None,
    ).start()
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, address[1:], str(rank)]) for rank in (0, 1)
    ]
    survivor = 1 - victim
    try:
        _wait(lambda: host.connected_ranks() == [0, 1], 15, "both ranks to say hello")
        host.apply({"parse": 1, "transform": 1})
        # The kill lands before, during or after the next move of the shares.
        time.sleep(kill_after_s)
        os.kill(ranks[victim].pid, signal.SIGKILL)
        began = time.monotonic()
        host.apply(workers)  # never waits past its bound for the dead rank
        assert time.monotonic() - began < APPLY_TIMEOUT_S + 1.0
        _wait(lambda: host.connected_ranks() == [survivor], 5, "the dead rank to be dropped")
        # The survivor took its share of the allocation and goes on reporting and applying.
        _wait(lambda: host.rank_workers().get(survivor) == workers, 5, "the survivor's share")
        host.apply({"parse": 1, "transform": 2})
        assert host.rank_workers()[survivor] == {"parse": 1, "transform": 2}
        _wait(
            lambda: [s["workers"] for s in host.metrics()] == [1, 2],
            5,
            "the host's metrics to be the survivor's alone",
        )
        assert ranks[survivor].poll() is None

        def said() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.getMessage().startswith(f"rank {victim} (pid {ranks[victim].pid}) left")
            ]

        _wait(lambda: said(), 5, "the log to say the dead rank left")
        assert (
            "its share" in said()[-1] and "ended with it and is kept for its return" in said()[-1]
        )
        assert f"keep theirs: {{{survivor}: " in said()[-1], said()
    finally:
        host.stop()
        for process in ranks:
            process.kill()
            process.wait(5)
