"""Criteo data as Spark's and Hive's jobs leave it: text files with no suffix (``part-00000``,
``part-00000-<uuid>-c000``, Hive's ``000000_0``), Parquet with none, tab-separated ``.csv``,
the codecs they write (``.gz``, ``.bz2``, ``.deflate``, ``.zst``; ``.snappy`` and ``.lz4``
refused, named),
and 64-bit hashes (Spark's ``xxhash64``) in Parquet, read as the same rows from a ``.tsv``, from
a folder, its ``file://`` URL and ``memory://`` alike (``raw.sniff``, ``formats.layout_of``)."""

from __future__ import annotations

import bz2
import gzip
import uuid
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.dlrm import formats, raw
from agents.dlrm.workload import build_pipeline
from benchmarks.data_layouts import criteo_rows, parquet_table, tsv_text

from .conftest import rows_read

pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra)")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra)")
HEADER = "\t".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))])


pytestmark = pytest.mark.usefixtures("own_cache")


def _same(mine: dict, theirs: dict) -> None:
    assert mine.keys() == theirs.keys()
    for key in theirs:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


def _places(tmp_path, files: dict[str, bytes]) -> list:
    """The files written in a folder, and the folder, its file:// URL and a memory:// prefix."""
    folder = tmp_path / "out"
    store = raw.filesystem("memory://")
    prefix = f"/spark-{uuid.uuid4().hex}"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        store.pipe_file(f"{prefix}/{name}", data)
    return [folder, f"file://{folder}", f"memory://{prefix}"]


def _tsv(tmp_path, rows) -> dict[str, np.ndarray]:
    """The rows read from one ``.tsv``: what every other form must give."""
    folder = tmp_path / "tsv"
    folder.mkdir()
    (folder / "day_0.tsv").write_bytes(tsv_text(rows))
    return rows_read(folder, batch_size=4)


# How Spark (RDD saveAsTextFile, DataFrame text/csv with sep='\t') and Hive name and encode a
# part: (name, encode).
_ID = "5f3c2b1a-0d9e-4c7b-8a6f-1e2d3c4b5a69"
_FORMS = {
    "rdd": (lambda i: f"part-{i:05d}", lambda text: text),
    "dataframe": (lambda i: f"part-{i:05d}-{_ID}-c000", lambda text: text),
    "hive": (lambda i: f"{i:06d}_0", lambda text: text),
    "hive-header": (lambda i: f"{i:06d}_0", lambda text: HEADER.encode() + b"\n" + text),
    "gzip-unnamed": (lambda i: f"{i:06d}_0", gzip.compress),
    "csv": (lambda i: f"part-{i:05d}-{_ID}-c000.csv", lambda text: text),
    "csv.gz": (lambda i: f"part-{i:05d}-{_ID}-c000.csv.gz", gzip.compress),
    "txt.bz2": (lambda i: f"part-{i:05d}-{_ID}-c000.txt.bz2", bz2.compress),
    "bz2-streams": (
        lambda i: f"part-{i:05d}.bz2",
        lambda t: bz2.compress(t[:99]) + bz2.compress(t[99:]),
    ),
    "deflate": (lambda i: f"{i:06d}_0.deflate", zlib.compress),
    "raw-deflate": (lambda i: f"part-{i:05d}.deflate", lambda t: _raw_deflate(t)),
    "txt.zst": (
        lambda i: f"part-{i:05d}-{_ID}-c000.txt.zst",
        lambda t: _zstd(t[:99]) + _zstd(t[99:]),
    ),
}


def _zstd(text: bytes) -> bytes:
    return pa.Codec("zstd").compress(text, asbytes=True)


def _raw_deflate(text: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(text) + packer.flush()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    forms=st.lists(st.sampled_from(sorted(_FORMS)), min_size=1, max_size=4),
    sizes=st.lists(st.integers(1, 9), min_size=4, max_size=4),
    sub_folders=st.booleans(),
)
# Every form at least once, whatever hypothesis draws.
@example(forms=["txt.zst", "bz2-streams", "raw-deflate", "gzip-unnamed"], sizes=[9, 5, 1, 3],
         sub_folders=False)  # fmt: skip
@example(forms=["hive-header", "csv.gz", "deflate", "dataframe"], sizes=[2, 9, 4, 6],
         sub_folders=True)  # fmt: skip
@example(forms=["rdd", "hive", "csv", "txt.bz2"], sizes=[1, 2, 3, 4], sub_folders=False)
def test_sparks_and_hives_text_parts_read_as_the_same_rows_from_a_tsv(
    tmp_path_factory, forms, sizes, sub_folders
):
    # Before: part-00000, 000000_0, .csv, .bz2 and .deflate were not seen ("holds no Criteo
    # files; it holds part-00000"), and a folder of them read as none.
    tmp_path = tmp_path_factory.mktemp("parts")
    rows = criteo_rows(sum(sizes), 3)
    files, texts, start = {"_SUCCESS": b"", ".part-00000.crc": b"\0\1"}, {}, 0
    for i, form in enumerate(forms):
        name, encode = _FORMS[form]
        text = tsv_text(rows.part(start, start + sizes[i]))
        path = (f"date=2026-11-{i + 10}/" if sub_folders else "") + name(i)
        files[path], texts[path] = encode(text), text
        start += sizes[i]
    # The same rows in one .tsv, in the order the parts are read: natural order of their paths.
    expected = tmp_path / "tsv"
    expected.mkdir()
    in_order = sorted(texts, key=raw.natural_key)
    (expected / "day_0.tsv").write_bytes(b"".join(texts[p] for p in in_order))
    for location in _places(tmp_path, files):
        _same(rows_read(location, batch_size=4), rows_read(expected, batch_size=4))


@pytest.mark.parametrize("name", ["000000_0", f"part-00000-{_ID}-c000"])
def test_parquet_with_no_suffix_reads_by_its_magic_bytes(tmp_path, name):
    # Before: Hive's 000000_0 was not seen ("holds no Criteo files; it holds 000000_0").
    rows = criteo_rows(23, 5)
    table = parquet_table(rows)
    for i in range(1, 27):  # as Hive writes strings: binary
        at = table.schema.get_field_index(f"C{i}")
        table = table.set_column(at, f"C{i}", table.column(at).cast(pa.binary()))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=7)
    files = {name: sink.getvalue().to_pybytes(), "_SUCCESS": b""}
    expected = _tsv(tmp_path, rows)
    for location in _places(tmp_path, files):
        assert formats.detect_layout(location) == "parquet"
        _same(rows_read(location, batch_size=4), expected)


def test_a_folder_of_named_files_is_not_read_to_find_its_layout(tmp_path, monkeypatch):
    looked: list[bytes] = []
    content_of = raw.content_of
    monkeypatch.setattr(raw, "content_of", lambda head, whole=False: looked.append(head) or
                        content_of(head, whole))  # fmt: skip
    rows = criteo_rows(6, 1)
    (tmp_path / "day_0.tsv").write_bytes(tsv_text(rows))
    (tmp_path / "README.md").write_text("the days")
    build_pipeline(tmp_path, batch_size=4)
    assert looked == []
    # A file with no suffix is read once, however often the folder is listed (the layout,
    # then the index); only its first bytes.
    (tmp_path / "day_0.tsv").rename(tmp_path / "part-00000")
    build_pipeline(tmp_path, batch_size=4)
    assert looked == [tsv_text(rows)]
    big = tsv_text(criteo_rows(200, 2))
    (tmp_path / "part-00001").write_bytes(big)
    assert formats.detect_layout(tmp_path) == "raw"
    assert looked[1:] == [big[: raw.SNIFF_BYTES]]


def test_unnamed_files_of_two_layouts_or_of_neither_keep_the_clear_refusals(tmp_path):
    rows = criteo_rows(6, 1)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "000000_0").write_bytes(tsv_text(rows))
    pq.write_table(parquet_table(rows), mixed / "000001_0")
    with pytest.raises(
        ValueError, match=r"more than one layout \(Parquet: 000001_0; raw .*000000_0"
    ):
        formats.detect_layout(mixed)
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "000000_0").write_bytes(b"ORC\x00\x01" + bytes(100))  # Hive's ORC
    (neither / "part-00000").write_bytes(tsv_text(rows).replace(b"\t", b","))
    (neither / "part-00001").write_bytes(b"")  # Spark's part of an empty partition
    with pytest.raises(
        FileNotFoundError,
        match=r"holds no Criteo files .*it holds 000000_0, part-00000, part-00001$",
    ):
        formats.detect_layout(neither)


def test_a_comma_separated_csv_is_refused_at_its_first_line(tmp_path):
    text = tsv_text(criteo_rows(3, 1)).replace(b"\t", b",")
    (tmp_path / f"part-00000-{_ID}-c000.csv").write_bytes(text)
    with pytest.raises(ValueError, match=r"c000.csv, line 1: .*\(it is comma-separated"):
        rows_read(tmp_path, batch_size=4)


@pytest.mark.parametrize("suffix", [".snappy", ".txt.lz4"])
def test_a_codec_not_read_is_refused_when_built_naming_the_file_and_what_to_do(tmp_path, suffix):
    # Before: not seen; a folder of them "holds no Criteo files".
    (tmp_path / f"part-00000{suffix}").write_bytes(b"\xff\x06\x00\x00sNaPpY" + bytes(40))
    (tmp_path / "part-00001.gz").write_bytes(gzip.compress(tsv_text(criteo_rows(3, 1))))
    with pytest.raises(ValueError, match=rf"^part-00000{suffix}: compressed with \w+, which this "
                       r"reader does not decode .*\.option\('compression', 'gzip'\)"):  # fmt: skip
        build_pipeline(tmp_path, batch_size=4)


def test_zstd_without_pyarrow_is_refused_saying_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "part-00000.zst").write_bytes(_zstd(tsv_text(criteo_rows(3, 1))))
    monkeypatch.setattr(raw, "_pyarrow_zstd", lambda: None)
    with pytest.raises(ValueError, match=r"^part-00000.zst: compressed with zstd, .*pip install"):
        build_pipeline(tmp_path, batch_size=4)


def test_a_truncated_bz2_or_zstd_file_is_named(tmp_path):
    text = tsv_text(criteo_rows(40, 1))
    (tmp_path / "part-00000.bz2").write_bytes(bz2.compress(text)[:-30])
    with pytest.raises(ValueError, match=r"part-00000.bz2: the bzip2 stream ends in the middle"):
        build_pipeline(tmp_path, batch_size=4)
    (tmp_path / "part-00000.bz2").unlink()
    (tmp_path / "part-00000.zst").write_bytes(_zstd(text)[:-30])
    with pytest.raises(ValueError, match=r"part-00000.zst: the zstd stream ends in the middle"):
        build_pipeline(tmp_path, batch_size=4)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    high=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=30),
    dtype=st.sampled_from(["int64", "uint64"]),
)
def test_64_bit_hashes_read_as_their_low_32_bits(tmp_path_factory, high, dtype):
    # Before: each a bad row ("C1 is -6917529027641081856, not a 32-bit hash").
    tmp_path = tmp_path_factory.mktemp("xxhash64")
    rows = criteo_rows(30, 9)
    table = parquet_table(rows, sparse_type="int")
    tops = np.resize(np.array(high, dtype=np.int64), 30).astype(np.uint64) << np.uint64(32)
    for i in range(1, 27):
        at = table.schema.get_field_index(f"C{i}")
        wide = (rows.sparse[:, i - 1].astype(np.uint64) | np.roll(tops, i)).astype(dtype)
        column = pa.array(wide, mask=rows.sparse_missing[:, i - 1])
        table = table.set_column(at, f"C{i}", column)
    (tmp_path / "spark").mkdir()
    pq.write_table(table, tmp_path / "spark" / "part-00000.parquet", row_group_size=7)
    _same(rows_read(tmp_path / "spark", batch_size=4), _tsv(tmp_path, rows))
