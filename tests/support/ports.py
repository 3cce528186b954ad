"""One free-port helper for every server the tests and benchmarks start."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range.

    A server that goes away and comes back on an *ephemeral* port can find it taken: a client
    retrying ``connect()`` to a port nobody listens on may be given that very port as its own
    source port and connect to itself (TCP simultaneous open), holding the port.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1025, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range; free some or pass port=")
