"""Criteo files as they come: a folder of ``.tsv``, ``.txt``, ``.gz``, ``.tsv.gz`` or ``.txt.gz``.

The pipeline reads the folder in chunks of ``batch_size`` lines (a file's last chunk holds
what is left of it). It finds them by scanning every file once, decompressing the gzip
ones, and keeps that index beside the files (``.intune-criteo-index-b<batch>.json``), or in
``cache_dir()/raw-index/`` when the folder is read-only; the index is used again while every
file keeps its name, size and modification time, and made afresh otherwise.

Reading a chunk, and what it costs:

- plain text: a seek and a read; any number of ``read`` workers;
- gzip with many members (``bgzip``, ``pigz -i``, several ``.gz`` files concatenated, our
  generator's shards): the scan notes where each member starts; a chunk is inflated from
  the member it starts in, so chunks are read in parallel as well;
- gzip of one member (what ``gzip`` writes): a gzip stream cannot be entered in the middle,
  so its chunks are inflated in order by one worker that keeps its place in each file (the
  ``read`` stage then has at most one worker; ``parse`` and what follows still scale).
  That worker inflates at zlib's speed, about 250 MB of text (1.4 M lines) a second per
  core on the 2-core host of docs/benchmarks.md, several times what the parse stage of one
  core gets through; the first scan inflates each file once at that speed.

A malformed line (not 40 tab-separated fields, an integer feature that is not an integer,
a categorical feature that is not 8 hex digits) stops the pipeline with an error naming the
file and the line (``bad_lines="error"``), or is skipped and counted (``"skip"``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.dlrm.schema import FIELDS, NUM_DENSE, cache_dir
from agents.dlrm.stages import parse

log = logging.getLogger(__name__)

SUFFIXES = (".tsv", ".txt", ".gz")
INDEX_VERSION = 1
BAD_LINE_POLICIES = ("error", "skip")
_BLOCK = 1 << 20
_NEWLINE = 10
# A chunk inflated from further than this many of its own lengths into its member makes the
# file one to read in order (re-inflating from the member's start would cost more than it).
_SEQUENTIAL_AFTER = 4


@dataclass(frozen=True)
class RawChunk:
    """``length`` bytes of a file's text from ``start`` (offsets in the inflated text);
    ``member_offset`` is where, in the file, the gzip member holding ``start`` begins, and
    ``member_start`` that member's first byte in the inflated text."""

    path: str
    start: int
    length: int
    rows: int
    first_line: int
    compressed: bool
    member_offset: int = 0
    member_start: int = 0


@dataclass
class RawIndex:
    """The chunks of a folder, and whether any must be read in order (one reader)."""

    chunks: list[RawChunk]
    sequential: bool
    location: Path


def data_files(folder: str | Path) -> list[Path]:
    """The Criteo files of a folder, by name."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of Criteo files")
    files = [
        p
        for p in sorted(root.iterdir())
        if p.is_file() and not p.name.startswith(".") and p.name.endswith(SUFFIXES)
    ]
    if not files:
        raise FileNotFoundError(
            f"{root} holds no Criteo files ({', '.join('*' + s for s in SUFFIXES)}); "
            "or generate a dataset with `python -m agents.dlrm.generate`"
        )
    return files


def _signature(files: list[Path]) -> list[dict[str, Any]]:
    return [
        {"name": p.name, "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in files
    ]


def index_locations(folder: Path, batch_size: int) -> list[Path]:
    """Where the index of ``folder`` is kept: beside the files, else in the cache folder."""
    name = f".intune-criteo-index-b{batch_size}.json"
    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]
    return [folder / name, cache_dir() / "raw-index" / f"{digest}-b{batch_size}.json"]


def load_or_build_index(folder: str | Path, batch_size: int) -> RawIndex:
    """The chunk index of ``folder``: the one kept from before while the files are unchanged,
    else a new one (scanning every file once), kept for next time."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    root = Path(folder)
    files = data_files(root)
    signature = _signature(files)
    locations = index_locations(root, batch_size)
    for location in locations:
        kept = _read_index(location)
        if kept is not None and kept.get("files") == signature:
            return _from_json(kept, root, location)
    log.info("indexing %d Criteo file(s) in %s (once: the index is kept)", len(files), root)
    chunks = []
    for path in files:
        chunks += scan_file(path, batch_size)
    body = {
        "format": "criteo-raw-index",
        "version": INDEX_VERSION,
        "batch_size": batch_size,
        "files": signature,
        "chunks": [_chunk_json(c) for c in chunks],
    }
    location = _write_index(body, locations)
    return _from_json(body, root, location)


def _read_index(location: Path) -> dict | None:
    try:
        body = json.loads(location.read_text())
    except (OSError, ValueError):
        return None
    if body.get("format") != "criteo-raw-index" or body.get("version") != INDEX_VERSION:
        return None
    return body


def _write_index(body: dict, locations: list[Path]) -> Path:
    """Write beside the files, or where the next location allows; say where."""
    text = json.dumps(body)
    failures = []
    for location in locations:
        try:
            location.parent.mkdir(parents=True, exist_ok=True)
            if not writable(location.parent):
                raise PermissionError(f"{location.parent} is read-only")
            fd, scratch = tempfile.mkstemp(prefix=".index-", dir=location.parent)
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(scratch, location)  # a reader never sees half an index
            return location
        except OSError as exc:
            failures.append(f"{location}: {exc}")
    log.warning("could not keep the index (%s); it will be built again", "; ".join(failures))
    return locations[0]


def writable(folder: Path) -> bool:
    """Whether this process may create files in ``folder``."""
    return os.access(folder, os.W_OK)


def _chunk_json(chunk: RawChunk) -> list:
    row = asdict(chunk)
    row["path"] = Path(chunk.path).name
    return [row[k] for k in RawChunk.__dataclass_fields__]


def _from_json(body: dict, root: Path, location: Path) -> RawIndex:
    names = list(RawChunk.__dataclass_fields__)
    chunks = []
    for row in body["chunks"]:
        fields = dict(zip(names, row, strict=True))
        fields["path"] = str(root / fields["path"])
        chunks.append(RawChunk(**fields))
    return RawIndex(chunks, any(_needs_order(c) for c in chunks), location)


def _needs_order(chunk: RawChunk) -> bool:
    lead_in = chunk.start - chunk.member_start
    return chunk.compressed and lead_in > _SEQUENTIAL_AFTER * max(chunk.length, 1)


# ----------------------------------------------------------------------------- scanning


def scan_file(path: Path, batch_size: int) -> list[RawChunk]:
    """The chunks of one file: ``batch_size`` lines each, the last what is left."""
    compressed = path.name.endswith(".gz")
    members: list[tuple[int, int]] = []  # (offset in the file, offset in the inflated text)
    cutter = _Cutter(batch_size)
    with open(path, "rb") as handle:
        pieces = _inflate(handle, members) if compressed else _blocks(handle)
        for piece in pieces:
            cutter.feed(piece)
    starts = [text for _, text in members]
    chunks = []
    for number, (start, end, rows) in enumerate(cutter.chunks()):
        member = max(bisect.bisect_right(starts, start) - 1, 0)
        offset, member_start = members[member] if members else (0, 0)
        chunks.append(
            RawChunk(
                str(path),
                start,
                end - start,
                rows,
                number * batch_size + 1,
                compressed,
                offset,
                member_start,
            )
        )
    return chunks


def _blocks(handle: Any) -> Iterator[bytes]:
    while block := handle.read(_BLOCK):
        yield block


def _inflate(handle: Any, members: list[tuple[int, int]] | None = None) -> Iterator[bytes]:
    """The inflated text of a gzip file from where ``handle`` stands, member after member;
    ``members`` collects where each member starts (in the file, and in the text)."""
    at_file, at_text = handle.tell(), 0
    inflater = None
    block = b""
    while True:
        if not block:
            block = handle.read(_BLOCK)
            if not block:
                break
        if inflater is None:
            if not block.strip(b"\0"):
                block = b""  # zero padding after the last member (some tools write it)
                continue
            inflater = zlib.decompressobj(31)
            if members is not None:
                members.append((at_file, at_text))
        try:
            text = inflater.decompress(block)
        except zlib.error as exc:
            raise ValueError(
                f"{handle.name}: not a valid gzip stream at byte {at_file} ({exc})"
            ) from None
        if text:
            at_text += len(text)
            yield text
        if inflater.eof:
            at_file += len(block) - len(inflater.unused_data)
            block = inflater.unused_data
            inflater = None
        else:
            at_file += len(block)
            block = b""
    if inflater is not None:
        raise ValueError(
            f"{handle.name}: the gzip stream ends in the middle of a member (a truncated file?)"
        )


class _Cutter:
    """Finds the end of every ``batch_size``-th line in a stream of pieces of text."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.position = 0
        self.lines = 0
        self.cuts: list[int] = []
        self.terminated = True  # whether the text so far ends with a newline

    def feed(self, piece: bytes) -> None:
        """Take the next piece of text."""
        newlines = np.flatnonzero(np.frombuffer(piece, dtype=np.uint8) == _NEWLINE)
        ordinals = self.lines + 1 + np.arange(newlines.size)
        ends = newlines[ordinals % self.batch_size == 0] + self.position + 1
        self.cuts += ends.tolist()
        self.lines += int(newlines.size)
        if piece:
            self.terminated = piece.endswith(b"\n")
        self.position += len(piece)

    def chunks(self) -> Iterator[tuple[int, int, int]]:
        """``(start, end, rows)`` of every chunk."""
        lines = self.lines + (0 if self.terminated else 1)
        start = 0
        for end in self.cuts:
            yield start, end, self.batch_size
            start = end
        if start < self.position:
            yield start, self.position, lines - len(self.cuts) * self.batch_size


# ----------------------------------------------------------------------------- the stages


class RawReader:
    """The ``read`` stage over raw files: a chunk's text, with where it comes from.

    Each worker keeps its place in the gzip files it reads, so chunks that come in order are
    inflated once; any other chunk is inflated from the start of its member.
    """

    def __init__(self, keep_open: int = 8) -> None:
        self.keep_open = keep_open
        self._cursors: dict[str, _Cursor] = {}

    def __call__(self, chunk: RawChunk) -> dict[str, Any]:
        """Read one chunk: ``{"text", "file", "first_line"}``."""
        if chunk.compressed:
            text = self._cursor(chunk).read(chunk.start, chunk.length)
        else:
            with open(chunk.path, "rb") as handle:
                handle.seek(chunk.start)
                text = handle.read(chunk.length)
        if len(text) != chunk.length:
            raise ValueError(
                f"{chunk.path}: expected {chunk.length} bytes from byte {chunk.start}, found "
                f"{len(text)}; the file changed after it was indexed: start again to re-index"
            )
        return {"text": text, "file": Path(chunk.path).name, "first_line": chunk.first_line}

    def _cursor(self, chunk: RawChunk) -> _Cursor:
        cursor = self._cursors.pop(chunk.path, None)
        if cursor is None or not cursor.can_reach(chunk.start):
            if cursor is not None:
                cursor.close()
            cursor = _Cursor(chunk.path, chunk.member_offset, chunk.member_start)
        self._cursors[chunk.path] = cursor  # most recently used last
        while len(self._cursors) > self.keep_open:
            self._cursors.pop(next(iter(self._cursors))).close()
        return cursor

    def __getstate__(self) -> dict:
        return {"keep_open": self.keep_open, "_cursors": {}}  # open files stay where they are


class _Cursor:
    """A place in the inflated text of one gzip file."""

    def __init__(self, path: str, member_offset: int, member_start: int) -> None:
        self.handle = open(path, "rb")  # noqa: SIM115 (closed by close())
        self.handle.seek(member_offset)
        self.pieces = _inflate(self.handle)
        self.buffer = bytearray()
        self.buffer_start = member_start  # the text offset of buffer[0]

    def can_reach(self, start: int) -> bool:
        """Whether ``start`` lies ahead (it cannot go back)."""
        return start >= self.buffer_start

    def read(self, start: int, length: int) -> bytes:
        """``length`` bytes of text from ``start``."""
        end = start + length
        while self.buffer_start + len(self.buffer) < end:
            piece = next(self.pieces, None)
            if piece is None:
                break
            if self.buffer_start + len(self.buffer) + len(piece) <= start:
                self.buffer_start += len(self.buffer) + len(piece)  # all before the chunk
                self.buffer.clear()
                continue
            self.buffer += piece
        lead = max(start - self.buffer_start, 0)
        text = bytes(self.buffer[lead : lead + length])
        del self.buffer[: lead + length]
        self.buffer_start = start + len(text)
        return text

    def close(self) -> None:
        """Close the file."""
        self.handle.close()


_INTEGER = re.compile(rb"-?[0-9]{1,19}")
_HASH = re.compile(rb"[0-9a-fA-F]{8}")


def line_problem(line: bytes) -> str | None:
    """What is wrong with one Criteo line (``None``: nothing)."""
    fields = line.split(b"\t")
    if len(fields) != FIELDS:
        return f"it has {len(fields)} tab-separated fields; a Criteo line has {FIELDS}"
    for i, value in enumerate(fields[1 : 1 + NUM_DENSE], 1):
        if value and not _INTEGER.fullmatch(value):
            return f"integer feature I{i} is {value[:24]!r}"
    for i, value in enumerate(fields[1 + NUM_DENSE :], 1):
        if value and not _HASH.fullmatch(value):
            return f"categorical feature C{i} is {value[:24]!r}, not 8 hex digits"
    return None


@dataclass
class BadLines:
    """How the parse stage treats malformed lines, and how many it skipped (across its
    worker processes: ``count`` lives in shared memory)."""

    policy: str = "error"
    counter: Any = None

    def __post_init__(self) -> None:
        if self.policy not in BAD_LINE_POLICIES:
            raise ValueError(
                f"bad_lines={self.policy!r}: use 'error' (stop, naming the file and line) or "
                "'skip' (drop the line and count it)"
            )
        if self.counter is None:
            import multiprocessing

            self.counter = multiprocessing.Value("q", 0)

    @property
    def count(self) -> int:
        """Malformed lines skipped so far (every epoch counts them again)."""
        return int(self.counter.value)

    def add(self, n: int) -> None:
        """Count ``n`` more skipped lines."""
        with self.counter.get_lock():
            self.counter.value += n


@dataclass
class RawParse:
    """The ``parse`` stage over raw files: ``parse`` on a chunk's text; on a malformed line,
    an error naming the file and line, or (``skip``) the chunk parsed without it."""

    bad_lines: BadLines

    def __call__(self, chunk: dict[str, Any]) -> dict[str, np.ndarray]:
        """Parse one chunk read by ``RawReader``."""
        try:
            return parse(chunk["text"])
        except ValueError as exc:
            first_error = exc
        lines = chunk["text"].split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the text ends with a newline (or is empty)
        bad = [(i, p) for i, line in enumerate(lines) if (p := line_problem(line)) is not None]
        where = f"{chunk['file']}, line"
        if not bad:  # what the fast parser refused, the line checker did not see
            raise ValueError(
                f"{where}s {chunk['first_line']}-{chunk['first_line'] + len(lines) - 1}: "
                f"{first_error}"
            )
        number, problem = bad[0][0] + chunk["first_line"], bad[0][1]
        if self.bad_lines.policy == "error":
            raise ValueError(
                f"{where} {number}: {problem} (pass bad_lines='skip' to skip such lines)"
            )
        if len(bad) == len(lines):
            raise ValueError(
                f"{where}s {chunk['first_line']}-{number + len(lines) - 1}: not one Criteo line "
                f"({problem} on the first): is this a Criteo file?"
            )
        self.bad_lines.add(len(bad))
        numbers = ", ".join(str(i + chunk["first_line"]) for i, _ in bad[:5])
        log.warning(
            "%s: skipped %d malformed line(s) (%s%s): first, line %d: %s",
            chunk["file"],
            len(bad),
            numbers,
            ", ..." if len(bad) > 5 else "",
            number,
            problem,
        )
        skip = {i for i, _ in bad}
        kept = b"\n".join(line for i, line in enumerate(lines) if i not in skip) + b"\n"
        return parse(kept)
