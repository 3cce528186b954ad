"""The hub's threads end within a fraction of a second of ``stop()``, however the ranks'
connections stood: saying hello, reporting, or being cut and coming back.

Found by tests/agents/daemon/test_generated_rank_moves_never_hang.py (four ranks joining, then
every link and hub stopped): a connection's thread was left in ``recv`` on a socket that
``stop()`` had closed (its descriptor already -1), until its 4 s read timeout. A thread about
to wait on a socket when another closes it can wait on whatever socket reuses the descriptor's
number; a wait on the ranks' socket now lasts at most RECEIVE_SLICE_S before it looks whether
its connection was closed.
"""

import socket
import threading
import time

from agents.daemon.ranks import RECEIVE_SLICE_S, _Lines

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


def test_every_thread_of_the_hub_and_links_ends_soon_after_stop():
    for _ in range(5):
        before = rank_threads()
        host = Host(Scenario(ranks=4, busy=[0.5] * 4, rebalance_s=0.2))
        for rank in (3, 1, 0, 2):
            host.join(rank)
        time.sleep(0.2)
        host.stop()
        deadline = time.monotonic() + 1.0
        while rank_threads() - before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not rank_threads() - before, sorted(t.name for t in rank_threads() - before)
