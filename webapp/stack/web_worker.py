"""The web service's gunicorn worker: uvicorn's, with bounds on a request's head.

gunicorn's own workers refuse a header field over 8,190 bytes or more than 100 fields with a 400.
uvicorn's httptools protocol sets no such bound: it keeps whatever head a client sends (a
megabyte of headers reaches the application), so one client could make a web process hold as
much memory as it cares to send. ``BoundedHttpTools`` counts the head as it arrives and answers
``431 Request Header Fields Too Large`` (and closes the connection) when a field, the number of
fields or the whole head passes gunicorn's limits, before any of it reaches Django. The limits
are gunicorn's settings (``limit_request_fields``, ``limit_request_field_size``), so one place
sets them for either worker class.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn_worker import UvicornWorker

# The whole head (request line and every field), at most: room for gunicorn's default of 100
# fields at their usual size, far below what would cost a process memory that matters.
MAX_HEAD_BYTES = 64 * 1024


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing heads over the class's limits with a 431."""

    max_fields = 100
    max_field_bytes = 8190
    max_head_bytes = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # no request's head has begun yet
        self._heads_begun = 0
        self._head_bytes = 0
        self._refused: str | None = None

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return  # the 431 is written; the connection is closing
        in_head, heads_begun = self._in_head, self._heads_begun
        super().data_received(data)
        if self._refused is None and in_head and self._in_head and heads_begun == self._heads_begun:
            # A chunk that was all head: one head was in progress before it and still is after
            # it. A chunk that ends a head, or holds a body's end and the next head's start, is
            # not counted, so a large body is never mistaken for a head (a chunk is at most the
            # event loop's read size, 256 KiB).
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refused = f"the request's head is over {self.max_head_bytes} bytes"
        if self._refused is not None:
            self._send_431(self._refused)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        self._heads_begun += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused is not None:
            return
        if len(name) + len(value) > self.max_field_bytes:
            self._refused = f"a header field is over {self.max_field_bytes} bytes"
        elif len(self.headers) >= self.max_fields:
            self._refused = f"the request has more than {self.max_fields} header fields"
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._refused is None:
            super().on_headers_complete()  # only then does the request reach the application

    def on_body(self, body: bytes) -> None:
        if self._refused is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused is None:
            super().on_message_complete()

    def _send_431(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        self.logger.warning("refused a request from %s: %s", self.client, reason)
        body = f"{reason}\n".encode("ascii")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[431],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


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
            },
        )
        self.config.http = protocol
        self.config.http_protocol_class = protocol
