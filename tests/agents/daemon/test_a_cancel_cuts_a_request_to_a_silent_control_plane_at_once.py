"""A ``Cancel`` set from another thread ends, at once, a request that waits on a control plane
that accepts and never answers, whenever it lands (before the connect, while the request is
written or its answer awaited), and refuses the client's later requests. It is how a training
script under ``intune-run`` exits without waiting for its attach's read (up to 6 s before).
Generated moments; a silent server (tests/support/stalling_tcp.py)."""

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.client import ControlPlaneClient, ControlPlaneError
from agents.transport import Cancel
from tests.support.stalling_tcp import StallingServer

TIMEOUT_S = 5.0  # the request's own bound: what a cut must come well before
CUT_S = 1.0  # a cut's effect, on a loaded 2-core machine


@pytest.fixture(scope="module")
def silent():
    server = StallingServer()
    yield server
    server.close()


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(after_s=st.sampled_from([0.0, 0.01, 0.05, 0.2]), pool=st.sampled_from(["poll", "metrics"]))
def test_a_request_waiting_on_a_silent_control_plane_ends_once_cancelled(silent, after_s, pool):
    cancel = Cancel()
    client = ControlPlaneClient(f"http://127.0.0.1:{silent.port}", 1, "ia_x", timeout_s=TIMEOUT_S,
                                cancel=cancel)  # fmt: skip
    timer = threading.Timer(after_s, cancel.set)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(ControlPlaneError):
            if pool == "poll":
                client.poll_allocation(after=0, wait_s=0)
            else:
                client.post_metrics({"samples": []})
        took = time.monotonic() - start
        assert took < after_s + CUT_S, f"the request ended {took:.2f} s after it began"
        # Once set, the client's next request is refused before it connects.
        start = time.monotonic()
        with pytest.raises(ControlPlaneError, match="cancelled"):
            client.poll_allocation(after=0, wait_s=0)
        assert time.monotonic() - start < CUT_S
    finally:
        timer.cancel()
        client.close()
