"""A TCP server on 127.0.0.1 that stands for a peer which accepts connections and then stops
answering (a Redis paused, swapping, or behind a network that drops its packets).

With no ``upstream`` it never says a word. With one it forwards every connection both ways
until ``stall()``: from then on it accepts and holds connections, old and new, and forwards
nothing, without closing them (a closed socket would be noticed; a silent one is the fault).
``resume()`` makes it forward again, to new connections only (the stalled ones stay dead, as
after a partition whose packets were lost).
"""

import select
import socket
import threading


class StallingServer:
    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stalled = threading.Event() if upstream else None
        self._generation = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stall(self) -> None:
        """Stop forwarding on every connection; keep them open."""
        self._generation += 1
        if self._stalled is not None:
            self._stalled.set()

    def resume(self) -> None:
        """Forward new connections again."""
        if self._stalled is not None:
            self._stalled.clear()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.listener.close()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn = self.listener.accept()[0]
            except TimeoutError:
                continue
            self.accepted.append(conn)
            if self.upstream is None or self._stalled.is_set():
                continue
            thread = threading.Thread(
                target=self._forward, args=(conn, self._generation), daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _forward(self, conn: socket.socket, generation: int) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            return
        self.accepted.append(upstream)
        pairs = {conn: upstream, upstream: conn}
        while not self._stop.is_set() and generation == self._generation:
            readable, _, _ = select.select(list(pairs), [], [], 0.1)
            if generation != self._generation:
                return  # stalled: whatever arrived is never passed on
            for sock in readable:
                try:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pairs[sock].sendall(data)
                except OSError:
                    return
