"""A control plane's name whose lookup never answers (a nameserver behind a firewall that drops,
a DNS outage) holds a request no longer than its bound, and a ``Cancel`` set meanwhile ends it
at once. Before, ``getaddrinfo`` ran on the request's own thread with no bound but the
resolver's (up to 30 s with glibc's defaults): past the request's deadline, past the connect
timeout, and past a ``Cancel`` (a script ending under ``intune-run`` waited for it).

The resolver is the one stand-in here: this machine's answers at once (no name reaches a
nameserver that drops), so ``socket.getaddrinfo`` is replaced for one name by a call that blocks
as libc's does, until the test ends. Generated moments, both pools, with and without a cancel."""

import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.client import ControlPlaneClient, ControlPlaneError
from agents.transport import Cancel

STALLED = "stalled-dns.intune.invalid"
TIMEOUT_S = 1.5  # the client's own bound on a request
CUT_S = 1.0  # a cut's effect, on a loaded 2-core machine


class _Blocked(list):
    calls: list[tuple[str, str]]


@pytest.fixture
def stalled_resolver(monkeypatch):
    real = socket.getaddrinfo
    released = threading.Event()
    blocked = _Blocked()
    calls: list[tuple[str, str]] = []  # (host, the thread that looked it up)

    def getaddrinfo(host, *args, **kwargs):
        flags = args[4] if len(args) > 4 else kwargs.get("flags", 0)
        calls.append((host, threading.current_thread().name))
        if host == STALLED and not flags & socket.AI_NUMERICHOST:
            blocked.append(host)
            released.wait(60)  # as libc's resolver: nothing interrupts it
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    blocked.calls = calls
    yield blocked
    released.set()


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    after_s=st.sampled_from([0.05, 0.3, 0.8]),
    pool=st.sampled_from(["poll", "metrics"]),
    cancelled=st.booleans(),
)
def test_a_request_whose_name_lookup_never_answers_ends_at_its_bound_or_once_cancelled(
    stalled_resolver, after_s, pool, cancelled
):
    cancel = Cancel()
    client = ControlPlaneClient(
        f"http://{STALLED}:8000", 1, "ia_x", timeout_s=TIMEOUT_S, cancel=cancel
    )
    timer = threading.Timer(after_s, cancel.set)
    start = time.monotonic()
    if cancelled:
        timer.start()
    try:
        with pytest.raises(ControlPlaneError, match="cancelled" if cancelled else STALLED):
            if pool == "poll":
                client.poll_allocation(after=0, wait_s=0)
            else:
                client.post_metrics({"samples": []})
        took = time.monotonic() - start
        bound = after_s + CUT_S if cancelled else TIMEOUT_S + CUT_S
        assert took < bound, f"the request ended {took:.2f} s after it began (bound {bound} s)"
        assert stalled_resolver, "the name was never looked up: the test proves nothing"
    finally:
        timer.cancel()
        client.close()


def test_an_address_given_as_an_ip_is_not_looked_up_on_a_thread(stalled_resolver):
    # an IP needs no resolver: it is taken on the request's own thread (a thread a connect
    # would cost otherwise)
    cancel = Cancel()
    client = ControlPlaneClient("http://127.0.0.1:9", 1, "ia_x", timeout_s=1.0, cancel=cancel)
    try:
        with pytest.raises(ControlPlaneError):
            client.post_metrics({"samples": []})
    finally:
        client.close()
    looked_up = [name for host, name in stalled_resolver.calls if host == "127.0.0.1"]
    assert looked_up and set(looked_up) == {threading.current_thread().name}, looked_up
