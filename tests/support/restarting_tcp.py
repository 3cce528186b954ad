"""A TCP address in front of a live server that a test can take away and bring back, as a
control plane restarting behind its address looks to a browser: :meth:`go_away` resets every
open connection (the keep-alive ones a browser would reuse, and any request in flight) and
refuses new ones, the listener closed; :meth:`come_back` listens on the same port again. While
``delay_s`` is set, what a client sends waits that long before it is passed on: a server slow
under load, whose requests are in flight for a while.

Cookies are not kept apart by port, so a browser logged in at the server is logged in here too.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

from tests.support.ports import free_port

#: SO_LINGER on, with a timeout of 0: close() sends a reset, as a server's process killed does.
_RESET = struct.pack("ii", 1, 0)


class RestartingAddress:
    """``url`` forwards to ``upstream`` (host, port) until :meth:`go_away`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.delay_s = 0.0
        #: Connections accepted, all told (a browser reconnecting shows here).
        self.accepted = 0
        self._lock = threading.Lock()
        # Bumped by go_away: each connection's thread resets its own sockets when it sees it
        # (closing a socket another thread selects on could close a reused descriptor).
        self._generation = 0
        self._open = 0
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._closed = False
        self.come_back()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def away(self) -> bool:
        return self._listener is None

    def go_away(self, timeout_s: float = 5.0) -> None:
        """Refuse new connections and reset every open one; back once they are all reset."""
        with self._lock:
            listener, self._listener = self._listener, None
            self._generation += 1
        if listener is not None:
            listener.close()
        deadline = time.monotonic() + timeout_s
        while self._open and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._open:
            raise RuntimeError(f"{self._open} connections not reset within {timeout_s} s")

    def come_back(self) -> None:
        """Accept and forward connections again, on the same port."""
        with self._lock:
            if self._listener is not None or self._closed:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.settimeout(0.1)
            self._listener = listener
            thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
            self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        self._closed = True
        self.go_away()
        for thread in self._threads:
            thread.join(5)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client = listener.accept()[0]
            except TimeoutError:
                continue
            except OSError:
                return  # closed by go_away
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:
                    _reset(client)
                    _reset(server)
                    return
                self.accepted += 1
                self._open += 1
                thread = threading.Thread(
                    target=self._forward, args=(client, server, self._generation), daemon=True
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _forward(self, client: socket.socket, server: socket.socket, generation: int) -> None:
        peer = {client: server, server: client}
        try:
            while generation == self._generation:
                readable, _, _ = select.select(list(peer), [], [], 0.02)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and self.delay_s:
                        time.sleep(self.delay_s)
                    if generation != self._generation:
                        return  # gone away meanwhile: nothing more is passed on
                    peer[sock].sendall(data)
        except OSError:
            return  # reset by either end
        finally:
            _reset(client)
            _reset(server)
            with self._lock:
                self._open -= 1


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    sock.close()
