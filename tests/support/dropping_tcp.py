"""A TCP address on 127.0.0.1 that drops connects, as an address behind a firewall's DROP rule
or a blackholed route does: a connect to it waits out its own timeout.

A listener whose accept queue is full and that never accepts: Linux then drops each further
SYN (``net.ipv4.tcp_abort_on_overflow`` 0, its default) instead of answering, and the client
retransmits it until its timeout. No root, no iptables rule, nothing routed off the host (on
this sandbox a connect to the non-routable 10.255.255.1 was answered by something on the path).
"""

from __future__ import annotations

import socket


class DroppingAddress:
    """``port`` on 127.0.0.1 drops every new connect until :meth:`close`."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)  # one connection fills Linux's queue (full is "more than 0")
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        # Fill the queue: connects succeed (the kernel completes them unaccepted) until one is
        # dropped; a handful is plenty whatever the kernel's rounding of the backlog.
        for _ in range(16):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.settimeout(0.3)
            try:
                probe.connect(("127.0.0.1", self.port))
            except TimeoutError:
                probe.close()
                return
            self.held.append(probe)
        self.close()
        raise RuntimeError(
            "a listener that never accepts took 16 connects: this kernel answers a full queue "
            "(net.ipv4.tcp_abort_on_overflow=1?) instead of dropping the SYN"
        )

    @property
    def url(self) -> str:
        """An http:// URL at the address."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Let go of the address."""
        for sock in self.held:
            sock.close()
        self.held.clear()
        self.listener.close()
