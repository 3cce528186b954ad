"""The web service's gunicorn worker: uvicorn's, with bounds on a request's head and on the time
a client may take.

gunicorn's own workers refuse a header field over 8,190 bytes or more than 100 fields with a 400.
uvicorn's httptools protocol sets no such bound: it keeps whatever head a client sends (a
megabyte of headers reaches the application), so one client could make a web process hold as
much memory as it cares to send. ``BoundedHttpTools`` counts the head as it arrives and answers
``431 Request Header Fields Too Large`` (and closes the connection) when a field, the number of
fields or the whole head passes gunicorn's limits, before any of it reaches Django. The limits
are gunicorn's settings (``limit_request_fields``, ``limit_request_field_size``), so one place
sets them for either worker class.

It also makes uvicorn's connection handling hold for clients other than ours (docs/agent-protocol.md,
"HTTP"; each point has its test in tests/http_clients/test_server_defects.py):

- Time bounds. A connection that never sends a request is closed after the keep-alive timeout
  (uvicorn armed it only after a first answer). A request whose head and body take longer than
  ``INTUNE_REQUEST_TIMEOUT_S`` (a slow-loris client) is answered ``408`` and the connection
  closed. An answer the client does not read for ``INTUNE_WRITE_TIMEOUT_S`` ends the connection
  (uvicorn waited for the client forever: the request's task and its socket were held).
- A client that half-closes (shuts its write side down after its request) still gets its
  answers, then the connection closes; uvicorn closed it at once and dropped them.
- A client that goes away with requests pipelined is noticed by the request in progress (a held
  long-poll ends at once) and the queued ones are dropped: uvicorn stopped reading the
  connection while a request was queued, and told only the last one queued.
- A header value's trailing whitespace is not part of it (RFC 9110 5.5): ``Host: h:1 `` is
  ``h:1``. No ``100 Continue`` is sent to an HTTP/1.0 client (RFC 9110 10.1.1).
- HTTP/2: a client that opens with its preface (prior knowledge) is answered GOAWAY
  HTTP_1_1_REQUIRED in HTTP/2; a request asking to upgrade (h2c) is served as HTTP/1.1, its
  body included (httptools skipped it).
- A chunked body's trailer fields are dropped (uvicorn appended them to the request's headers)
  and bounded as a head is (tests/http_clients/test_bodies_as_any_client_sends_them.py).

And the worker goes with its master: killed with SIGKILL (a supervisor's hard stop, the OOM
killer), gunicorn's master can no longer stop its workers, and uvicorn's worker, unlike
gunicorn's own, never looks whether its parent is still there. It served on, orphaned, for
ever, holding the listening socket: the master a supervisor then started could not bind the
port while the orphan answered with no master to replace it when it failed
(tests/http_clients/test_a_web_worker_goes_with_its_killed_master.py; the front hunter's
``kill -9`` of the master, seed 219). The worker now asks the kernel for SIGTERM when its
parent dies, and stops as gunicorn's SIGTERM stops it (held long-polls answered at once,
requests in progress finished) within the master's ``graceful_timeout``.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
from typing import Any

import httptools
from django.core.exceptions import ImproperlyConfigured
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from webapp.env import envfloat

# The whole head (request line and every field), at most: room for gunicorn's default of 100
# fields at their usual size, far below what would cost a process memory that matters.
MAX_HEAD_BYTES = 64 * 1024
# The longest a request's head and body may take to arrive, and the longest an answer may wait
# for its client to read any of it: 30 s each by default (INTUNE_REQUEST_TIMEOUT_S,
# INTUNE_WRITE_TIMEOUT_S). An agent's batch of 1 MiB takes milliseconds on any link it runs on.
REQUEST_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 30.0
# Requests a client may queue behind the one in progress (pipelining) before the server stops
# reading its connection (each holds its head, at most MAX_HEAD_BYTES, and 64 KiB of its body).
MAX_PIPELINED = 16
# Set in a request's scope when its client shut its write side down (or closed) while it was in
# progress: it is still answered, but a held long-poll answers at once.
CLIENT_EOF = "intune.client_eof"
# Set in a request's scope when its target is in absolute form (``POST http://host/path``, as
# to a proxy): the authority it names, which uvicorn drops (webapp/agent_asgi.py host_refusal
# holds it against the Host field).
TARGET_AUTHORITY = "intune.target_authority"
_WHITESPACE = (b" ", b"\t")
# An HTTP/2 client that assumes the server speaks it (prior knowledge, RFC 9113 3.3) opens with
# this preface. It is answered in HTTP/2 (RFC 9113 6.5, 6.8): an empty SETTINGS frame, then
# GOAWAY with HTTP_1_1_REQUIRED (0xd) and why, so that the client says "HTTP/1.1 required"
# rather than failing on an HTTP/1.1 answer it cannot read.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_REFUSAL_DEBUG = b"this server speaks HTTP/1.1 and HTTP/1.0 only (docs/agent-protocol.md, HTTP)"
H2_REFUSAL = (
    b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # SETTINGS: length 0, type 4, stream 0
    + (8 + len(H2_REFUSAL_DEBUG)).to_bytes(3, "big")
    + b"\x07\x00\x00\x00\x00\x00"  # GOAWAY: type 7, flags 0, stream 0
    + (0).to_bytes(4, "big")  # last stream id: none was processed
    + (0xD).to_bytes(4, "big")  # HTTP_1_1_REQUIRED
    + H2_REFUSAL_DEBUG
)
# A request's Upgrade field, renamed before the parser reads it (see ``_ignoring_upgrade``).
_UPGRADE_FIELD = re.compile(rb"\r\nupgrade[ \t]*:", re.IGNORECASE)
IGNORED_UPGRADE = b"\r\nx-ignored-upgrade:"
# How long the connection then stays open for the client to read that (what it sends meanwhile
# is discarded: closing with it unread would reset the connection before the client read it).
H2_LINGER_S = 2.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def seconds_setting(name: str, default: float) -> float:
    """A time bound from the environment: a positive number of seconds."""
    value = envfloat(name, default)
    if value <= 0:
        raise ImproperlyConfigured(
            f"{name}={value:g} is not a positive number of seconds: use e.g. {name}={default:g}, "
            "or unset it for that default"
        )
    return value


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing heads over the class's limits with a 431."""

    max_fields = 100
    max_field_bytes = 8190
    max_head_bytes = MAX_HEAD_BYTES
    request_timeout_s = REQUEST_TIMEOUT_S
    write_timeout_s = WRITE_TIMEOUT_S
    max_pipelined = MAX_PIPELINED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # no request's head has begun yet
        self._heads_begun = 0
        self._head_bytes = 0
        self._refused: str | None = None
        self._in_message = False  # a request has begun and not yet ended
        self._message_cycle = None  # that request's cycle, once its head is complete
        self._running = None  # the cycle whose application task runs (or ran last)
        self._request_timer = None
        self._write_timer = None
        self._write_left = 0
        self._half_closed = False
        self._fresh = True  # nothing received yet
        self._speaks_h2 = False  # an HTTP/2 client, answered GOAWAY; its bytes are discarded
        self._after_chunk_size = False  # a chunk's size line read, none of its data yet
        self._trailer_fields = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # uvicorn arms its keep-alive timeout only after an answer: a client that connects and
        # says nothing would hold the connection forever.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # uvicorn tells only ``self.cycle``, the last request parsed: with requests pipelined,
        # the one in progress (a held long-poll) would wait out its period.
        for cycle in (self._running, *(queued for queued, _ in self.pipeline)):
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self.pipeline.clear()
        self._cancel_timers()

    def eof_received(self) -> bool | None:
        """The client shut its write side down (half-close): its complete requests are still
        answered, then the connection closes. A request it left incomplete never will be."""
        if self._speaks_h2:
            return None  # it read the GOAWAY and is gone
        if self._in_message:
            cycle, self._in_message = self._message_cycle, False
            self._cancel_request_timer()
            if cycle is not None and cycle is not self._running:
                self.pipeline = type(self.pipeline)(
                    entry for entry in self.pipeline if entry[0] is not cycle
                )
        running = self._running
        if running is not None and not running.response_complete:
            if running.more_body and not self.pipeline:
                return None  # its body can never end: closed, and the request told so
            # A held long-poll answers now (webapp/agent_asgi.py): a client that closed
            # rather than half-closed sends FIN too, and must not hold it for its whole wait.
            running.scope[CLIENT_EOF] = True
            running.message_event.set()
        pending = [queued for queued, _ in self.pipeline]
        if not pending and running is not None and not running.response_complete:
            pending = [running]
        if not pending:
            return None  # nothing to answer: asyncio closes the connection
        self._half_closed = True
        pending[0].keep_alive = False  # the last request to answer (the pipeline's left end)
        return True

    def data_received(self, data: bytes) -> None:
        if self._speaks_h2:
            return
        if self._fresh:
            self._fresh = False
            if data.startswith(H2_PREFACE):
                self._refuse_http2()
                return
        if self._refused is not None:
            return  # the 431 is written; the connection is closing
        data = self._ignoring_upgrade(data)
        in_head, heads_begun = self._in_head, self._heads_begun
        in_trailer = self._in_message and self._after_chunk_size
        super().data_received(data)
        if self._in_message and self._request_timer is None and not self.transport.is_closing():
            # A request that did not arrive whole in one read: from now it has the request
            # timeout to end (most arrive whole and never arm it).
            self._request_timer = self.loop.call_later(
                self.request_timeout_s, self._request_timed_out
            )
        if self._refused is None and in_head and self._in_head and heads_begun == self._heads_begun:
            # A chunk that was all head: one head was in progress before it and still is after
            # it. A chunk that ends a head, or holds a body's end and the next head's start, is
            # not counted, so a large body is never mistaken for a head (a chunk is at most the
            # event loop's read size, 256 KiB).
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refused = f"the request's head is over {self.max_head_bytes} bytes"
        elif (
            self._refused is None
            and in_trailer
            and self._in_message
            and self._after_chunk_size
            and heads_begun == self._heads_begun
        ):
            # A chunk that was all trailer (after a chunked body's last chunk), or all of one
            # chunk's size line: counted as a head's bytes are. httptools gathers a field's
            # value whole before it calls on_header, so a trailer field that never ended grew
            # the process by all the client sent until the request timeout, at full speed.
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refused = f"the request's trailer is over {self.max_head_bytes} bytes"
        if self._refused is not None:
            self._send_431(self._refused)

    def _ignoring_upgrade(self, data: bytes) -> bytes:
        """``data`` with the Upgrade field of a request head in it renamed, so that the request
        is served as the HTTP/1.1 request it also is (RFC 9110 7.8: a server may ignore
        Upgrade). This server upgrades to nothing (no HTTP/2, no WebSocket), but httptools
        takes a request with ``Connection: Upgrade`` and ``Upgrade`` for one being upgraded: it
        skips its body (a batch POSTed by ``curl --http2``, which asks for h2c, reached the
        view empty: 400 "samples: must be a list") and drops what follows it in the same read
        (a request pipelined behind one went unanswered). Only head bytes are looked at: those
        of a chunk that starts a request or continues its head, up to the head's end."""
        if self._in_message and not self._in_head:
            return data  # a body in progress
        end = data.find(b"\r\n\r\n")
        head = data if end < 0 else data[: end + 2]
        if _UPGRADE_FIELD.search(head) is None:
            return data
        return _UPGRADE_FIELD.sub(IGNORED_UPGRADE, head) + data[len(head) :]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        self._after_chunk_size, self._trailer_fields = False, 0
        self._heads_begun += 1
        self._in_message, self._message_cycle = True, None

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused is not None:
            return
        if value[-1:] in _WHITESPACE:
            value = value.rstrip(b" \t")  # llhttp keeps a value's trailing whitespace
        if len(name) + len(value) > self.max_field_bytes:
            self._refused = f"a header field is over {self.max_field_bytes} bytes"
        elif not self._in_head:
            # A trailer field (after a chunked body): read and dropped. uvicorn appended it to
            # the request's headers, the list its scope holds, where the application read it
            # as a header once the body was read: a trailer "Authorization" joined the head's
            # (a 401), and one could stand in for a field a proxy had checked in the head.
            # RFC 9110 6.5.1: a trailer field is not merged into the header section unless
            # its definition allows it, and none the control plane reads does.
            self._trailer_fields += 1
            if self._trailer_fields > self.max_fields:
                self._refused = f"the request has more than {self.max_fields} trailer fields"
        elif len(self.headers) >= self.max_fields:
            self._refused = f"the request has more than {self.max_fields} header fields"
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._refused is None:
            if not self.url.startswith(b"/"):
                try:
                    target = httptools.parse_url(self.url)
                except httptools.HttpParserInvalidURLError:
                    target = None
                if target is not None and target.host:
                    port = b":%d" % target.port if target.port else b""
                    self.scope[TARGET_AUTHORITY] = target.host + port
            super().on_headers_complete()  # only then does the request reach the application
            self._message_cycle = self.cycle
            if self.pipeline and len(self.pipeline) < self.max_pipelined:
                # uvicorn stops reading while a request waits behind another: a client that
                # then goes away is not noticed, and the request in progress (a held
                # long-poll) waits out its period. Reading goes on up to a bound.
                self.flow.resume_reading()
            if self.expect_100_continue and self.scope["http_version"] == "1.0":
                # An HTTP/1.0 client does not know 100 Continue (RFC 9110 10.1.1).
                self.cycle.waiting_for_100_continue = False

    def on_chunk_header(self) -> None:
        self._after_chunk_size = True  # a chunk's size line, or the last one's: trailers next
        self._head_bytes = 0

    def on_chunk_complete(self) -> None:
        self._after_chunk_size = False

    def on_body(self, body: bytes) -> None:
        self._after_chunk_size = False
        if self._refused is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._request_timer is not None:
            self._cancel_request_timer()
        if self._refused is None:
            super().on_message_complete()

    def _start_asgi_task(self, cycle, app) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.get_write_buffer_size():
            self._watch_writes()  # the client has not read all of it yet
        if (
            self._half_closed
            and not self.pipeline
            and self._running.response_complete
            and not self.transport.is_closing()
        ):
            self.transport.close()  # every answer due is written

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_writes()

    def _watch_writes(self) -> None:
        """Abort the connection when what is written waits a whole write timeout without the
        client reading any of it (asyncio's own close waits for it forever)."""
        if self._write_timer is None:
            self._write_left = self.transport.get_write_buffer_size()
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_check)

    def _write_check(self) -> None:
        self._write_timer = None
        left = self.transport.get_write_buffer_size()
        if left == 0:
            return
        if left >= self._write_left:
            self.logger.warning(
                "%s read none of %d bytes of answers for %g s: connection aborted",
                self.client,
                left,
                self.write_timeout_s,
            )
            self.transport.abort()
            return
        self._watch_writes()

    def _request_timed_out(self) -> None:
        """A request still incomplete after the request timeout: 408 and close, unless answers
        to earlier requests on the connection are still due (the clock starts again then)."""
        self._request_timer = None
        if not self._in_message or self.transport.is_closing():
            return
        cycle = self._message_cycle
        earlier = [queued for queued, _ in self.pipeline if queued is not cycle]
        running = self._running
        if earlier or (
            running is not None and running is not cycle and not running.response_complete
        ):
            self._request_timer = self.loop.call_later(
                self.request_timeout_s, self._request_timed_out
            )
            return
        self._in_message = False
        if cycle is not None:
            answered = cycle.response_started
            cycle.disconnected = True  # its task, waiting for the body, is told it is gone
            cycle.message_event.set()
            if answered:  # answered early (a refusal); the rest of its body never came
                self.transport.close()
                self._watch_writes()
                return
        reason = f"the request did not arrive whole within {self.request_timeout_s:g} s"
        self.logger.warning("refused a request from %s: %s", self.client, reason)
        self._send_refusal(408, reason)

    def _cancel_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_request_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _refuse_http2(self) -> None:
        """Answer an HTTP/2 client's preface with GOAWAY (see ``H2_REFUSAL``), then close."""
        self._speaks_h2 = True
        self._cancel_timers()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self.logger.info("refused HTTP/2 from %s: GOAWAY HTTP_1_1_REQUIRED", self.client)
        self.transport.write(H2_REFUSAL)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(H2_LINGER_S, self.transport.close)
        self._watch_writes()

    def _send_431(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        self.logger.warning("refused a request from %s: %s", self.client, reason)
        cycle = self._message_cycle if self._in_message else None
        if cycle is not None and cycle.response_started:
            # Answered already (a chunked body refused 413 as it passed the limit, its rest
            # read and discarded) when its trailer passed the bounds: a 431 now would be a
            # second answer to one request. The connection ends instead.
            self._cancel_request_timer()
            self.transport.close()
            self._watch_writes()
            return
        self._send_refusal(431, reason)

    def _send_refusal(self, status: int, reason: str) -> None:
        """Answer ``status`` with ``reason`` as plain text, outside any application, and close."""
        self._cancel_request_timer()
        body = f"{reason}\n".encode("ascii")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()
        self._watch_writes()


class BoundedUvicornWorker(UvicornWorker):
    """``uvicorn_worker.UvicornWorker`` speaking ``BoundedHttpTools``, bounded by this server's
    gunicorn limits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        protocol = type(
            "BoundedHttpTools",
            (BoundedHttpTools,),
            {
                "max_fields": self.cfg.limit_request_fields or BoundedHttpTools.max_fields,
                "max_field_bytes": (
                    self.cfg.limit_request_field_size or BoundedHttpTools.max_field_bytes
                ),
                "request_timeout_s": seconds_setting("INTUNE_REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S),
                "write_timeout_s": seconds_setting("INTUNE_WRITE_TIMEOUT_S", WRITE_TIMEOUT_S),
            },
        )
        self.config.http = protocol
        self.config.http_protocol_class = protocol
        # No master is left to SIGKILL an orphan that takes too long to stop: uvicorn bounds it.
        self.config.timeout_graceful_shutdown = self.cfg.graceful_timeout

    def init_process(self) -> None:
        """In the worker, once forked: SIGTERM when the master dies, whatever kills it (see the
        module's docstring). A master that died before this call is noticed here."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass  # not Linux: gunicorn's master stops its workers as before
        if os.getppid() != self.ppid:
            self.log.warning("the master (pid %s) is gone: worker %s exits", self.ppid, self.pid)
            sys.exit(0)
        super().init_process()
