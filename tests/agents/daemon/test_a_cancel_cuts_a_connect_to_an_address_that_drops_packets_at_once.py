"""A ``Cancel`` set from another thread ends, at once, a request still connecting to an address
that drops packets (a firewall's DROP rule, a route to nowhere: tests/support/dropping_tcp.py),
whenever it lands during the connect, and the request raises as cancelled. Before, the connect
kept its own 5 s timeout: a training script under ``intune-run`` that ended meanwhile waited
it out. Generated moments."""

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.client import ControlPlaneClient, ControlPlaneError
from agents.transport import Cancel
from tests.support.dropping_tcp import DroppingAddress

TIMEOUT_S = 5.0  # the request's own bound: what a cut must come well before
CUT_S = 1.0  # a cut's effect, on a loaded 2-core machine


@pytest.fixture(scope="module")
def dropping():
    address = DroppingAddress()
    yield address
    address.close()


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(after_s=st.sampled_from([0.05, 0.2, 0.6, 1.2]), pool=st.sampled_from(["poll", "metrics"]))
def test_a_request_connecting_to_an_address_that_drops_packets_ends_once_cancelled(
    dropping, after_s, pool
):
    cancel = Cancel()
    client = ControlPlaneClient(dropping.url, 1, "ia_x", timeout_s=TIMEOUT_S, cancel=cancel)
    timer = threading.Timer(after_s, cancel.set)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(ControlPlaneError, match="cancelled"):
            if pool == "poll":
                client.poll_allocation(after=0, wait_s=0)
            else:
                client.post_metrics({"samples": []})
        took = time.monotonic() - start
        assert took < after_s + CUT_S, f"the connect ended {took:.2f} s after it began"
    finally:
        timer.cancel()
        client.close()
