"""Log records a machine can read: one line per record, rich only on a terminal.

journald, Loki and ``grep`` read a log line by line. A record is written as one line
(ISO 8601 timestamp, level, logger, message, newlines in the message escaped as ``\\n``); an
exception follows it as Python's standard ``Traceback (most recent call last):`` block, which
every log collector's multi-line rule knows. rich's console layout (boxes, columns wrapped at
80 characters) is kept for a person at a terminal, where it reads best.

The agent (``intune-agent``), the demo supervisor and the control plane's web and Celery
processes (``webapp/settings.py``'s ``LOGGING``) all use :class:`OneLineFormatter`.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime
from typing import TextIO

LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OneLineFormatter(logging.Formatter):
    """``2025-01-31T12:00:00.123+00:00 INFO agents.daemon: message`` on one line per record.

    Newlines inside the message are escaped, so a record never spills onto the next line; an
    exception's traceback follows in the standard Python format.
    """

    def __init__(self, fmt: str = LINE_FORMAT, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        """The record's time in ISO 8601 with milliseconds and the local UTC offset."""
        when = datetime.fromtimestamp(record.created).astimezone()
        if datefmt:
            return when.strftime(datefmt)
        return when.isoformat(timespec="milliseconds")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        """The record's line, with any newline or carriage return in it escaped."""
        return super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")


def log_handler(stream: TextIO | None = None) -> logging.Handler:
    """A handler writing to ``stream`` (default stderr): rich's if it is a terminal, else a
    plain one that writes :class:`OneLineFormatter` lines."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        try:
            from rich.console import Console
            from rich.logging import RichHandler
        except ImportError:  # pragma: no cover - rich is a dependency; plain lines then
            pass
        else:
            handler: logging.Handler = RichHandler(console=Console(file=stream), show_path=False)
            handler.setFormatter(logging.Formatter("%(message)s"))
            return handler
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter())
    return handler


def configure_logging(level: str | int = "INFO", stream: TextIO | None = None) -> logging.Handler:
    """Send the root logger's records at ``level`` and above to :func:`log_handler`'s handler
    (replacing any handler set before); return that handler."""
    handler = log_handler(stream)
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )
    return handler
