"""Criteo data in the layouts DLRM teams keep it in: raw TSV, TorchRec's npy days, Parquet.

``build_pipeline(data_dir=...)`` (``intune-agent --data-dir``) takes a local folder or an
fsspec URL (``s3://bucket/prefix``, ``file://``, ``memory://``, ...) holding one of:

- **raw**: Criteo's text files (``.tsv``, ``.txt``, tab-separated ``.csv``; plain, ``.gz``,
  ``.bz2``, ``.deflate`` or ``.zst``; Spark's ``part-00000`` and Hive's ``000000_0`` with no suffix),
  read by ``agents.dlrm.raw`` (indexed once, the index kept);
- **npy**: TorchRec's preprocessed layout (``torchrec.datasets.criteo.BinaryCriteoUtils``,
  its ``npy_preproc_criteo.py`` script): per day ``{day}_dense.npy`` (N x 13),
  ``{day}_sparse.npy`` (N x 26, int32 or int64) and ``{day}_labels.npy`` (N x 1 or N), days
  ordered by the numbers in their names (``day_2`` before ``day_10``);
- **parquet**: ``.parquet`` / ``.parq`` / ``.pq`` files (NVTabular, Spark, pandas), any number
  of row groups each, with the columns ``label``, ``I1``..``I13``, ``C1``..``C26`` by default
  (another naming: ``Columns``, given as ``columns``), and files with no suffix that start
  with Parquet's ``PAR1`` (Hive's ``000000_0``). Files named ``_*`` or ``.*`` (Spark's
  ``_SUCCESS``, NVTabular's ``_metadata`` and ``_file_list.txt``) are left out.

The files lie in the folder or, when it holds none itself, in its sub-folders, read in the
natural order of their paths under it: a Spark output of ``day_0/part-00000-....parquet`` or
``date=.../part-...`` is given as the folder Spark wrote. (A folder that holds files of its own
is read as always, its own files only: sub-folders beside them, a ``sample/`` or ``raw/``, are
left out, and said so in the log.) Files and folders named ``_*`` or ``.*`` are not data (Spark's
``_SUCCESS``, its unfinished ``_temporary/`` and its ``.crc`` files), nor is a disk's
``lost+found``. A sub-folder that cannot be listed is an error, not left out. A file given for the
folder is refused, naming the folder to give. Errors name a file by its path under the folder
(``date=2026-11-28/part-00000.parquet, row 12``).

``detect_layout`` picks the layout from the file names, and for a file with no suffix from its
first bytes (``raw.sniff``: ``PAR1``, gzip's ``1f 8b``, or a first line of Criteo's 40
tab-separated fields or its header; one small read, once; a file that is none of them is not
data); ``data_format`` (``--data-format``)
forces one (``raw``, ``npy``, ``parquet``) and leaves the other files aside. A folder holding
two layouts, or none, is refused with the files it holds named.

Every layout is read in chunks of ``batch_size`` rows (a file's or day's last chunk holds what
is left), each chunk by any ``read`` worker, and the ``parse`` stage yields the batch dict of
``agents.dlrm.stages.parse``: ``labels`` float32 (B,), ``dense`` float32 (B, 13) with NaN
where missing, ``sparse`` uint32 (B, 26), ``sparse_present`` bool (B, 26). So transform,
collate, prefetch and the trainer are the same for every layout, and the same rows make the
same batches whichever layout holds them.

As with raw text, ``read`` fetches and ``parse`` converts: the read stage (``TableReader``)
hands on the chunk's rows as stored (npy: the three arrays' rows; Parquet: each column's
values and null mask, a string column as the slice's bytes and offsets), and the parse stage
(``TableParse``) turns them into the batch dict and checks them, so the tuner sees where the
CPU goes. What a chunk read costs:

- npy: three ranged reads (the rows of the chunk from each file, after its header); nothing
  else of the file is read, locally or in a store; the header is read once, when the
  pipeline is built;
- parquet: the row groups the chunk spans, only the columns used (in a store: the footer once
  per worker, then a ranged read per row group's columns). A worker keeps the last few row
  groups it decoded, so a row group larger than a batch is decoded once by each worker that
  reads chunks of it, not once per chunk; the categorical columns stay dictionary-encoded
  (as Parquet writers store Criteo's repeating values) and are decoded a batch at a time.
  A decoded row group stays in the worker's memory while it reads from it (measured on
  Criteo-like rows with int64 counts: 235 bytes a row with the categoricals
  dictionary-encoded, 419 as plain strings): row groups of up to a few hundred thousand rows
  (tens of MB a worker) suit.

How values map (documented defaults; what does not fit is said, naming the file and row):

- labels: 0 or 1 (ints, floats or booleans); a missing, NaN or other label is a bad row;
- npy dense: a float array holds TorchRec's ``log(x + 3)`` of the counts (missing as 0): it is
  undone, ``round(exp(v) - 3)``, so the pipeline's own transform applies it once (integer
  counts up to about 500,000 come back exactly; beyond, within float32's precision of the
  log). A float above 44 (or +inf) is no count's log: its row is a bad row (counts saved
  as floats; save them as integers). An integer array holds the counts themselves. TorchRec wrote a missing value as 0,
  so it reads as 0, which the transform treats as it treats a missing one;
- Parquet dense: ints, floats or decimals (SQL engines' DECIMAL) as the counts; null is
  missing (NaN), and so is every value of a column of type null (pandas writes a column of
  None so);
- sparse: hex strings of up to 8 digits (Criteo's own; Parquet strings, or binary as Hive and
  Impala write them), empty or null missing (a column of type null: all); or integers
  already hashed, taken as 32-bit hashes, their low 32 bits (the value modulo 2**32): an int32
  as its 32 bits (TorchRec's int32 files hold the hashes of 2**31 and above as negative
  numbers), a wider int in [0, 2**32) as itself, and a 64-bit hash (Spark's ``xxhash64``,
  signed; Hive's ``hash``) as its low 32 bits, which the transform takes modulo the table's
  size as it takes every hash. npy has no missing value: TorchRec wrote it as 0, which reads
  as missing;
- a bad row (a label or categorical value that does not fit) stops the pipeline with an error
  naming the file and row (rows counted from 0, as numpy and pyarrow count them), or with
  ``bad_lines="skip"`` is dropped and counted in ``pipeline.bad_lines``;
- a file that does not fit as a whole (a missing column, a column of the wrong type, an npy
  array of the wrong shape or shorter than its header says, a float dense array whose first
  4,096 rows hold counts rather than their logs, a day missing one of its three files or whose
  files disagree on the number of rows) is refused when the pipeline is built, naming it.

Reading Parquet needs pyarrow (``pip install 'intune[parquet]'``); it is imported only then.
"""

from __future__ import annotations

import io
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.dlrm import raw
from agents.dlrm.opening import open_regular
from agents.dlrm.schema import NUM_DENSE, NUM_SPARSE

log = logging.getLogger(__name__)

FORMATS = ("auto", "raw", "npy", "parquet")
LAYOUT_NAMES = {"raw": "raw Criteo text", "npy": "TorchRec npy", "parquet": "Parquet"}
NPY_PARTS = ("dense", "sparse", "labels")
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
_NPY_NAME = re.compile(r"^(?P<day>.+)_(?P<part>dense|sparse|labels)\.npy$")
# The most an npy header takes (format 1.0 holds at most 65535 bytes of header).
_NPY_HEAD = 65536 + 16
# The largest float an npy dense array may hold: log(x + 3) of a count below 1.3e19.
_LARGEST_LOG = 44.0
# The rows of a float dense array looked at when the pipeline is built (counts, not logs?).
_NPY_SAMPLE_ROWS = 4096
# A Parquet row group larger than this is worth a word (about 60 MB decoded, per read worker).
_LARGE_GROUP = 262_144
_WHAT_IS_READ = (
    f"raw text: {raw._WHAT_IS_RAW}; TorchRec npy: {{day}}_dense.npy, {{day}}_sparse.npy, "
    "{day}_labels.npy; Parquet: *.parquet, or files with no suffix that start with PAR1"
)
# A hex digit's value; 255 for any other byte.
_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


@dataclass(frozen=True)
class Columns:
    """The Parquet columns that hold the label, the 13 integer and the 26 categorical
    features (Criteo's names by default, as NVTabular and the usual Spark jobs write them)."""

    label: str = "label"
    dense: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
    sparse: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))

    def __post_init__(self) -> None:
        if len(self.dense) != NUM_DENSE or len(self.sparse) != NUM_SPARSE:
            raise ValueError(
                f"Columns needs {NUM_DENSE} dense and {NUM_SPARSE} sparse column names, got "
                f"{len(self.dense)} and {len(self.sparse)}"
            )

    @property
    def names(self) -> list[str]:
        """Every column read, label first."""
        return [self.label, *self.dense, *self.sparse]


@dataclass(frozen=True)
class TableChunk:
    """``rows`` rows from row ``start`` of one npy day or one Parquet file.

    npy: ``paths`` are the day's dense, sparse and labels files, ``arrays`` each file's
    (data offset, dtype, columns). Parquet: ``paths`` is the file, ``groups`` the row groups
    the chunk spans, ``group_start`` the file's row at which ``groups[0]`` begins."""

    layout: str
    paths: tuple[str, ...]
    name: str
    start: int
    rows: int
    arrays: tuple[tuple[int, str, int], ...] = ()
    groups: tuple[int, ...] = ()
    group_start: int = 0


natural_key = raw.natural_key  # sorts ``day_2`` before ``day_10``


# ----------------------------------------------------------------------------- finding files


def list_files(
    location: str | Path,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
) -> dict[str, tuple[str, str | None]]:
    """Every file of a folder or under a URL prefix, its sub-folders' too, by name (its path
    under ``location``; ``_*`` and ``.*`` left out, see ``raw.list_tree``), with its path or
    URL and its layout (``layout_of``; ``None``: not data). A file whose name has no suffix
    gets the layout its first bytes say (``raw.sniff``)."""

    def data(entry: dict[str, Any]) -> bool:
        return layout_of(entry["name"], entry.get("content")) is not None

    listed = raw.list_tree(location, storage_options, store_timeouts, data)
    return {f["name"]: (f["path"], layout_of(f["name"], f.get("content"))) for f in listed}


def layout_of(name: str, content: str | None = None) -> str | None:
    """The layout a file's name belongs to (``None``: none); for a name with no suffix, the
    layout of its ``content`` as ``raw.sniff`` found it (Spark's ``part-00000``, Hive's
    ``000000_0``: text, gzip or Parquet)."""
    if name.endswith(raw.SUFFIXES):
        return "raw"
    if _NPY_NAME.match(name):
        return "npy"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if raw.unnamed(name):
        return {"parquet": "parquet", "text": "raw", "gzip": "raw"}.get(content or "")
    return None


def detect_layout(
    location: str | Path,
    data_format: str = "auto",
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
) -> str:
    """The layout of the data at ``location``: ``raw``, ``npy`` or ``parquet``, found from the
    file names, and the first bytes of those with no suffix (``data_format="auto"``), or as
    forced. A folder of two layouts (under
    ``auto``), or with no file of the layout, is refused naming the files it holds."""
    if data_format not in FORMATS:
        raise ValueError(f"data format {data_format!r}: use one of {', '.join(FORMATS)}")
    names = list_files(location, storage_options, store_timeouts)
    found: dict[str, list[str]] = {}
    for name, (_, layout) in names.items():
        if layout is not None:
            found.setdefault(layout, []).append(name)
    where = (
        f"no Criteo files found at {location}"
        if raw.is_url(location)
        else (f"{location} holds no Criteo files")
    )
    held = f"it holds {_some(list(names))}" if names else "it holds no file"
    if data_format != "auto":
        if data_format not in found:
            raise FileNotFoundError(
                f"{where} of the {LAYOUT_NAMES[data_format]} layout asked for "
                f"({_WHAT_IS_READ}); {held}"
            )
        others = sorted(set(found) - {data_format})
        if others:
            log.info("%s: reading its %s files only, as asked; leaving aside %s", location,
                     LAYOUT_NAMES[data_format], ", ".join(_some(found[o]) for o in others))  # fmt: skip
        return data_format
    if not found:
        raise FileNotFoundError(f"{where} ({_WHAT_IS_READ}); {held}")
    if len(found) > 1:
        parts = "; ".join(f"{LAYOUT_NAMES[k]}: {_some(v)}" for k, v in sorted(found.items()))
        raise ValueError(
            f"{location} holds files of more than one layout ({parts}); keep one layout per "
            "folder, or say which to read (--data-format raw|npy|parquet, or data_format=)"
        )
    return next(iter(found))


def _some(names: list[str], most: int = 6) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def plan_chunks(
    location: str | Path,
    layout: str,
    batch_size: int,
    columns: Columns | None = None,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
) -> list[TableChunk]:
    """The chunks of an npy or Parquet dataset, in order: ``batch_size`` rows each, a day's
    or file's last chunk what is left. Reads only the headers (npy) or footers (Parquet),
    and refuses a file that does not fit as a whole, naming it."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    files = {n: p for n, (p, kind) in list_files(location, storage_options, store_timeouts).items()
             if kind == layout}  # fmt: skip
    if layout == "npy":
        chunks = _plan_npy(files, batch_size, storage_options, store_timeouts)
    elif layout == "parquet":
        chunks = _plan_parquet(files, batch_size, columns or Columns(), storage_options,
                               store_timeouts)  # fmt: skip
    else:
        raise ValueError(f"plan_chunks reads the npy and parquet layouts, not {layout!r}")
    if not chunks:
        raise ValueError(f"{location}: its {LAYOUT_NAMES[layout]} files hold no rows")
    return chunks


def _cuts(rows: int, batch_size: int) -> list[tuple[int, int]]:
    return [(s, min(batch_size, rows - s)) for s in range(0, rows, batch_size)]


# ----------------------------------------------------------------------------- npy


def _plan_npy(
    files: dict[str, str],
    batch_size: int,
    storage_options: dict[str, Any] | None,
    store_timeouts: raw.StoreTimeouts | None,
) -> list[TableChunk]:
    days: dict[str, dict[str, str]] = {}
    for name, path in files.items():
        match = _NPY_NAME.match(name)
        assert match is not None
        days.setdefault(match["day"], {})[match["part"]] = path
    chunks = []
    for day in sorted(days, key=natural_key):
        parts = days[day]
        missing = [f"{day}_{p}.npy" for p in NPY_PARTS if p not in parts]
        if missing:
            raise ValueError(
                f"{day} lacks {', '.join(missing)}: a TorchRec npy day is three files, "
                f"{day}_dense.npy, {day}_sparse.npy and {day}_labels.npy"
            )
        arrays, counts = [], []
        for part, width in zip(NPY_PARTS, (NUM_DENSE, NUM_SPARSE, 1), strict=True):
            path = parts[part]
            offset, dtype, shape = npy_header(path, storage_options, store_timeouts)
            _check_npy(path, part, dtype, shape, width)
            _check_npy_data(path, part, offset, dtype, shape[0], width, storage_options,
                            store_timeouts)  # fmt: skip
            arrays.append((offset, dtype.str, width))
            counts.append(shape[0])
        if len(set(counts)) > 1:
            sizes = ", ".join(f"{day}_{p}.npy {n}" for p, n in zip(NPY_PARTS, counts, strict=True))
            raise ValueError(f"{day}: its files disagree on the number of rows ({sizes})")
        paths = tuple(parts[p] for p in NPY_PARTS)
        for start, rows in _cuts(counts[0], batch_size):
            chunks.append(TableChunk("npy", paths, day, start, rows, tuple(arrays)))
    return chunks


def npy_header(
    path: str,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
) -> tuple[int, np.dtype, tuple[int, ...]]:
    """Where an ``.npy`` file's data begins, its dtype and shape (one read of its head)."""
    with _open(path, storage_options, store_timeouts) as handle:
        head = handle.read(_NPY_HEAD)
    stream = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"npy format version {version} (1.0 and 2.0 are read)")
    except ValueError as exc:
        raise ValueError(f"{raw._label(path)}: not an npy array we can read ({exc})") from None
    if fortran and len(shape) > 1 and shape[1] > 1:
        raise ValueError(
            f"{raw._label(path)}: stored in Fortran (column) order; its rows are not contiguous "
            "(save it with np.save(np.ascontiguousarray(a)))"
        )
    return stream.tell(), dtype, tuple(shape)


def _read_range(
    path: str,
    start: int,
    end: int,
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
) -> bytes:
    """Bytes ``start`` to ``end`` of a file or object (one bounded ranged read in a store)."""
    if raw.is_url(path):
        fs = raw.filesystem(path, storage_options, store_timeouts)
        data = raw._bounded(fs, path, f"read bytes {start}-{end} of", "cat_file",
                            store_timeouts, path, start=start, end=end)  # fmt: skip
    else:
        with open_regular(path) as handle:  # never blocks on a FIFO put in its place
            handle.seek(start)
            data = handle.read(end - start)
    if len(data) != end - start:
        raise ValueError(
            f"{raw._label(path)}: expected {end - start} bytes from byte {start}, found "
            f"{len(data)}; the file is shorter than its header says (changed or truncated?)"
        )
    return data


def _check_npy_data(
    path: str,
    part: str,
    offset: int,
    dtype: np.dtype,
    rows: int,
    width: int,
    storage_options: dict[str, Any] | None,
    store_timeouts: raw.StoreTimeouts | None,
) -> None:
    """Refuse, when the pipeline is built, an npy file shorter than its header says (cut off
    while copied) and a float dense array that holds counts rather than their logs (from its
    first rows), rather than stop the pipeline on it in the middle of an epoch."""
    label = raw._label(path)
    size = (
        int(raw._bounded(raw.filesystem(path, storage_options, store_timeouts), path,
                         "read the size of", "info", store_timeouts, path)["size"])
        if raw.is_url(path)
        else Path(path).stat().st_size
    )  # fmt: skip
    wanted = offset + rows * width * dtype.itemsize
    if size < wanted:
        raise ValueError(
            f"{label}: its header says {rows} rows ({wanted} bytes with the header), but it "
            f"holds {size} bytes: it was cut off (copied or written only in part?)"
        )
    if part != "dense" or dtype.kind != "f" or rows == 0:
        return
    first = min(rows, _NPY_SAMPLE_ROWS)
    data = _read_range(path, offset, offset + first * width * dtype.itemsize, storage_options,
                       store_timeouts)  # fmt: skip
    values = np.frombuffer(data, dtype=dtype).astype(np.float64)
    wrong = np.flatnonzero(values > _LARGEST_LOG)  # -inf: log(0), a count of -3
    if wrong.size:
        row, column = divmod(int(wrong[0]), width)
        raise ValueError(
            f"{label}: row {row}, column {column} holds {values[wrong[0]]:g}, which is no "
            "count's log: a float dense array holds TorchRec's log(x + 3) of the counts, and "
            "this one seems to hold the counts; save them as integers (a.astype(np.int64))"
        )


def _check_npy(path: str, part: str, dtype: np.dtype, shape: tuple, width: int) -> None:
    label = raw._label(path)
    wanted = f"(N, {width})" if part != "labels" else "(N, 1) or (N,)"
    fits = (len(shape) == 2 and shape[1] == width) or (part == "labels" and len(shape) == 1)
    if not fits:
        raise ValueError(f"{label}: shape {shape}; a TorchRec {part} array is {wanted}")
    kinds = {"dense": "fiu", "sparse": "iu", "labels": "fiub"}[part]
    if dtype.kind not in kinds:
        raise ValueError(
            f"{label}: dtype {dtype}; a {part} array holds "
            + {
                "dense": "floats or integers",
                "sparse": "integers",
                "labels": "0 and 1 (ints, floats or booleans)",
            }[part]  # fmt: skip
        )


# ----------------------------------------------------------------------------- parquet


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ImportError(
            "reading Parquet needs pyarrow, which is not installed: pip install "
            "'intune[parquet]' (or pip install pyarrow)"
        ) from None
    return pyarrow


def _parquet_file(
    path: str, storage_options: Any, store_timeouts: Any, dictionaries: Any = None
) -> Any:
    pa = _pyarrow()
    source: Any = path
    if raw.is_url(path):
        fs = raw.filesystem(path, storage_options, store_timeouts)
        source = _StoreFile(fs, path, store_timeouts)
    else:
        open_regular(path).close()  # pyarrow's open() would wait on a FIFO for ever
    try:
        return pa.parquet.ParquetFile(source, read_dictionary=dictionaries)
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, raw.StoreError):
            raise
        if isinstance(exc, PermissionError) and not raw.is_url(path):
            raise raw.unreadable(path, exc) from None  # not "not a Parquet file"
        raise ValueError(f"{raw._label(path)}: not a Parquet file we can read ({exc})") from None


def _plan_parquet(
    files: dict[str, str],
    batch_size: int,
    columns: Columns,
    storage_options: dict[str, Any] | None,
    store_timeouts: raw.StoreTimeouts | None,
) -> list[TableChunk]:
    chunks = []
    for name, path in files.items():
        parquet = _parquet_file(path, storage_options, store_timeouts)
        _check_schema(name, parquet.schema_arrow, columns)
        meta = parquet.metadata
        group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if max(group_rows, default=0) > _LARGE_GROUP:
            log.warning(
                "%s: row groups of up to %d rows; each read worker decodes a whole group and "
                "keeps it while it reads from it (about 240 bytes a row): rewrite it with "
                "smaller row groups (pyarrow: row_group_size=%d) if the workers run short of "
                "memory", name, max(group_rows), _LARGE_GROUP,
            )  # fmt: skip
        group_starts = np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64)
        for start, rows in _cuts(int(group_starts[-1]), batch_size):
            first = int(np.searchsorted(group_starts, start, side="right")) - 1
            last = int(np.searchsorted(group_starts, start + rows - 1, side="right")) - 1
            groups = tuple(range(first, last + 1))
            chunks.append(TableChunk("parquet", (path,), name, start, rows, groups=groups,
                                     group_start=int(group_starts[first])))  # fmt: skip
    return chunks


def _check_schema(name: str, schema: Any, columns: Columns) -> None:
    pa = _pyarrow()
    types = pa.types
    missing = [c for c in columns.names if schema.get_field_index(c) < 0]
    if missing:
        raise ValueError(
            f"{name}: no column {_some(missing, 8)}; it has {_some(schema.names, 8)}. The "
            "columns are label, I1..I13, C1..C26 unless you name yours (Columns(label=..., "
            "dense=(...), sparse=(...)))"
        )

    def value_type(column: str) -> Any:
        kind = schema.field(column).type
        return kind.value_type if types.is_dictionary(kind) else kind

    if not _is_number(value_type(columns.label)):
        kind = value_type(columns.label)
        raise ValueError(f"{name}: column {columns.label} is {kind}, not a number{_as_text(kind)}")
    for column in columns.dense:
        # A column of nulls only (pandas writes a column of None as type null): all missing.
        if not (_is_number(value_type(column)) or types.is_null(value_type(column))):
            kind = value_type(column)
            raise ValueError(f"{name}: column {column} is {kind}, not a number{_as_text(kind)}")
    for column in columns.sparse:
        kind = value_type(column)
        if not (types.is_integer(kind) or _is_text(kind) or types.is_null(kind)):
            raise ValueError(
                f"{name}: column {column} is {kind}; a categorical feature is hex strings "
                "(Criteo's 8 hex digits) or integers already hashed"
            )


def _is_number(kind: Any) -> bool:
    """Whether a Parquet column of this type holds numbers. Decimals: SQL engines (Hive,
    Spark SQL, Trino) write DECIMAL columns so."""
    types = _pyarrow().types
    tests = (types.is_integer, types.is_floating, types.is_boolean, types.is_decimal)
    return any(is_kind(kind) for is_kind in tests)


def _is_text(kind: Any) -> bool:
    """Whether a Parquet column of this type holds text. Hive, Impala and older Spark write
    strings as plain binary (no UTF8 annotation)."""
    types = _pyarrow().types
    tests = (types.is_string, types.is_large_string, types.is_binary, types.is_large_binary)
    return any(is_kind(kind) for is_kind in tests)


def _as_text(kind: Any) -> str:
    """What to do about numbers stored as text (a CSV read without a schema leaves them so)."""
    if not _is_text(kind):
        return ""
    return (
        " (numbers stored as text, as a CSV read without a schema leaves them: write the "
        "label and I1..I13 as integers, e.g. Spark's .cast('int') or pandas' to_numeric)"
    )


class _StoreFile(raw._Object):
    """An object of a store as pyarrow reads it: each read one bounded ranged request."""

    closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def _open(path: str, storage_options: Any, store_timeouts: Any) -> Any:
    return raw._open(path, storage_options, store_timeouts)


# ----------------------------------------------------------------------------- the stages


@dataclass
class TableReader:
    """The ``read`` stage over npy days and Parquet files: a chunk's rows as they are stored
    (``TableParse`` turns them into the batch dict): for npy, the rows of each of the day's
    three arrays; for Parquet, each column's values and null mask, a string column as its
    bytes and offsets.

    A worker keeps the Parquet files it reads open and the last ``keep_groups`` row groups
    it decoded (chunks come to it in order: the next is most often in the same group)."""

    columns: Columns = field(default_factory=Columns)
    storage_options: dict[str, Any] | None = None
    store_timeouts: raw.StoreTimeouts | None = None
    keep_groups: int = 4
    keep_open: int = 8

    def __post_init__(self) -> None:
        self._files: OrderedDict[str, Any] = OrderedDict()
        self._groups: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def __call__(self, chunk: TableChunk) -> dict[str, Any]:
        """Read one chunk: ``{"layout", "file", "first_row", "rows", "columns"}``."""
        columns = self._npy(chunk) if chunk.layout == "npy" else self._parquet(chunk)
        return {
            "layout": chunk.layout,
            "file": chunk.name,
            "first_row": chunk.start,
            "rows": chunk.rows,
            "columns": columns,
        }

    def _range(self, path: str, start: int, end: int) -> bytes:
        return _read_range(path, start, end, self.storage_options, self.store_timeouts)

    def _npy(self, chunk: TableChunk) -> dict[str, np.ndarray]:
        parts = []
        for path, (offset, dtype, width) in zip(chunk.paths, chunk.arrays, strict=True):
            kind = np.dtype(dtype)
            row = kind.itemsize * width
            data = self._range(path, offset + chunk.start * row,
                               offset + (chunk.start + chunk.rows) * row)  # fmt: skip
            array = np.frombuffer(data, dtype=kind).reshape(chunk.rows, width)
            parts.append(array.astype(kind.newbyteorder("="), copy=False))
        return dict(zip(NPY_PARTS, parts, strict=True))

    def _parquet(self, chunk: TableChunk) -> dict[str, Any]:
        pa = _pyarrow()
        path = chunk.paths[0]
        tables = [self._group(path, g, chunk.name) for g in chunk.groups]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        table = table.slice(chunk.start - chunk.group_start, chunk.rows)
        if table.num_rows != chunk.rows:
            raise ValueError(
                f"{chunk.name}: expected {chunk.rows} rows from row {chunk.start}, found "
                f"{table.num_rows}; the file changed after the pipeline was built"
            )
        names = self.columns
        return {
            "label": _column(table, names.label),
            "dense": [_column(table, name) for name in names.dense],
            "sparse": [_column(table, name) for name in names.sparse],
        }

    def _group(self, path: str, group: int, name: str) -> Any:
        key = (path, group)
        table = self._groups.pop(key, None)
        if table is None:
            pa = _pyarrow()
            try:
                # One thread: a worker is one CPU slot of the host's budget (pyarrow's own
                # pool would take every core behind the tuner's back).
                table = self._file(path).read_row_group(
                    group, columns=self.columns.names, use_threads=False
                )
            except (OSError, pa.ArrowException) as exc:
                if isinstance(exc, raw.StoreError):
                    raise
                # pyarrow says "Couldn't deserialize thrift" or "File too short", not which
                # file, nor why: a file rewritten under the reader (a Spark job run again).
                said = " ".join(str(exc).split())[:200]
                raise ValueError(
                    f"{name}: could not read its row group {group} ({type(exc).__name__}: "
                    f"{said}); the file changed after the pipeline was built (written again "
                    "while it was read?) or is damaged: start the pipeline again once it is "
                    "whole"
                ) from None
        self._groups[key] = table  # most recently used last
        while len(self._groups) > self.keep_groups:
            self._groups.popitem(last=False)
        return table

    def _file(self, path: str) -> Any:
        parquet = self._files.pop(path, None)
        if parquet is None:
            # Categorical strings stay dictionary-encoded as stored (Criteo's repeat): decoded
            # a slice at a time, a row group costs a third of the time and memory.
            parquet = _parquet_file(
                path, self.storage_options, self.store_timeouts, list(self.columns.sparse)
            )
        self._files[path] = parquet
        while len(self._files) > self.keep_open:
            self._files.popitem(last=False)
        return parquet

    def __getstate__(self) -> dict:
        # Open files and decoded row groups stay where they are.
        state = dict(self.__dict__)
        state["_files"], state["_groups"] = OrderedDict(), OrderedDict()
        return state


def _column(table: Any, name: str) -> dict[str, Any]:
    """One column of a slice of a table as numpy arrays: ``values`` (numbers; 0 where null)
    or ``offsets`` and ``data`` (strings: the slice's own bytes), and ``null``."""
    pa = _pyarrow()
    column = table.column(name)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    n = len(array)
    null = (
        array.is_null().to_numpy(zero_copy_only=False)
        if array.null_count
        else np.zeros(n, dtype=bool)
    )
    if pa.types.is_null(array.type):  # every value missing
        return {"name": name, "values": np.zeros(n, np.int64), "null": np.ones(n, dtype=bool)}
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        array = array.cast(pa.large_binary())  # laid out as a large_string
    elif pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.large_string())
    if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
        _, offsets_buffer, data_buffer = array.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[array.offset : array.offset + n + 1]
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
        # A slice of a row group shares the group's buffer: only this slice's bytes travel.
        base = int(offsets[0]) if n else 0
        data = data[base : int(offsets[-1])] if n else data[:0]
        return {"name": name, "offsets": offsets - base, "data": data, "null": null}
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.int8())
    elif pa.types.is_decimal(array.type):
        array = array.cast(pa.float64())  # numpy would hold Decimal objects
    values = array.fill_null(0).to_numpy(zero_copy_only=False)
    return {"name": name, "values": values, "null": null}


def convert(item: dict[str, Any]) -> dict[str, Any]:
    """The parse stage's arrays of a chunk read by ``TableReader`` (``labels``, ``dense``,
    ``sparse``, ``sparse_present``), with ``bad`` (one flag a row that does not fit) and
    ``problem`` (what is wrong with the first, naming file and row; "" when none is)."""
    rows = _Rows(item["file"], item["first_row"], item["rows"])
    columns = item["columns"]
    n = item["rows"]
    if item["layout"] == "npy":
        label = rows.labels(columns["labels"][:, 0], None, "label")
        dense = columns["dense"]
        if dense.dtype.kind == "f":
            logs = dense.astype(np.float64)
            # Past this no count's log lies (e**44 is 1.3e19): counts saved as floats, which
            # would read as inf without a word.
            wrong = logs > _LARGEST_LOG  # +inf too; -inf is log(0), a count of -3
            if wrong.any():
                stored = columns["dense"]

                def say(row: int) -> str:
                    at = int(np.argmax(wrong[row]))
                    return (
                        f"dense column {at} is {stored[row, at]:g}, not TorchRec's log(x + 3) of "
                        "a count (a float dense array holds those; save counts as integers)"
                    )

                rows.flag(wrong.any(axis=1), say)
            # TorchRec's log(x + 3), undone; the transform applies it again.
            with np.errstate(over="ignore", invalid="ignore"):
                dense = np.rint(np.exp(np.where(wrong, 0.0, logs)) - 3.0)
        hashes = np.empty((n, NUM_SPARSE), dtype=np.uint32)
        for i in range(NUM_SPARSE):
            hashes[:, i] = rows.integers(columns["sparse"][:, i])
        return rows.item(label, dense.astype(np.float32), hashes, hashes != 0)
    column = columns["label"]
    label = rows.labels(column["values"], column["null"], column["name"])
    dense = np.empty((n, NUM_DENSE), dtype=np.float32)
    for i, column in enumerate(columns["dense"]):
        dense[:, i] = column["values"]
        dense[column["null"], i] = np.nan
    hashes = np.empty((n, NUM_SPARSE), dtype=np.uint32)
    present = np.empty((n, NUM_SPARSE), dtype=bool)
    strings = []
    for i, column in enumerate(columns["sparse"]):
        if "values" in column:
            hashes[:, i] = rows.integers(column["values"])
            present[:, i] = ~column["null"]
        else:
            strings.append(i)
    if strings:
        # Every string column in one pass (a column of a batch is too short for numpy's
        # per-call cost not to count).
        text = [columns["sparse"][i] for i in strings]
        shifts = np.cumsum([0] + [c["data"].size for c in text[:-1]])
        starts = np.concatenate([c["offsets"][:-1] + k for c, k in zip(text, shifts, strict=True)])
        ends = np.concatenate([c["offsets"][1:] + k for c, k in zip(text, shifts, strict=True)])
        data = np.concatenate([c["data"] for c in text])
        null = np.concatenate([c["null"] for c in text])
        values, here, wrong = _hex(starts, ends, data, null)
        hashes[:, strings] = values.reshape(len(strings), n).T
        present[:, strings] = here.reshape(len(strings), n).T
        wrong = wrong.reshape(len(strings), n)
        for j, i in enumerate(strings):
            name = columns["sparse"][i]["name"]

            def say(row: int, j: int = j, name: str = name) -> str:
                at = j * n + row
                value = bytes(data[starts[at] : ends[at]]).decode(errors="replace")
                return f"categorical feature {name} is {value[:24]!r}, not hex of at most 8 digits"

            rows.flag(wrong[j], say)
    return rows.item(label, dense, hashes, present)


def _hex(
    starts: np.ndarray, ends: np.ndarray, data: np.ndarray, null: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hex strings of up to 8 digits (``data[starts[i]:ends[i]]``) as uint32 (0 where missing
    or wrong), where a value is present, and where one is wrong (not hex, too long)."""
    n = null.size
    lengths = ends - starts
    eight = lengths == 8
    if data.size == 8 * int(eight.sum()) and data.size % 8 == 0:
        # Criteo's own: every value 8 digits or empty, so the values lie end to end in
        # ``data``: no gather, and most often no wrong digit.
        nibbles = _HEX[data]
        if not (nibbles > 15).any():
            packed = (nibbles[0::2] << 4) | nibbles[1::2]
            hashes = np.zeros(n, dtype=np.uint32)
            hashes[eight] = packed.view(">u4")
            present = ~null & eight
            hashes[~present] = 0
            return hashes, present, np.zeros(n, dtype=bool)
    present = ~null & (lengths > 0)
    long = present & (lengths > 8)
    # The last 8 bytes of each value, from a copy with 8 zero bytes in front (a value
    # shorter than 8 digits takes the bytes before it, masked off as leading zeros).
    padded = np.concatenate([np.zeros(8, np.uint8), data])
    at = ends[:, None] + np.arange(8)  # index into padded: ends - 8 + i, shifted by 8
    nibbles = _HEX[padded[at]]
    nibbles[at < starts[:, None] + 8] = 0
    not_hex = present & ~long & np.any(nibbles > 15, axis=1)
    # Two digits a byte, four bytes a big-endian uint32.
    packed = (nibbles[:, 0::2] << 4) | (nibbles[:, 1::2] & 15)
    hashes = np.ascontiguousarray(packed).view(">u4").reshape(n).astype(np.uint32)
    wrong = long | not_hex
    hashes[~present | wrong] = 0
    return hashes, present & ~wrong, wrong


class _Rows:
    """The rows of one chunk that do not fit, and what is wrong with the first of them."""

    def __init__(self, name: str, start: int, rows: int) -> None:
        self.name, self.start = name, start
        self.bad = np.zeros(rows, dtype=bool)
        self.first: tuple[int, str] | None = None

    def flag(self, mask: np.ndarray, say: Any) -> None:
        """Mark the rows of ``mask`` bad; ``say(i)`` tells what is wrong with row ``i``."""
        if not mask.any():
            return
        self.bad |= mask
        i = int(np.argmax(mask))
        if self.first is None or i < self.first[0]:
            self.first = (i, say(i))

    def labels(self, values: np.ndarray, null: np.ndarray | None, name: str) -> np.ndarray:
        values = values.astype(np.float64)
        if null is not None:
            self.flag(null, lambda i: f"{name} is missing (null)")
        nan = np.isnan(values) & (True if null is None else ~null)
        self.flag(nan, lambda i: f"{name} is NaN")
        other = ~np.isnan(values) & (values != 0) & (values != 1)
        self.flag(other, lambda i: f"{name} is {values[i]:g}, not 0 or 1")
        return np.where(values == 1, 1.0, 0.0).astype(np.float32)

    def integers(self, values: np.ndarray) -> np.ndarray:
        """Already-hashed categorical values as 32-bit hashes: their low 32 bits, the value
        modulo 2**32 (0 where null: the caller filled those). An int32 is so taken as its 32
        bits (TorchRec's int32 files), and a 64-bit hash (Spark's ``xxhash64``, signed) as
        its low 32 bits; the transform then takes every hash modulo its table's size, as
        TorchRec's preprocessing takes its hashes. (The batch holds 32-bit hashes in every
        layout; a hash kept whole would take the table's size directly: the two give the
        same index for tables of 2**k rows, and an equally spread one otherwise.)"""
        return values.astype(np.uint32)  # numpy's integer cast keeps the low 32 bits

    def item(
        self, labels: np.ndarray, dense: np.ndarray, sparse: np.ndarray, present: np.ndarray
    ) -> dict[str, Any]:
        problem = ""
        if self.first is not None:
            i, what = self.first
            problem = f"{self.name}, row {self.start + i}: {what}"
        return {
            "labels": labels,
            "dense": dense,
            "sparse": sparse,
            "sparse_present": present,
            "bad": self.bad,
            "problem": problem,
        }


@dataclass
class TableParse:
    """The ``parse`` stage over npy days and Parquet files: the arrays ``TableReader`` made,
    as ``agents.dlrm.stages.parse`` gives them; a bad row stops the pipeline naming the file
    and row (``bad_lines="error"``) or is dropped and counted (``"skip"``)."""

    bad_lines: raw.BadLines

    def __call__(self, item: dict[str, Any]) -> dict[str, np.ndarray]:
        """The parsed batch of one chunk read by ``TableReader``."""
        keys = ("labels", "dense", "sparse", "sparse_present")
        chunk = convert(item)
        bad = chunk["bad"]
        if not bad.any():
            return {k: chunk[k] for k in keys}
        if self.bad_lines.policy == "error":
            raise ValueError(f"{chunk['problem']} (pass bad_lines='skip' to skip such rows)")
        count = int(bad.sum())
        first = item["first_row"]
        if count == bad.size:
            raise ValueError(
                f"{item['file']}, rows {first}-{first + count - 1}: not one row fits "
                f"({chunk['problem']} on the first): is this Criteo data?"
            )
        self.bad_lines.add(count)
        log.warning("%s: skipped %d bad row(s); first, %s", item["file"], count, chunk["problem"])
        keep = ~bad
        return {k: chunk[k][keep] for k in keys}


def read_and_parse_stages(
    location: str | Path,
    batch_size: int,
    bad_lines: str = "error",
    data_format: str = "auto",
    storage_options: dict[str, Any] | None = None,
) -> tuple[list, Any, Any]:
    """``(chunks, read, parse)`` of the data at ``location``, whatever its layout: the chunks
    in order and the read and parse stages' callables, to run in this process without a
    pipeline (``parse(read(chunk))`` is a chunk's arrays). For tests and benchmarks that read
    a layout as the pipeline's stages do."""
    layout = detect_layout(location, data_format, storage_options)
    bad = raw.BadLines(bad_lines)
    if layout == "raw":
        chunks = raw.load_or_build_index(location, batch_size, storage_options).chunks
        return chunks, raw.RawReader(storage_options=storage_options), raw.RawParse(bad)
    chunks = plan_chunks(location, layout, batch_size, storage_options=storage_options)
    return chunks, TableReader(storage_options=storage_options), TableParse(bad)
