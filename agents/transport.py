"""The agent's HTTP transport: a bound on each whole request, and a cut from another thread.

httpx's timeouts bound each read and write, not a request: a control plane (or a proxy) that
trickles its answer a byte at a time, each within the read timeout, held a request for as long
as it trickled (measured: a 200-byte body at a byte every 0.5 s held a POST with timeout_s=2
for over 20 s; a chunked body that never ends, forever). Every read, write and connect of a
request is therefore cut to what is left of the request's own deadline, kept per thread
(:func:`within`).

A request can also be cut at once from another thread (:class:`Cancel`): a training script
that ends while ``intune-run`` still reads the job's stages from a control plane that accepts
and never answers waited for that read's bound (up to 6 s) before it could exit; one that
ended while the attach still connected to an address that drops packets waited out the
connect's 5 s timeout (4.6 s after the script's end against torch's 0.1 s), so connects are
cut too, and so is the name's lookup before them (:func:`_lookup`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
from httpcore._backends.sync import SyncStream


class Cancelled(Exception):
    """What was asked was given up: its :class:`Cancel` was set (the process is exiting)."""


class Cancel:
    """Cuts the requests of every client made with it, from any thread, at once.

    ``set()`` shuts down the clients' connections (a thread blocked reading an answer gets
    end-of-file at once, which httpx raises as a ``RemoteProtocolError``), their TCP connects
    under way (a shutdown of a socket still waiting for the SYN's answer ends the connect at
    once with ``ECONNRESET``, raised as ``httpcore.ConnectError``), and refuses their later
    connects and reads (``httpcore.ConnectError``), and the name lookups under way (their
    waits end; see :func:`_lookup`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._waits: weakref.WeakSet[threading.Event] = weakref.WeakSet()

    def is_set(self) -> bool:
        """Whether ``set()`` was called."""
        return self._set

    def set(self) -> None:
        """Cut every request under way and refuse the next ones."""
        with self._lock:
            self._set = True
            sockets = list(self._sockets)
            waits = list(self._waits)
        for sock in sockets:
            _shut(sock)
        for wait in waits:
            wait.set()

    def check(self) -> None:
        """Raise ``httpcore.ConnectError`` once set."""
        if self._set:
            raise httpcore.ConnectError("the request was cancelled: the process is exiting")

    def track(self, stream: httpcore.NetworkStream) -> None:
        """Cut ``stream`` at ``set()`` (at once if set already)."""
        sock = stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            self.track_socket(sock)

    def track_socket(self, sock: socket.socket) -> None:
        """Cut ``sock`` at ``set()``: its connect, reads and writes under way end then; raise
        ``httpcore.ConnectError`` (``sock`` shut down) if set already."""
        with self._lock:
            if not self._set:
                self._sockets.add(sock)
                return
        _shut(sock)
        self.check()

    def track_wait(self, wait: threading.Event) -> None:
        """Set ``wait`` at ``set()`` (at once if set already)."""
        with self._lock:
            if not self._set:
                self._waits.add(wait)
                return
        wait.set()


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: a close from another thread leaves a recv blocked in it waiting
    # on (Linux wakes no poll for a descriptor closed elsewhere); a shutdown ends it at once,
    # and a connect still in SYN_SENT too (inet_shutdown disconnects it and wakes its poll).
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Deadline(threading.local):
    at: float | None = None


_deadline = _Deadline()


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Bound every network operation of this thread's requests to ``seconds`` in all."""
    _deadline.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.at = None


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    at = _deadline.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's whole time ran out (the control plane answers too slowly)")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, cancel: Cancel) -> None:
        self._stream = stream
        self._cancel = cancel

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._cancel.check()
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._cancel.check()
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):  # noqa: ANN001
        return _DeadlineStream(
            self._stream.start_tls(
                ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
            ),
            self._cancel,
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, cancel: Cancel | None) -> None:
        self._backend = httpcore.SyncBackend()
        # One never set where the client has none: its connects and lookups are bounded by
        # the request's deadline all the same (httpcore's own backend looks up without bound).
        self._cancel = cancel if cancel is not None else Cancel()

    def _opened(self, stream: httpcore.NetworkStream) -> _DeadlineStream:
        try:
            self._cancel.track(stream)
        except httpcore.ConnectError:
            stream.close()
            raise
        return _DeadlineStream(stream, self._cancel)

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ANN001
        self._cancel.check()
        sock = _connect_tcp(host, port, timeout, local_address, self._cancel)
        for option in socket_options or []:
            sock.setsockopt(*option)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._opened(SyncStream(sock))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):  # noqa: ANN001
        self._cancel.check()
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return self._opened(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _connect_tcp(
    host: str, port: int, timeout: float | None, local_address: str | None, cancel: Cancel
) -> socket.socket:
    """``socket.create_connection`` (what httpcore's own backend calls), each address's socket
    handed to ``cancel`` before its connect starts, so that ``cancel.set()`` ends the connect
    at once; httpcore's errors (``ConnectTimeout``, ``ConnectError``) as its backend raises
    them."""
    source = None if local_address is None else (local_address, 0)
    addresses = _lookup(host, port, timeout, cancel)
    error: Exception = httpcore.ConnectError(f"{host}:{port} has no address")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            cancel.track_socket(sock)
            sock.settimeout(_left(timeout, httpcore.ConnectTimeout))
            if source is not None:
                sock.bind(source)
            sock.connect(address)
            return sock
        except httpcore.ConnectError:
            sock.close()
            raise  # cancelled
        except TimeoutError as exc:
            sock.close()
            error = httpcore.ConnectTimeout(str(exc))
        except OSError as exc:
            sock.close()
            error = httpcore.ConnectError(str(exc))
        except BaseException:
            sock.close()
            raise
        if cancel.is_set():
            raise httpcore.ConnectError(f"the connect to {host}:{port} was cancelled: {error}")
    raise error


# A lookup with no bound of its own (a client without a connect timeout) still ends: glibc's
# resolver gives up after timeout x attempts x nameservers, 5 x 2 x 3 = 30 s by default.
LOOKUP_MAX_S = 30.0


def _lookup(host: str, port: int, timeout: float | None, cancel: Cancel) -> list:
    """``socket.getaddrinfo(host, port)`` for a TCP connect, bounded by the request's connect
    timeout and deadline, and cut by ``cancel``.

    ``getaddrinfo`` blocks in libc and nothing interrupts it: a resolver that does not answer
    (a nameserver behind a firewall that drops, a DNS outage) held the connect for the
    resolver's own timeouts, up to 30 s with glibc's defaults, past the request's deadline and
    past a ``Cancel`` (a script ending under ``intune-run`` waited for it until
    ``ATTACH_WAIT_AT_EXIT_S``). An address given as an IP is taken at once; a name is looked up
    on a daemon thread of its own, which is left to finish alone when the wait ends first (it
    holds no lock and writes only to its own result)."""
    try:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        pass  # a name, not an address
    found: list = []
    failed: list[BaseException] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failed.append(exc)
        finally:
            done.set()

    cancel.track_wait(done)
    threading.Thread(target=look_up, name=f"intune-lookup-{host}", daemon=True).start()
    bound = _left(timeout, httpcore.ConnectTimeout)
    if not done.wait(LOOKUP_MAX_S if bound is None else min(bound, LOOKUP_MAX_S)):
        raise httpcore.ConnectTimeout(
            f"looking up {host!r} took longer than the connect's bound: is its DNS answering?"
        )
    if cancel.is_set() and not (found or failed):
        raise httpcore.ConnectError(f"the lookup of {host!r} was cancelled: the process is exiting")
    if failed:
        raise httpcore.ConnectError(f"{host!r} could not be looked up: {failed[0]}") from failed[0]
    return found


# How long an idle connection to the control plane is kept for the next request. httpx's
# default, 5 s, is the agent's batch period: the shipper waits 5 s after each batch's answer, so
# every batch found its connection expired and opened another (a TCP handshake each, and behind
# a TLS proxy a TLS handshake each: 400 a second for 2,000 agents). Under the control plane's
# own idle limit (INTUNE_KEEPALIVE_S, 30 s), so that this side lets go first; a connection the
# server or a proxy closed sooner is seen closed before it is used (httpcore reads its EOF).
KEEPALIVE_S = 25.0


def bounded_client(cancel: Cancel | None = None, **kwargs: Any) -> httpx.Client:
    """An httpx client whose requests honour :func:`within` (and ``cancel``, when given) and
    whose connections outlast the agent's batch period (``KEEPALIVE_S``)."""
    transport = httpx.HTTPTransport(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S))
    # httpx offers no public way to give its transport a network backend; httpcore's pool
    # takes one (tests/agents/daemon/test_a_trickling_control_plane_never_holds_the_agent.py
    # fails if an upgrade moves it).
    transport._pool._network_backend = _DeadlineBackend(cancel)
    return httpx.Client(transport=transport, **kwargs)
