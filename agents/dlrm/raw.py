"""Criteo files as they come: a folder of ``.tsv``, ``.txt`` or ``.csv`` (tab-separated: Spark's
CSV writer with ``sep='\t'``), plain or compressed as Spark, Hadoop and Hive write them (``.gz``,
``.bz2``, ``.deflate``, ``.zst``: ``.tsv.gz``, ``part-...-c000.csv.bz2``, Hive's
``000000_0.deflate``), or files with no suffix (Spark's ``part-00000`` and
``part-00000-<uuid>-c000``, Hive's ``000000_0``) whose first bytes are Criteo text or gzip
(``sniff``: one small read of each, one GET in a store; files with a name are not read to list
them); its sub-folders too (``list_tree``). ``.snappy``, ``.lz4`` and ``.lzo`` files are refused when the pipeline is
built, naming them and what to do (Hadoop frames snappy and lz4 its own way, which nothing
installed reads), and so is ``.zst`` without pyarrow (the standard library reads zstd from
Python 3.14 only). A comma-separated ``.csv`` is refused at its first line.

(A folder of TorchRec's npy days or of Parquet files is read by ``agents.dlrm.formats``, which
also finds which layout a folder holds; the stores, timeouts and bad-line policy below are
shared with it.)

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
- bzip2 and deflate (zlib) are read as gzip is: member by member (bzip2 streams, zlib
  streams), so ``pbzip2``'s many streams are read in parallel and one stream in order; zstd
  (pyarrow's stream) always in order, as one member;
- gzip of one member (what ``gzip`` writes): a gzip stream cannot be entered in the middle,
  so its chunks are inflated in order by one worker that keeps its place in each file (the
  ``read`` stage then has at most one worker; ``parse`` and what follows still scale).
  That worker inflates at zlib's speed, about 250 MB of text (1.4 M lines) a second per
  core on the 2-core host of docs/benchmarks.md, several times what the parse stage of one
  core gets through; the first scan inflates each file once at that speed.

The folder may also be an object-store URL (``s3://bucket/prefix``, ``gs://...``, or any
fsspec URL: ``file://``, ``memory://``), read through fsspec (the protocol's package, such as
``s3fs``, must be installed: ``pip install 'intune[s3]'``). Its objects are listed once; the
index is kept in ``cache_dir()/raw-index/`` under a digest of the URL (nothing is written
into the store) and used again while every object keeps its name, size, ETag and
modification time. A plain-text chunk is one ranged read; a chunk of a many-member gzip
object is inflated from a ranged read of the members it spans, so no object is downloaded
whole for it; a one-member gzip object is read in order, in ranged reads of a few MB. Every
worker process makes its own filesystem handle (fsspec handles are not shared across a
fork). Credentials, endpoints and regions come from the store's usual settings (for S3:
``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL_S3``, ...) or ``storage_options``.

Every request to a store is bounded (``StoreTimeouts``, given as ``store_timeouts``): a
connect and a read timeout on each socket (S3), a deadline on the whole request, so an
object that trickles its bytes is cut as well, and a few attempts with jittered exponential
waits (tenacity). When they are spent the read fails with a ``StoreError`` naming the URL,
the byte range and what to do; a stalled store never holds a training job. Each chunk
carries the version its file was indexed at (``size:mtime_ns``; an S3 object's ETag, sent as
``If-Match``): a file written again, grown or removed under the reader is refused, naming it,
rather than read out of place; a data name that holds no regular file (a FIFO, a link that
leads nowhere) is refused, never opened to wait on (``agents.dlrm.opening``).

Lines end in LF or CRLF (a file exported on Windows), the last one with or without its
newline. Blank lines, a UTF-8 byte-order mark and a header row at the top of a file
(``label\tI1\t...\tC26``, as a CSV writer puts one: 40 fields, none of the 13 integer ones
an integer) are not rows: they are left out when the file is indexed, so a chunk holds
``batch_size`` rows whatever lies between them, and errors still name a line by its number
in the file.

A categorical value is Criteo's 8 hex digits, either case; one of fewer digits (its leading
zeros dropped by whatever wrote it) reads as its value, as in a Parquet file. A malformed line
(not 40 tab-separated fields, a label that is not 0 or 1, an integer feature that is not an
integer, a categorical feature that is not hex of at most 8 digits) stops the pipeline with
an error naming the file and the line (``bad_lines="error"``), or is skipped and counted
(``"skip"``). A folder whose files hold no line at all is refused when the
pipeline is built.
"""

from __future__ import annotations

import asyncio
import bisect
import bz2
import hashlib
import json
import logging
import os
import re
import tempfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tenacity

from agents.dlrm.opening import changed, not_a_file, odd_entry, open_regular
from agents.dlrm.opening import unreadable as unreadable  # formats raises it as raw.unreadable
from agents.dlrm.opening import version as local_version
from agents.dlrm.schema import FIELDS, NUM_DENSE, cache_dir
from agents.dlrm.stages import parse
from agents.process_lock import SharedCount

log = logging.getLogger(__name__)

# Criteo text: tab-separated, whatever the name says (Spark's CSV writer with sep='\t' names
# its files ``part-...-c000.csv``; a comma-separated one is refused at its first line).
TEXT_SUFFIXES = (".tsv", ".txt", ".csv")
# The codecs read, by the suffix Spark, Hadoop and Hive give their files (``part-00000.gz``,
# ``part-...-c000.txt.bz2``, Hive's ``000000_0.deflate``: Hadoop's DefaultCodec, zlib).
# zstd (Spark's ``.zst``) is read with pyarrow's zstd stream (the standard library has none
# before Python 3.14): with the parquet extra installed, refused, saying so, without it.
CODECS = {".gz": "gzip", ".bz2": "bz2", ".deflate": "deflate", ".zst": "zstd"}
# Codecs they write that nothing this reader has decodes: Hadoop's snappy and lz4 add a block
# framing of their own to the codec's (pyarrow reads neither as a stream). A file of one is
# refused when the pipeline is built.
REFUSED_CODECS = {".snappy": "snappy", ".lz4": "lz4", ".lzo": "lzo"}
SUFFIXES = TEXT_SUFFIXES + tuple(CODECS) + tuple(REFUSED_CODECS)
_CODEC_NAMES = {"gzip": "gzip", "bz2": "bzip2", "deflate": "deflate (zlib)", "zstd": "zstd"}
# 3: blank lines and a header row are not rows; 4: codecs other than gzip; 5: each chunk
# carries its file's version (size:mtime, or the object's ETag).
INDEX_VERSION = 5
BAD_LINE_POLICIES = ("error", "skip")
_BLOCK = 1 << 20
_NEWLINE = 10
_CR = 13
# A header row is looked for in a file's first line of up to this many bytes.
_HEADER_MOST = 4096
_BOM = b"\xef\xbb\xbf"
# A tar header says "ustar" at bytes 257-261.
_TAR_MAGIC_END = 262
# A read from an object store: at least this much (small requests cost more than their bytes)
# and at most this much at a time.
_REMOTE_MIN_READ = 256 << 10
_REMOTE_MAX_READ = 8 << 20
# The package each store protocol of fsspec needs.
_STORE_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
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
    # Where, in the file, the gzip member holding the chunk's last byte ends: what a ranged
    # read of an object fetches for the chunk.
    compressed_end: int = 0
    # How errors name the file: its path under the folder read (``day_0/part-00000.gz``).
    name: str = ""
    # The codec of a compressed file (``CODECS``' values; "" for plain text).
    codec: str = ""
    # The file's version when it was indexed: ``size:mtime_ns`` on disk, the ETag in a store
    # ("" when the store gives none); a read of a file no longer at it fails, saying so.
    version: str = ""


@dataclass
class RawIndex:
    """The chunks of a folder, and whether any must be read in order (one reader)."""

    chunks: list[RawChunk]
    sequential: bool
    location: Path


class StoreError(OSError):
    """An object store that cannot be read: its package is not installed, the protocol is
    unknown, listing it failed (credentials refused, no such bucket, unreachable), or it did
    not answer within ``StoreTimeouts``."""


@dataclass(frozen=True)
class StoreTimeouts:
    """The bounds on every request to an object store.

    ``connect_s`` and ``read_s`` bound each socket connect and each wait for bytes (S3; the
    botocore defaults are 60 s each, retried up to 5 times by s3fs and again by botocore);
    ``request_s`` bounds one whole request (a listing, a HEAD, a ranged GET of up to 8 MB,
    see ``_REMOTE_MAX_READ``), so a store that trickles its answer a byte at a time is cut
    too; a request is tried ``attempts`` times, waiting a jittered ``backoff_s``, doubling,
    up to 30 s, between them. The worst wait on one read is about ``attempts * request_s``
    plus the waits: 4 * 60 + 7 s with the defaults. 8 MB in 60 s is 140 KB/s, far below any
    working store.
    """

    connect_s: float = 10.0
    read_s: float = 30.0
    request_s: float = 60.0
    attempts: int = 4
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "read_s", "request_s", "backoff_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"StoreTimeouts.{name} must be > 0, not {getattr(self, name)!r}")
        if self.attempts < 1:
            raise ValueError(f"StoreTimeouts.attempts must be >= 1, not {self.attempts!r}")


DEFAULT_STORE_TIMEOUTS = StoreTimeouts()
# Errors a second attempt cannot mend: said at once.
_FINAL_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _bounded(
    fs: Any,
    url: str,
    what: str,
    call: str,
    timeouts: StoreTimeouts | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``fs.<call>(*args, **kwargs)`` within ``timeouts``: each attempt cut at ``request_s``
    (the async method on the filesystem's own loop, cancelled there when late), retried with
    backoff (tenacity; botocore's and s3fs's own retries are off, ``filesystem``); a
    ``StoreError`` naming ``url`` and ``what`` when the attempts are spent, or at once when
    the store refuses the credentials (an expired token in the middle of a run). A
    ``cat_file`` given ``if_match`` (an ETag) reads that version of an S3 object only: a
    ``ValueError`` saying so when the object was written again since it was listed."""
    t = timeouts or DEFAULT_STORE_TIMEOUTS
    if_match = kwargs.pop("if_match", "")

    def attempt() -> Any:
        method = getattr(fs, "_" + call, None)
        if getattr(fs, "async_impl", False) and method is not None and fs.loop is not None:
            if if_match and call == "cat_file" and hasattr(fs, "_call_s3"):
                request = _s3_range(fs, *args, if_match=if_match, **kwargs)
            else:
                request = method(*args, **kwargs)
            future = asyncio.run_coroutine_threadsafe(
                asyncio.wait_for(request, t.request_s), fs.loop
            )
            try:
                # wait_for ends the request at request_s; the extra second is the loop's.
                return future.result(t.request_s + 1)
            except TimeoutError:
                future.cancel()
                raise TimeoutError(f"no answer within {t.request_s:g} s") from None
        return getattr(fs, call)(*args, **kwargs)  # a local filesystem (memory://, file://)

    def note(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s %s: attempt %d of %d failed (%s: %s); trying again",
            what, url, state.attempt_number, t.attempts, type(exc).__name__, exc,
        )  # fmt: skip

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(
            lambda exc: (
                not isinstance(exc, _FINAL_ERRORS)
                and not _refused(exc)
                and not _precondition_failed(exc)
            )
        ),
        stop=tenacity.stop_after_attempt(t.attempts),
        wait=tenacity.wait_random_exponential(multiplier=t.backoff_s, max=30),
        before_sleep=note,
        reraise=False,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError as spent:
        exc = spent.last_attempt.exception()
        hint = (
            "The store is not answering: check that it is up and reachable from this host "
            "(its endpoint, the network), or give store_timeouts=StoreTimeouts(...) larger "
            "bounds for a slow store"
        )
        if _slow_down(exc):
            hint = (
                "The store asks for fewer requests (SlowDown, 503): give the read stage fewer "
                "workers, or store_timeouts=StoreTimeouts(attempts=..., backoff_s=...) more "
                "and longer waits"
            )
        raise StoreError(
            f"could not {what} {url}: {t.attempts} attempt(s), each bounded by "
            f"{t.request_s:g} s (connect {t.connect_s:g} s, read {t.read_s:g} s), all failed; "
            f"last: {type(exc).__name__}: {exc}. {hint}"
        ) from exc
    except Exception as exc:
        if not getattr(fs, "async_impl", False):
            raise  # a local filesystem's own errors (file://, memory://)
        if _precondition_failed(exc):
            raise ValueError(
                f"{url} changed after it was listed (it is no longer the object of ETag "
                f"{if_match}): it was written again while the pipeline read it; start the "
                "pipeline again to index it afresh (or read a prefix nobody writes to)"
            ) from None
        if _refused(exc):  # s3fs says "The provided token has expired.", not which object
            raise StoreError(_store_failure(url, what, exc)) from None
        raise


async def _s3_range(
    fs: Any, path: str, start: int, end: int, if_match: str = "", **kwargs: Any
) -> bytes:
    """Bytes ``start`` to ``end`` of an S3 object, of ETag ``if_match`` only (one GET; s3fs's
    ``_cat_file`` takes no condition)."""
    bucket, key, _ = fs.split_path(path)
    answer = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=if_match
    )
    try:
        return await answer["Body"].read()
    finally:
        answer["Body"].close()


def _causes(exc: BaseException) -> str:
    """An error and its causes as text (s3fs keeps botocore's error code in the cause)."""
    seen = []
    while exc is not None and len(seen) < 5:
        seen.append(f"{type(exc).__name__}: {exc!r}")
        exc = exc.__cause__ or exc.__context__
    return " | ".join(seen)


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a conditional read found another version of the object (412)."""
    text = _causes(exc)
    return "PreconditionFailed" in text or "pre-conditions you specified" in text


def _slow_down(exc: BaseException | None) -> bool:
    """Whether the store asked for fewer requests (S3's 503 SlowDown)."""
    text = _causes(exc) if exc is not None else ""
    return "SlowDown" in text or "reduce your request rate" in text


def is_url(location: str | Path) -> bool:
    """Whether ``location`` is a URL (``s3://...``) rather than a local folder."""
    return isinstance(location, str) and "://" in location


_filesystems: dict[tuple[str, str], Any] = {}
_filesystems_pid: int | None = None


def filesystem(
    url: str,
    storage_options: dict[str, Any] | None = None,
    timeouts: StoreTimeouts | None = None,
) -> Any:
    """The fsspec filesystem of ``url``'s protocol, made once in each process: a handle made
    before a fork (its connections, its event loop) is not used after it. An S3 handle gets
    ``timeouts``' connect and read timeouts and makes one attempt per request (botocore's and
    s3fs's own retries off: ``_bounded`` retries, within its bounds)."""
    t = timeouts or DEFAULT_STORE_TIMEOUTS
    global _filesystems_pid
    if _filesystems_pid != os.getpid():
        _filesystems.clear()
        _filesystems_pid = os.getpid()
    protocol = url.split("://", 1)[0].lower()
    key = (protocol, json.dumps([storage_options or {}, asdict(t)], sort_keys=True, default=str))
    fs = _filesystems.get(key)
    if fs is not None:
        return fs
    try:
        import fsspec
    except ImportError:
        raise StoreError(
            f"{url}: reading a URL needs fsspec, which is not installed: pip install fsspec "
            "(and the store's package: pip install 'intune[s3]' for s3://)"
        ) from None
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError:
        package = _STORE_PACKAGES.get(protocol, f"the package fsspec names for {protocol}://")
        extra = " (or pip install 'intune[s3]')" if package == "s3fs" else ""
        raise StoreError(
            f"{url}: reading {protocol}:// needs {package}, which is not installed: "
            f"pip install {package}{extra}"
        ) from None
    except ValueError:
        raise StoreError(f"{url}: fsspec knows no protocol {protocol!r}") from None
    options = dict(storage_options or {})
    if protocol in ("s3", "s3a"):
        # The caller's own config_kwargs win; ours fill in what it did not say.
        config = {
            "connect_timeout": t.connect_s,
            "read_timeout": t.read_s,
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            **options.get("config_kwargs", {}),
        }
        options["config_kwargs"] = config
    try:
        fs = cls(skip_instance_cache=True, **options)
    except Exception as exc:
        raise StoreError(_store_failure(url, "open", exc)) from None
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs would retry a timed-out read 5 times, backing off, itself
    _filesystems[key] = fs
    return fs


def _refused(exc: BaseException) -> bool:
    """Whether the store refused the credentials (trying again cannot mend it)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, PermissionError) or any(
        word in text
        for word in ("credential", "accessdenied", "access denied", "forbidden", "signature")
    )


def _store_failure(url: str, what: str, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    credentials = _refused(exc)
    hint = (
        "; check the store's credentials (for S3: AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY; AWS_ENDPOINT_URL_S3 for an S3-compatible server)"
        if credentials
        else ""
    )
    return f"could not {what} {url} ({text}){hint}"


def _open(
    path: str,
    storage_options: dict[str, Any] | None,
    timeouts: StoreTimeouts | None = None,
    version: str = "",
) -> Any:
    """A binary file: a regular file opened without blocking for a local path
    (``open_regular``), an ``_Object`` for a URL (each ``read`` is one bounded ranged
    request of what was asked); ``version``: the one it was indexed at, checked."""
    if is_url(path):
        return _Object(filesystem(path, storage_options, timeouts), path, timeouts, version)
    return open_regular(path, version)


class _Object:
    """An object of a store read as a file: ``read``, ``seek``, ``tell``, each read one ranged
    request bounded by ``StoreTimeouts`` (fsspec's own file objects read without a deadline)."""

    def __init__(self, fs: Any, url: str, timeouts: StoreTimeouts | None, etag: str = "") -> None:
        self.fs, self.url, self.timeouts, self.etag = fs, url, timeouts, etag
        self.size = int(_bounded(fs, url, "read the size of", "info", timeouts, url)["size"])
        self.at = 0

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.at + n, self.size)
        if end <= self.at:
            return b""
        what = f"read bytes {self.at}-{end} of"
        data = _bounded(self.fs, self.url, what, "cat_file", self.timeouts, self.url,
                        start=self.at, end=end, if_match=self.etag)  # fmt: skip
        self.at += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = (
            offset if whence == 0 else (self.at + offset if whence == 1 else self.size + offset)
        )
        return self.at

    def tell(self) -> int:
        return self.at

    def close(self) -> None:
        pass

    def __enter__(self) -> _Object:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _label(path: str) -> str:
    """How errors name a file: its name in a folder, its whole URL in a store."""
    return path if is_url(path) else Path(path).name


_NUMBER = re.compile(r"(\d+)")
# Names of data files in any layout (``agents.dlrm.formats`` reads .npy and Parquet).
_DATA_SUFFIXES = SUFFIXES + (".npy", ".parquet", ".parq", ".pq")


def natural_key(name: str) -> tuple[list, str]:
    """Sorts ``day_2`` before ``day_10``; names whose numbers are equal (``0`` and ``00``) by
    the name itself, so that every listing (a folder, its ``file://`` URL, a store) gives one
    order whatever order it found the files in."""
    # split() with a group alternates text and number: the odd places are the numbers.
    parts = [int(p) if i % 2 else p for i, p in enumerate(_NUMBER.split(name))]
    return parts, name


def _left_out(name: str) -> bool:
    """Files and folders that are not data: Spark's ``_SUCCESS``, ``_temporary/`` and ``.crc``
    files, NVTabular's ``_metadata``, hidden files, our own index, and the ``lost+found`` of a
    disk's root (which only root may list)."""
    return name.startswith(("_", ".")) or name == "lost+found"


def list_tree(
    location: str | Path,
    storage_options: dict[str, Any] | None = None,
    timeouts: StoreTimeouts | None = None,
    data: Any = None,
) -> list[dict[str, Any]]:
    """The files of a folder or URL prefix, in natural order of their names: each with its
    ``name`` (its path under ``location``, ``/``-separated), ``path`` (a path or URL),
    ``size`` and what tells a changed file (``mtime_ns``; in a store ``etag`` and ``mtime``).

    The files of its sub-folders too (Spark writes ``day_0/part-00000...`` or
    ``date=.../part-...`` beside a ``_SUCCESS``), unless the folder itself holds data
    (``data(name)`` true of one of its own files): then its own files only, as a folder was
    always read (a ``sample/`` or ``raw/`` sub-folder beside the days is not read twice over
    them), and the sub-folders' data files left out are logged. Files and folders named ``_*``
    or ``.*`` are left out (``_left_out``).

    With ``data``, a file whose name has no suffix (Spark's ``part-00000``, Hive's
    ``000000_0``) is looked at before ``data`` sees it: its entry's ``content`` says what its
    first bytes hold (``sniff``)."""
    files = _tree(location, storage_options, timeouts)
    looks = data is not None  # only files that may be data are looked at
    data = data or (lambda entry: True)
    own = [f for f in files if "/" not in f["name"]]
    if looks:
        sniff(own, storage_options, timeouts)
    if any(data(f) for f in own):
        below = [f["name"] for f in files if "/" in f["name"] and data(f)]
        if below:
            folders = sorted({n.split("/", 1)[0] + "/" for n in below}, key=natural_key)
            shown = ", ".join(folders[:6]) + (" ..." if len(folders) > 6 else "")
            log.warning(
                "%s: reading the files in the folder itself; %d more in its sub-folders (%s) "
                "are left out (give a sub-folder to read it)", location, len(below), shown,
            )  # fmt: skip
        return own
    if looks:
        sniff(files, storage_options, timeouts)
    return files


# What a file whose name says nothing holds is read from its first bytes (one ranged read, one
# GET in a store): enough for a Criteo line (about 200 bytes) or a header row, a few times over.
SNIFF_BYTES = 16 << 10
# Files looked at in a store at once (each read a GET of its own, bounded by StoreTimeouts).
_SNIFF_THREADS = 16
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"
# What each file was found to hold. No lock: a get and a set of a dict are each atomic, and two
# threads that look at one file at once both find the same thing.
_sniffed: dict[tuple, str | None] = {}
_UNSEEN = object()


def unnamed(name: str) -> bool:
    """Whether a file's name says nothing of what it holds: no suffix (Spark's
    ``part-00000`` and ``part-00000-<uuid>-c000``, Hive's ``000000_0``)."""
    return "." not in name.rsplit("/", 1)[-1]


def sniff(
    files: list[dict[str, Any]],
    storage_options: dict[str, Any] | None = None,
    timeouts: StoreTimeouts | None = None,
) -> None:
    """Set ``content`` on the entries of ``files`` (``list_tree``'s) whose name has no suffix:
    ``"parquet"`` (``PAR1`` first), ``"gzip"`` (``1f 8b`` first), ``"text"`` (a first line of
    Criteo's 40 tab-separated fields, or its header row) or ``None`` (none of them, or empty).
    One read of at most ``SNIFF_BYTES`` from each file's start, once per process while the
    file keeps its size and modification time; in a store each is a GET bounded by
    ``timeouts``, several at once. Named files are not read."""
    todo = [f for f in files if "content" not in f and unnamed(f["name"])]
    if not todo:
        return
    if len(todo) == 1 or not is_url(todo[0]["path"]):
        found = [_sniff_one(f, storage_options, timeouts) for f in todo]
    else:
        with ThreadPoolExecutor(min(_SNIFF_THREADS, len(todo))) as pool:
            found = list(pool.map(lambda f: _sniff_one(f, storage_options, timeouts), todo))
    for entry, content in zip(todo, found, strict=True):
        entry["content"] = content


def _sniff_one(
    entry: dict[str, Any], storage_options: dict[str, Any] | None, timeouts: StoreTimeouts | None
) -> str | None:
    key = tuple(str(entry.get(k)) for k in ("path", "size", "mtime_ns", "etag", "mtime"))
    seen = _sniffed.get(key, _UNSEEN)
    if seen is not _UNSEEN:
        return seen  # type: ignore[return-value]
    size, path = int(entry["size"]), entry["path"]
    head = b""
    if size > 0:
        end = min(size, SNIFF_BYTES)
        if is_url(path):
            fs = filesystem(path, storage_options, timeouts)
            head = _bounded(fs, path, "read the first bytes of", "cat_file", timeouts, path,
                            start=0, end=end)  # fmt: skip
        else:
            with open_regular(path) as handle:
                head = handle.read(end)
    content = content_of(head, whole=len(head) >= size)
    if len(_sniffed) > 100_000:
        _sniffed.clear()
    _sniffed[key] = content
    return content


def content_of(head: bytes, whole: bool = False) -> str | None:
    """What a file whose first bytes are ``head`` holds (``sniff``); ``whole``: ``head`` is
    the whole file (its first line may then end without a newline)."""
    if head.startswith(_PARQUET_MAGIC):
        # Its footer (PAR1 at the end too) is read, and checked, when the file is opened.
        return "parquet"
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    lines = head.removeprefix(_BOM).split(b"\n")
    if not whole:
        lines.pop()  # a line cut off by the read
    for line in lines:
        line = line.removesuffix(b"\r")
        if line:
            fields = line.split(b"\t")
            return "text" if len(fields) == FIELDS or looks_like_header(line) else None
    return None


def _tree(
    location: str | Path,
    storage_options: dict[str, Any] | None = None,
    timeouts: StoreTimeouts | None = None,
) -> list[dict[str, Any]]:
    """Every file under ``location``, its sub-folders' too (``list_tree``)."""
    if is_url(location):
        files = _store_tree(str(location), storage_options, timeouts)
    else:
        folder = Path(location)
        if folder.is_file():
            raise NotADirectoryError(
                f"{folder} is a file; give the folder that holds it ({folder.parent})"
            )
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder of Criteo files")
        files = []
        seen = {os.path.realpath(folder)}

        def unreadable(exc: OSError) -> None:
            # os.walk would leave out a sub-folder it cannot list, and its data with it.
            raise PermissionError(
                f"{folder}: could not list {exc.filename} ({exc.strerror or exc}); its files "
                "would be left out: make it readable (or move it out of the folder)"
            ) from exc

        for top, folders, names in os.walk(folder, onerror=unreadable, followlinks=True):
            keep = []
            for sub in folders:
                real = os.path.realpath(os.path.join(top, sub))
                if not _left_out(sub) and real not in seen:  # a link back up is walked once
                    seen.add(real)
                    keep.append(sub)
            folders[:] = keep
            for name in names:
                path = Path(top) / name
                if _left_out(name):
                    continue
                if not path.is_file():
                    # A FIFO, a socket, a link that leads nowhere: left out, a day's rows
                    # would be missing unsaid; refused when its name says it is data.
                    odd = odd_entry(path)
                    if odd and name.endswith(_DATA_SUFFIXES):
                        raise not_a_file(str(path), odd)
                    continue
                stat = path.stat()
                relative = path.relative_to(folder).as_posix()
                files.append({"name": relative, "path": str(path), "size": stat.st_size,
                              "mtime_ns": stat.st_mtime_ns})  # fmt: skip
    return sorted(files, key=lambda f: natural_key(f["name"]))


# Keys per page of an S3 listing: S3's own most (ListObjectsV2's MaxKeys).
_LIST_PAGE_KEYS = 1000
# A long listing says how far it has got every so many pages (20,000 keys).
_LIST_LOG_EVERY = 20


def _s3_listing(
    fs: Any, root: str, url: str, timeouts: StoreTimeouts | None
) -> dict[str, dict[str, Any]]:
    """Every object under ``root`` (an S3 prefix), as ``find(detail=True)`` gives them, one
    page of ``_LIST_PAGE_KEYS`` keys at a time, each page a request of its own within
    ``timeouts`` (bounded and retried as any other request).

    s3fs's ``find`` lists all pages in one call, so its one bound (``request_s``) cut a prefix
    of many objects on a working store: 2,105 keys took 7.5 s against moto under load, and a
    prefix of a few hundred thousand objects (a Spark job's part files over months) would time
    out at 60 s however healthy the store. Now the bound is on each page: a listing of any
    length goes on while pages come."""
    bucket, key, _ = fs.split_path(fs._strip_protocol(root))
    request = {"Bucket": bucket, "MaxKeys": _LIST_PAGE_KEYS, **getattr(fs, "req_kw", {})}
    request["Prefix"] = key.rstrip("/") + "/" if key else ""
    found: dict[str, dict[str, Any]] = {}
    pages = 0
    while True:
        what = "list" if pages == 0 else f"list page {pages + 1} of"
        page = _bounded(fs, url, what, "call_s3", timeouts, "list_objects_v2", **request)
        pages += 1
        for content in page.get("Contents", []):
            name = f"{bucket}/{content['Key']}"
            found[name] = {**content, "name": name, "type": "file", "size": content["Size"]}
        if not page.get("IsTruncated"):
            break
        if pages % _LIST_LOG_EVERY == 0:
            log.info("listing %s: %d objects in %d pages so far", url, len(found), pages)
        request["ContinuationToken"] = page["NextContinuationToken"]
    if pages > _LIST_LOG_EVERY:
        log.info("listed %s: %d objects in %d pages", url, len(found), pages)
    _cache_listing(fs, f"{bucket}/{key}".rstrip("/"), found)
    if not found and key:  # the prefix may name one object: said by the caller
        try:
            info = _bounded(fs, url, "look up", "info", timeouts, root)
        except FileNotFoundError:
            return {}
        found[str(info["name"])] = info
    return found


def _cache_listing(fs: Any, root: str, found: dict[str, dict[str, Any]]) -> None:
    """Put a listing of everything under ``root`` in ``fs``'s cache of folders, as s3fs's
    ``find`` does: later ``info`` calls (each object's size, as it is opened) are answered from
    it rather than by a HEAD request each (which a store that stalls after the listing also
    held). Each folder's entries are its objects and its sub-folders."""
    folders: dict[str, dict[str, dict[str, Any]]] = {root: {}}
    for name, entry in found.items():
        if name.endswith("/"):
            continue  # the empty object a console makes to show a folder: not a listing entry
        child, parent = entry, name.rsplit("/", 1)[0]
        while True:
            known = parent in folders
            folders.setdefault(parent, {})[child["name"]] = child
            if known or len(parent) <= len(root) or "/" not in parent:
                break
            child = {"Key": parent, "name": parent, "Size": 0, "size": 0,
                     "StorageClass": "DIRECTORY", "type": "directory"}  # fmt: skip
            parent = parent.rsplit("/", 1)[0]
    for folder, entries in folders.items():
        if entries:
            fs.dircache[folder] = sorted(entries.values(), key=lambda e: e["name"])


def _store_tree(
    url: str, storage_options: dict[str, Any] | None, timeouts: StoreTimeouts | None
) -> list[dict[str, Any]]:
    root = url.rstrip("/")
    fs = filesystem(root, storage_options, timeouts)
    try:
        fs.invalidate_cache(root)  # a listing cached by this handle may be stale
        if hasattr(fs, "_call_s3") and not getattr(fs, "version_aware", False):
            found = _s3_listing(fs, root, url, timeouts)
        else:
            found = _bounded(fs, url, "list", "find", timeouts, root, detail=True)
    except FileNotFoundError:
        found = {}
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(_store_failure(url, "list", exc)) from None
    base = str(fs._strip_protocol(root)).rstrip("/")
    files = []
    for key, entry in found.items():
        key = str(entry.get("name") or key)
        if entry.get("type", "file") != "file" or key.endswith("/"):
            continue  # a folder, or the empty object a console makes to show one ("days/")
        if key == base:
            parent = root.rsplit("/", 1)[0]
            raise NotADirectoryError(
                f"{root} is an object, not a folder (prefix): give the one that holds it ({parent})"
            )
        relative = key[len(base) + 1 :] if key.startswith(base + "/") else key.rsplit("/", 1)[-1]
        if any(_left_out(part) for part in relative.split("/")):
            continue
        stamp = entry.get("LastModified") or entry.get("mtime") or entry.get("updated")
        files.append(
            {
                "name": relative,
                "path": f"{root}/{relative}",
                "size": int(entry.get("size") or 0),
                "etag": str(entry.get("ETag") or entry.get("etag") or entry.get("md5Hash") or ""),
                "mtime": str(stamp or entry.get("created") or ""),
            }
        )
    return files


def codec_of(name: str, content: str | None = None) -> str | None:
    """The codec of a raw Criteo file ("" for plain text: ``TEXT_SUFFIXES``, or no suffix and
    text inside; ``CODECS``' and ``REFUSED_CODECS``' values), or ``None`` for a file that is
    not raw text. ``content`` is what ``sniff`` found in a file whose name has no suffix."""
    for suffix, codec in (CODECS | REFUSED_CODECS).items():
        if name.endswith(suffix):
            return codec
    if name.endswith(TEXT_SUFFIXES):
        return ""
    if unnamed(name):
        return {"text": "", "gzip": "gzip"}.get(content or "")
    return None


def _is_raw(entry: dict[str, Any]) -> bool:
    return codec_of(entry["name"], entry.get("content")) is not None


_WHAT_IS_RAW = (
    "*.tsv, *.txt, *.csv of tab-separated text, each maybe compressed (.gz, .bz2, .deflate), "
    "or files with no suffix holding such text (Spark's part-00000, Hive's 000000_0)"
)


def store_files(
    url: str, storage_options: dict[str, Any] | None = None, timeouts: StoreTimeouts | None = None
) -> list[dict[str, Any]]:
    """The Criteo objects under ``url`` (its sub-prefixes too), by name: one listing of the
    store, each with its ``url``, ``name``, ``size``, ``etag`` and ``mtime``."""
    files = [
        {"url": f["path"], "codec": codec_of(f["name"], f.get("content")),
         **{k: f[k] for k in ("name", "size", "etag", "mtime")}}
        for f in list_tree(url, storage_options, timeouts, _is_raw)
        if _is_raw(f)
    ]  # fmt: skip
    if not files:
        raise FileNotFoundError(
            f"no Criteo files found at {url} ({_WHAT_IS_RAW}); give the prefix that holds them"
        )
    return files


def data_files(folder: str | Path) -> list[dict[str, Any]]:
    """The Criteo files of a folder and its sub-folders, by name (``list_tree``'s entries,
    each with its ``codec``)."""
    files = [
        {**f, "codec": codec_of(f["name"], f.get("content"))}
        for f in list_tree(folder, data=_is_raw)
        if _is_raw(f)
    ]
    if not files:
        raise FileNotFoundError(
            f"{folder} holds no Criteo files ({_WHAT_IS_RAW}); "
            "or generate a dataset with `python -m agents.dlrm.generate`"
        )
    return files


def _refuse_codecs(files: list[dict[str, Any]]) -> None:
    """Refuse, when the pipeline is built, files of a codec this reader does not decode,
    naming them and saying what to do."""
    zstd = [f for f in files if f["codec"] == "zstd"]
    if zstd and _pyarrow_zstd() is None:
        shown = ", ".join(f["name"] for f in zstd[:6]) + (" ..." if len(zstd) > 6 else "")
        raise ValueError(
            f"{shown}: compressed with zstd, which is read with pyarrow, not installed: pip "
            "install 'intune[parquet]' (or pyarrow), or decompress the files (zstd -d)"
        )
    refused = [f for f in files if f["codec"] in REFUSED_CODECS.values()]
    if not refused:
        return
    codecs = sorted({f["codec"] for f in refused})
    shown = ", ".join(f["name"] for f in refused[:6])
    shown += f" and {len(refused) - 6} more" if len(refused) > 6 else ""
    raise ValueError(
        f"{shown}: compressed with {' and '.join(codecs)}, which this reader does not decode "
        "(it reads gzip, bzip2, deflate and zstd): write the text with one of those (Spark: "
        ".option('compression', 'gzip'); Hive: SET mapreduce.output.fileoutputformat.compress"
        ".codec=org.apache.hadoop.io.compress.GzipCodec), or decompress the files and give "
        "the folder of those"
    )


def index_locations(folder: str | Path, batch_size: int) -> list[Path]:
    """Where the index of ``folder`` is kept: beside the files, else in the cache folder; for
    a URL, in the cache folder only (a reader does not write into the store)."""
    name = f".intune-criteo-index-b{batch_size}.json"
    if is_url(folder):
        digest = hashlib.sha1(str(folder).rstrip("/").encode()).hexdigest()[:16]
        return [cache_dir() / "raw-index" / f"{digest}-b{batch_size}.json"]
    folder = Path(folder)
    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]
    return [folder / name, cache_dir() / "raw-index" / f"{digest}-b{batch_size}.json"]


def load_or_build_index(
    folder: str | Path,
    batch_size: int,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: StoreTimeouts | None = None,
) -> RawIndex:
    """The chunk index of ``folder`` (a local folder or an object-store URL): the one kept
    from before while the files are unchanged, else a new one (scanning every file once),
    kept for next time. ``storage_options`` go to the fsspec filesystem of a URL, whose every
    request is bounded by ``store_timeouts`` (``DEFAULT_STORE_TIMEOUTS`` when None)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    root: str | Path
    if is_url(folder):
        root = str(folder).rstrip("/")
        objects = store_files(root, storage_options, store_timeouts)
        _refuse_codecs(objects)
        names = {o["url"]: o["name"] for o in objects}
        codecs = {o["url"]: o["codec"] for o in objects}
        versions = {o["url"]: o["etag"] for o in objects}
        signature = [{k: o[k] for k in ("name", "size", "etag", "mtime")} for o in objects]
    else:
        root = Path(folder)
        files = data_files(root)
        _refuse_codecs(files)
        names = {f["path"]: f["name"] for f in files}
        codecs = {f["path"]: f["codec"] for f in files}
        versions = {f["path"]: f"{f['size']}:{f['mtime_ns']}" for f in files}
        signature = [{k: f[k] for k in ("name", "size", "mtime_ns")} for f in files]
    paths = list(names)
    locations = index_locations(root, batch_size)
    for location in locations:
        kept = _read_index(location)
        if kept is not None and kept.get("files") == signature:
            return _from_json(kept, root, location)
    log.info("indexing %d Criteo file(s) in %s (once: the index is kept)", len(paths), root)
    chunks = []
    for path in paths:
        # Errors name a file by its path under the folder; an object by its URL.
        label = path if is_url(path) else names[path]
        chunks += scan_file(path, batch_size, storage_options, store_timeouts, label, codecs[path],
                            versions[path])  # fmt: skip
    if not chunks:
        # Nothing to read would leave a pipeline that cycles over its data (epochs=None)
        # spinning for ever without a batch.
        shown = ", ".join(list(names.values())[:6])
        shown += f" and {len(names) - 6} more" if len(names) > 6 else ""
        raise ValueError(
            f"{root}: its Criteo files ({shown}) hold no lines: they are empty (or gzip of "
            "nothing, blank lines, a header row only); give a folder whose files hold the data"
        )
    body = {
        "format": "criteo-raw-index",
        "version": INDEX_VERSION,
        "batch_size": batch_size,
        "files": signature,
        "chunks": [_chunk_json(c, names[c.path]) for c in chunks],
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


def _chunk_json(chunk: RawChunk, name: str) -> list:
    row = asdict(chunk)
    row["path"] = name  # under the folder: the index holds wherever the folder is
    return [row[k] for k in RawChunk.__dataclass_fields__]


def _from_json(body: dict, root: str | Path, location: Path) -> RawIndex:
    names = list(RawChunk.__dataclass_fields__)
    chunks = []
    for row in body["chunks"]:
        fields = dict(zip(names, row, strict=True))
        name = fields["path"]
        fields["path"] = f"{root}/{name}" if isinstance(root, str) else str(root / name)
        chunks.append(RawChunk(**fields))
    return RawIndex(chunks, any(_needs_order(c) for c in chunks), location)


def _needs_order(chunk: RawChunk) -> bool:
    lead_in = chunk.start - chunk.member_start
    return chunk.compressed and lead_in > _SEQUENTIAL_AFTER * max(chunk.length, 1)


# ----------------------------------------------------------------------------- scanning


def scan_file(
    path: str | Path,
    batch_size: int,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: StoreTimeouts | None = None,
    name: str | None = None,
    codec: str | None = None,
    version: str = "",
) -> list[RawChunk]:
    """The chunks of one file (a path or an object's URL): ``batch_size`` rows each, the
    last what is left; ``name`` is how errors name the file (its path under the folder);
    ``codec`` its codec ("" for plain text; found from the name when not given); ``version``
    the one it was listed at (``RawChunk.version``): a file that changes while it is scanned
    (still being written) is refused, its last line may be cut."""
    path = str(path)
    name = name or _label(path)
    if codec is None:
        codec = codec_of(path) or ""
    if codec and codec not in _CODEC_NAMES:
        _refuse_codecs([{"name": name, "codec": codec}])
    compressed = bool(codec)
    members: list[tuple[int, int]] = []  # (offset in the file, offset in the inflated text)
    ends: list[int] = []  # where each member ends in the file
    cutter = _Cutter(batch_size, name)
    size = _REMOTE_MAX_READ if is_url(path) else _BLOCK
    with _open(path, storage_options, store_timeouts, version) as handle:
        if compressed:
            pieces = _inflate(handle, members, size, name, ends, codec)
        else:
            pieces = _blocks(handle, size)
        lead = b""
        for piece in pieces:
            if len(lead) < _TAR_MAGIC_END:
                lead += piece[: _TAR_MAGIC_END - len(lead)]
                if lead[_TAR_MAGIC_END - 5 :] == b"ustar":
                    raise ValueError(
                        f"{name} is a tar archive, not Criteo text (Criteo's Kaggle download, "
                        f"dac.tar.gz, is one): extract it (tar -xzf {_label(path)}) and give the "
                        "folder of the files it holds (train.txt; its test.txt has no labels)"
                    )
            cutter.feed(piece)
        if version and not is_url(path):  # an object is read at its ETag (If-Match)
            now = local_version(os.fstat(handle.fileno()))
            if now != version:
                raise changed(path, version, now)
    starts = [text for _, text in members]
    chunks = []
    for start, end, rows, first_line in cutter.chunks():
        member = max(bisect.bisect_right(starts, start) - 1, 0)
        offset, member_start = members[member] if members else (0, 0)
        last = max(bisect.bisect_right(starts, max(end - 1, start)) - 1, 0)
        compressed_end = ends[last] if compressed and ends else 0
        chunks.append(
            RawChunk(
                str(path),
                start,
                end - start,
                rows,
                first_line,
                compressed,
                offset,
                member_start,
                compressed_end,
                name,
                codec,
                version,
            )
        )
    return chunks


def _blocks(handle: Any, size: int = _BLOCK) -> Iterator[bytes]:
    while block := handle.read(size):
        yield block


def _inflate(
    handle: Any,
    members: list[tuple[int, int]] | None = None,
    size: int = _BLOCK,
    name: str = "",
    ends: list[int] | None = None,
    codec: str = "gzip",
) -> Iterator[bytes]:
    """The inflated text of a compressed file (``codec``: gzip, bz2 or deflate) from where
    ``handle`` stands, member after member (gzip members, bzip2 streams, zlib streams, as
    concatenated files and parallel compressors leave them), read ``size`` bytes at a time;
    ``members`` collects where each member starts (in the file, and in the text), ``ends``
    where each ends in the file."""
    name = name or str(getattr(handle, "name", "the file"))
    said = _CODEC_NAMES[codec]
    if codec == "zstd":
        yield from _unzstd(handle, members, size, name, ends)
        return
    at_file, at_text = handle.tell(), 0
    inflater = None
    block = b""
    while True:
        if not block:
            block = handle.read(size)
            if not block:
                break
        if inflater is None:
            if not block.strip(b"\0"):
                block = b""  # zero padding after the last member (some tools write it)
                continue
            inflater = _decompressor(codec, block)
            if members is not None:
                members.append((at_file, at_text))
        try:
            text = inflater.decompress(block)
        except (zlib.error, OSError, EOFError) as exc:  # bz2 says OSError("Invalid data ...")
            raise ValueError(
                f"{name}: not a valid {said} stream at byte {at_file} ({exc})"
            ) from None
        if text:
            at_text += len(text)
            yield text
        if inflater.eof:
            at_file += len(block) - len(inflater.unused_data)
            if ends is not None:
                ends.append(at_file)
            block = inflater.unused_data
            inflater = None
        else:
            at_file += len(block)
            block = b""
    if inflater is not None:
        raise ValueError(
            f"{name}: the {said} stream ends in the middle of a member (a truncated file?)"
        )


def _pyarrow_zstd() -> Any:
    """pyarrow, when it is installed and reads zstd; else ``None``."""
    try:
        import pyarrow
    except ImportError:
        return None
    return pyarrow if pyarrow.Codec.is_available("zstd") else None


class _Blocks:
    """A file read ``size`` bytes at a time whatever its reader asks (pyarrow's zstd stream
    asks 64 KB at a time: in a store, a GET each)."""

    closed = False

    def __init__(self, handle: Any, size: int) -> None:
        self.handle, self.size, self.buffer = handle, size, b""

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            data, self.buffer = self.buffer + self.handle.read(), b""
            return data
        if len(self.buffer) < n:
            self.buffer += self.handle.read(max(self.size, n - len(self.buffer)))
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _unzstd(
    handle: Any,
    members: list[tuple[int, int]] | None,
    size: int,
    name: str,
    ends: list[int] | None,
) -> Iterator[bytes]:
    """The text of a zstd file from where ``handle`` stands, read with pyarrow's stream: its
    frames as one member (pyarrow does not say where a frame ends), read in order."""
    pa = _pyarrow_zstd()
    if pa is None:
        _refuse_codecs([{"name": name, "codec": "zstd"}])
    at = handle.tell()
    if members is not None:
        members.append((at, 0))
    source = _Blocks(handle, size)
    stream = pa.CompressedInputStream(pa.PythonFile(source, mode="r"), "zstd")
    while True:
        try:
            text = stream.read(_BLOCK)
        except (OSError, pa.ArrowException) as exc:
            truncated = "truncated" in str(exc).lower()
            raise ValueError(
                f"{name}: the zstd stream ends in the middle of a frame (a truncated file?)"
                if truncated
                else f"{name}: not a valid zstd stream ({exc})"
            ) from None
        if not text:
            break
        yield text
    if ends is not None:
        ends.append(handle.tell())


def _decompressor(codec: str, block: bytes) -> Any:
    """A decompressor of one member of ``codec`` that starts with ``block``."""
    if codec == "bz2":
        return bz2.BZ2Decompressor()
    if codec == "deflate":
        # Hadoop's DefaultCodec (Hive's and Spark's .deflate) writes zlib streams; some tools
        # write raw deflate under the same name: a zlib header says which.
        zlib_header = (
            len(block) >= 2 and block[0] & 15 == 8 and (block[0] << 8 | block[1]) % 31 == 0
        )
        return zlib.decompressobj(15 if zlib_header else -15)
    return zlib.decompressobj(31)


class _Cutter:
    """Finds the end of every ``batch_size``-th row in a stream of pieces of text: a row is a
    line that is neither blank (empty, or a lone ``\\r`` of a CRLF file) nor a header at the
    top of the file (``looks_like_header``)."""

    def __init__(self, batch_size: int, name: str = "") -> None:
        self.batch_size = batch_size
        self.name = name
        self.position = 0
        self.lines = 0  # newlines seen
        self.rows = 0  # rows ended by a newline seen
        self.cuts: list[tuple[int, int]] = []  # (end of a chunk, newlines before it)
        self.line_start = 0  # where the line not yet ended begins
        self.last_byte = _NEWLINE
        self.head = bytearray()  # the first line, while it is not ended (a header?)

    def feed(self, piece: bytes) -> None:
        """Take the next piece of text."""
        if not piece:
            return
        text = np.frombuffer(piece, dtype=np.uint8)
        newlines = np.flatnonzero(text == _NEWLINE)
        ends = newlines + self.position
        starts = np.concatenate([[self.line_start], ends[:-1] + 1])
        before = np.where(newlines > 0, text[np.maximum(newlines - 1, 0)], self.last_byte)
        lengths = ends - starts
        row = (lengths > 1) | ((lengths == 1) & (before != _CR))
        if self.lines == 0:
            first = piece[: newlines[0]] if newlines.size else piece
            self.head += first[: _HEADER_MOST + 1 - len(self.head)]
            if newlines.size:
                row[0] = self._first_line_is_row()
        ordinals = self.rows + np.cumsum(row)
        cut = row & (ordinals % self.batch_size == 0)
        self.cuts += zip(
            (ends[cut] + 1).tolist(), (self.lines + 1 + np.flatnonzero(cut)).tolist(), strict=True
        )
        self.rows += int(row.sum())
        self.lines += int(newlines.size)
        if newlines.size:
            self.line_start = int(ends[-1]) + 1
        self.last_byte = piece[-1]
        self.position += len(piece)

    def _first_line_is_row(self) -> bool:
        """Whether line 1 is a row: not blank once a byte-order mark is dropped, and not a
        header."""
        if len(self.head) > _HEADER_MOST:
            return True
        line = bytes(self.head).removeprefix(_BOM).removesuffix(b"\r")
        if line and looks_like_header(line):
            log.info("%s: line 1 is a header row; it is not read", self.name or "a file")
            return False
        return bool(line)

    def chunks(self) -> Iterator[tuple[int, int, int, int]]:
        """``(start, end, rows, first_line)`` of every chunk (lines counted from 1)."""
        tail = self.position - self.line_start  # a last line without a newline
        tail_row = tail > 1 or (tail == 1 and self.last_byte != _CR)
        if tail and self.lines == 0:
            tail_row = self._first_line_is_row()
        rows = self.rows + int(tail_row)
        start, first_line = 0, 1
        for end, lines in self.cuts:
            yield start, end, self.batch_size, first_line
            start, first_line = end, lines + 1
        left = rows - len(self.cuts) * self.batch_size
        if left > 0:
            yield start, self.position, left, first_line


# ----------------------------------------------------------------------------- the stages


class RawReader:
    """The ``read`` stage over raw files: a chunk's text, with where it comes from.

    Each worker keeps its place in the gzip files it reads, so chunks that come in order are
    inflated once; any other chunk is inflated from the start of its member.
    """

    def __init__(
        self,
        keep_open: int = 8,
        storage_options: dict[str, Any] | None = None,
        store_timeouts: StoreTimeouts | None = None,
    ) -> None:
        self.keep_open = keep_open
        self.storage_options = storage_options
        self.store_timeouts = store_timeouts
        self._cursors: dict[str, _Cursor] = {}

    def __call__(self, chunk: RawChunk) -> dict[str, Any]:
        """Read one chunk: ``{"text", "file", "first_line"}``."""
        if chunk.compressed:
            text = self._cursor(chunk).read(chunk.start, chunk.length)
        elif is_url(chunk.path):  # one ranged request
            fs = filesystem(chunk.path, self.storage_options, self.store_timeouts)
            end = chunk.start + chunk.length
            what = f"read bytes {chunk.start}-{end} of"
            text = _bounded(fs, chunk.path, what, "cat_file", self.store_timeouts, chunk.path,
                            start=chunk.start, end=end, if_match=chunk.version)  # fmt: skip
        else:
            with open_regular(chunk.path, chunk.version) as handle:
                handle.seek(chunk.start)
                text = handle.read(chunk.length)
        if len(text) != chunk.length:
            raise ValueError(
                f"{chunk.path}: expected {chunk.length} bytes from byte {chunk.start}, found "
                f"{len(text)}; the file changed after it was indexed: start again to re-index"
            )
        label = chunk.name or _label(chunk.path)
        return {"text": text, "file": label, "first_line": chunk.first_line}

    def _cursor(self, chunk: RawChunk) -> _Cursor:
        cursor = self._cursors.pop(chunk.path, None)
        if cursor is None or not cursor.can_reach(chunk.start):
            if cursor is not None:
                cursor.close()
            cursor = _Cursor(chunk, self.storage_options, self.store_timeouts)
        self._cursors[chunk.path] = cursor  # most recently used last
        while len(self._cursors) > self.keep_open:
            self._cursors.pop(next(iter(self._cursors))).close()
        return cursor

    def __getstate__(self) -> dict:
        # Open files stay where they are.
        return {
            "keep_open": self.keep_open,
            "storage_options": self.storage_options,
            "store_timeouts": self.store_timeouts,
            "_cursors": {},
        }


class _Cursor:
    """A place in the inflated text of one gzip file."""

    def __init__(
        self,
        chunk: RawChunk,
        storage_options: dict[str, Any] | None = None,
        store_timeouts: StoreTimeouts | None = None,
    ) -> None:
        size = _BLOCK
        if is_url(chunk.path):
            # Ranged reads of the members the chunk spans (a one-member file: a few MB at a
            # time, in order).
            span = chunk.compressed_end - chunk.member_offset
            size = min(max(span, _REMOTE_MIN_READ), _REMOTE_MAX_READ)
        self.handle = _open(chunk.path, storage_options, store_timeouts, chunk.version)
        self.handle.seek(chunk.member_offset)
        self.pieces = _inflate(self.handle, size=size, name=chunk.name or _label(chunk.path),
                               codec=chunk.codec or "gzip")  # fmt: skip
        self.buffer = bytearray()
        self.buffer_start = chunk.member_start  # the text offset of buffer[0]

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
_HASH = re.compile(rb"[0-9a-fA-F]{1,8}")


def line_problem(line: bytes) -> str | None:
    """What is wrong with one Criteo line (``None``: nothing; a blank line is not read)."""
    if not line:
        return None
    fields = line.split(b"\t")
    if len(fields) != FIELDS:
        why = ""
        if len(fields) == FIELDS - 1:
            why = " (Criteo's test files have no label: they are not training data)"
        elif len(fields) == 1 and line.count(b",") in (FIELDS - 1, FIELDS - 2):
            why = " (it is comma-separated: Criteo text separates its fields with tabs)"
        return (
            f"it has {len(fields)} tab-separated fields; a Criteo line has {FIELDS}, a label "
            f"and {FIELDS - 1} features{why}"
        )
    if fields[0] not in (b"0", b"1"):
        return f"label is {fields[0][:24]!r}, not 0 or 1"
    for i, value in enumerate(fields[1 : 1 + NUM_DENSE], 1):
        if value and not _INTEGER.fullmatch(value):
            return f"integer feature I{i} is {value[:24]!r}"
    for i, value in enumerate(fields[1 + NUM_DENSE :], 1):
        if value and not _HASH.fullmatch(value):
            return f"categorical feature C{i} is {value[:24]!r}, not hex of at most 8 digits"
    return None


def looks_like_header(line: bytes) -> bool:
    """Whether a file's first line is a header row (``label\\tI1\\t...\\tC26``, as a CSV
    writer puts one): 40 fields, the label not 0 or 1, and not one of the 13 integer features
    an integer (or empty)."""
    fields = line.removeprefix(_BOM).removesuffix(b"\r").split(b"\t")
    return (
        len(fields) == FIELDS
        and fields[0] not in (b"0", b"1")
        and all(f and not _INTEGER.fullmatch(f) for f in fields[1 : 1 + NUM_DENSE])
    )


def _as_lines(text: bytes, top: bool) -> bytes:
    """A chunk's text as ``\\n``-ended Criteo lines, each where it was (so lines keep their
    numbers): CRLF endings as LF; at the top of a file (``top``), a UTF-8 byte-order mark
    dropped and a header row left blank."""
    if top:
        text = text.removeprefix(_BOM)
        end = text.find(b"\n")
        if looks_like_header(text if end < 0 else text[:end]):
            text = b"" if end < 0 else text[end:]
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").removesuffix(b"\r")
    return text


_BLANK_LINES = re.compile(rb"\n\n+")


@dataclass
class BadLines:
    """How the parse stage treats malformed lines, and how many it skipped (across its
    worker processes: ``count`` lives in shared memory)."""

    policy: str = "error"
    # A SharedCount: a parse worker killed while changing it cannot leave its lock held
    # (a multiprocessing Value's lock it would, and every other worker would wait on it).
    counter: Any = None

    def __post_init__(self) -> None:
        if self.policy not in BAD_LINE_POLICIES:
            raise ValueError(
                f"bad_lines={self.policy!r}: use 'error' (stop, naming the file and line) or "
                "'skip' (drop the line and count it)"
            )
        if self.counter is None:
            self.counter = SharedCount("the count of skipped lines")

    @property
    def count(self) -> int:
        """Malformed lines skipped so far (every epoch counts them again)."""
        return self.counter.value

    def add(self, n: int) -> None:
        """Count ``n`` more skipped lines."""
        self.counter.add(n)


@dataclass
class RawParse:
    """The ``parse`` stage over raw files: ``parse`` on a chunk's text; on a malformed line,
    an error naming the file and line, or (``skip``) the chunk parsed without it."""

    bad_lines: BadLines

    def __call__(self, chunk: dict[str, Any]) -> dict[str, np.ndarray]:
        """Parse one chunk read by ``RawReader``."""
        text = _as_lines(chunk["text"], chunk["first_line"] == 1)
        rows = text
        if b"\n\n" in text or text.startswith(b"\n"):
            rows = _BLANK_LINES.sub(b"\n", text).lstrip(b"\n")  # blank lines are not rows
        try:
            return parse(rows)
        except ValueError as exc:
            first_error = exc
        lines = text.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the text ends with a newline (or is empty)
        bad = [(i, p) for i, line in enumerate(lines) if (p := line_problem(line)) is not None]
        where = f"{chunk['file']}, line"
        last = chunk["first_line"] + len(lines) - 1
        if not bad:  # what the fast parser refused, the line checker did not see
            raise ValueError(f"{where}s {chunk['first_line']}-{last}: {first_error}")
        number, problem = bad[0][0] + chunk["first_line"], bad[0][1]
        if self.bad_lines.policy == "error":
            raise ValueError(
                f"{where} {number}: {problem} (pass bad_lines='skip' to skip such lines)"
            )
        if len(bad) == sum(1 for line in lines if line):
            raise ValueError(
                f"{where}s {chunk['first_line']}-{last}: not one Criteo line "
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
        kept = b"\n".join(line for i, line in enumerate(lines) if line and i not in skip) + b"\n"
        return parse(kept)
