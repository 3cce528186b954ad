"""``intune-agent --sidecar``: the host's one agent as a process of its own, which every rank's
attach() reports to; when it ends, the ranks keep their allocation and one of them takes over.

The sidecar is the real CLI in a child process, against the stand-in control plane; the two
ranks are real pipelines attached in this process over a real Unix socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agents import attach
from agents.daemon.ranks import socket_address, someone_listens

from .conftest import Consumer, applied_shares, counting_pipeline

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def two_ranks():
    pipelines = [counting_pipeline().start() for _ in range(2)]
    consumers = [Consumer(p).start() for p in pipelines]
    yield pipelines
    for c in consumers:
        c.stop()
    for p in pipelines:
        p.stop()


def test_ranks_report_through_the_sidecar_and_take_over_when_it_ends(
    control_plane, two_ranks, tmp_path, wait_for
):
    host = control_plane.add_host(["parse", "transform"])
    socket_name = f"@intune-sidecar-{uuid.uuid4().hex}"
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "agents", "--sidecar", "--ranks", "2", "--rank-socket", socket_name,
         "--url", control_plane.url, "--host-id", str(host.id), "--token", host.token,
         "--interval", "0.2", "--batch-seconds", "0.3", "--poll-wait", "1",
         "--state-dir", str(tmp_path), "--seconds", "60"],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    attached = []
    try:
        # The sidecar binds the socket first; give it the time to start Python.
        wait_for(
            lambda: someone_listens(socket_address(socket_name)) or sidecar.poll() is not None,
            timeout=30,
            what="the sidecar to listen",
        )
        assert sidecar.poll() is None, sidecar.stdout.read()
        attached = [
            attach(two_ranks[rank], url=control_plane.url, host_id=host.id, token=host.token,
                   rank=rank, local_world_size=2, rank_socket=socket_name, interval_s=0.2)
            for rank in range(2)
        ]  # fmt: skip
        wait_for(
            lambda: host.samples and len(host.samples[max(host.samples)].get("ranks", [])) == 2,
            timeout=20,
            what="the sidecar's samples of both ranks",
        )
        assert all(a.agent is None for a in attached), "no rank hosts the agent: the sidecar does"
        control_plane.publish(host.id, {"parse": 2, "transform": 1})
        wait_for(
            lambda: applied_shares(two_ranks, {"parse": 2, "transform": 1}),
            what="both ranks to apply their shares of the sidecar's allocation",
        )
        shares = [dict(p.allocation) for p in two_ranks]
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(20) == 0
        assert [p.allocation for p in two_ranks] == shares, "the ranks keep what they run"
        wait_for(
            lambda: sum(a.agent is not None for a in attached) == 1,
            timeout=20,
            what="one rank to take over",
        )
    finally:
        for a in attached:
            a.stop()
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(10)
