"""The hub's threads have ended when ``stop()`` returns, however the ranks' connections stood:
saying hello, reporting, or not a word yet.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py (four ranks joining, then
every link and hub stopped): a connection's thread was left in ``recv`` on a socket that
``stop()`` had closed (its descriptor already -1), until its 4 s read timeout. A thread about
to wait on a socket when another closes it can wait on whatever socket reuses the descriptor's
number; a wait on the ranks' socket now lasts at most RECEIVE_SLICE_S before it looks whether
its connection was closed, and ``stop()`` closes every connection (those still to say
hello too) and joins the hub's threads, bounded.
"""

import socket
import threading
import time
import uuid

from agents.daemon.ranks import RECEIVE_SLICE_S, HostPipelines, _Lines, bind_listener

from .rank_stress import Host, Scenario, rank_threads


class Reused:
    """A connection's socket whose descriptor number now names another socket: reads go to
    ``other``, shutdown and close to the socket the connection had."""

    def __init__(self, closed: socket.socket, other: socket.socket) -> None:
        self.closed, self.other = closed, other

    def settimeout(self, seconds: float) -> None:
        self.other.settimeout(seconds)

    def recv(self, size: int) -> bytes:
        return self.other.recv(size)

    def shutdown(self, how: int) -> None:
        self.closed.shutdown(how)

    def close(self) -> None:
        self.closed.close()


def test_a_wait_on_a_connection_closed_here_ends_within_a_slice_even_if_its_descriptor_is_reused():
    ours, theirs = socket.socketpair()
    lines = _Lines(ours)
    ended = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            lines.receive(30.0)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            errors.append(exc)
        ended.set()

    # The race, made certain: the waiting thread reads a socket that close() does not reach
    # (as when the closed descriptor's number went to another socket before its wait began).
    other, keep = socket.socketpair()
    lines.sock = Reused(ours, other)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(0.05)
    lines.close()
    began = time.monotonic()
    assert ended.wait(RECEIVE_SLICE_S + 1.0), "the wait outlived its connection's close"
    assert time.monotonic() - began <= RECEIVE_SLICE_S + 0.5
    assert isinstance(errors[0], ConnectionError)
    for s in (theirs, other, keep):
        s.close()


def test_every_thread_of_the_hub_and_links_has_ended_when_stop_returns():
    for _ in range(5):
        before = rank_threads()
        host = Host(Scenario(ranks=4, busy=[0.5] * 4, rebalance_s=0.2))
        for rank in (3, 1, 0, 2):
            host.join(rank)
        time.sleep(0.2)
        host.stop()
        assert not rank_threads() - before, sorted(t.name for t in rank_threads() - before)


def test_a_connection_that_never_said_hello_is_closed_by_stop():
    before = rank_threads()
    address = f"\0intune-test-{uuid.uuid4().hex}"
    hub = HostPipelines(bind_listener(address), 2, rebalance_s=None).start()
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.connect(address)  # and says nothing: the hub waits up to 10 s for its hello
    deadline = time.monotonic() + 2.0
    while not any(t.name == "intune-ranks-conn" for t in rank_threads() - before):
        assert time.monotonic() < deadline, "the hub did not take the connection"
        time.sleep(0.01)

    began = time.monotonic()
    hub.stop()

    assert time.monotonic() - began < 1.0
    assert not rank_threads() - before, sorted(t.name for t in rank_threads() - before)
    assert mute.recv(10) == b"", "the hub closed the connection"
    mute.close()
