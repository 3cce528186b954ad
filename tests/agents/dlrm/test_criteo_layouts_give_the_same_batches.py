"""The same Criteo rows as raw TSV, TorchRec's npy days and Parquet make the same batches
(``agents.dlrm.formats``), read by row ranges and row groups, locally and through fsspec; the
layout is found from the names or forced; what does not fit is said, naming file and row."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.__main__ import load_pipeline
from agents.dlrm import formats, raw
from agents.dlrm.stages import Transform, collate
from agents.dlrm.workload import build_pipeline
from agents.pipeline import StageFailed
from benchmarks.data_layouts import (
    criteo_rows,
    parquet_table,
    write_npy,
    write_parquet,
    write_tsv,
)

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra)")
PARSED = {"labels": np.float32, "dense": np.float32, "sparse": np.uint32, "sparse_present": bool}


pytestmark = pytest.mark.usefixtures("own_cache")


def _batches(location, batch_size, **options):
    """Every chunk of ``location`` through read, parse, transform and collate, in this
    process: (parsed, collated) pairs, in order."""
    chunks, reader, parser = formats.read_and_parse_stages(location, batch_size, **options)
    out = []
    for chunk in chunks:
        parsed = parser(reader(chunk))
        out.append((parsed, collate(Transform()(parsed))))
    return out


def _assert_same_batches(mine, theirs):
    assert len(mine) == len(theirs)
    for (parsed, batch), (their_parsed, their_batch) in zip(mine, theirs, strict=True):
        assert {k: (v.dtype, v.shape) for k, v in parsed.items()} == {
            k: (v.dtype, v.shape) for k, v in their_parsed.items()
        }
        assert torch.equal(batch["labels"], their_batch["labels"])
        assert torch.equal(batch["dense"], their_batch["dense"])
        for a, b in zip(batch["sparse_values"], their_batch["sparse_values"], strict=True):
            assert torch.equal(a, b)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    days=st.lists(st.integers(0, 70), min_size=1, max_size=4).filter(lambda d: sum(d) > 0),
    batch_size=st.integers(1, 40),
    row_groups=st.lists(st.integers(1, 50), min_size=4, max_size=4),
    sparse_dtype=st.sampled_from(["int32", "int64"]),
    npy_logged=st.booleans(),
    flat_labels=st.booleans(),
    dense_type=st.sampled_from(["int64", "float64"]),
    sparse_type=st.sampled_from(["hex", "int"]),
    seed=st.integers(0, 2**16),
)
def test_raw_npy_and_parquet_of_the_same_rows_give_the_same_batches(
    tmp_path_factory,
    days,
    batch_size,
    row_groups,
    sparse_dtype,
    npy_logged,
    flat_labels,
    dense_type,
    sparse_type,
    seed,
):
    rows = criteo_rows(sum(days), seed, missing=0.1)
    root = tmp_path_factory.mktemp("layouts")
    folders = {name: root / name for name in ("tsv", "npy", "parquet")}
    for folder in folders.values():
        folder.mkdir()
    start = 0
    for day, (count, group) in enumerate(zip(days, row_groups, strict=False)):
        part = rows.part(start, start + count)
        start += count
        write_tsv(folders["tsv"], f"day_{day}.tsv", part)
        write_npy(folders["npy"], f"day_{day}", part, sparse_dtype, npy_logged, flat_labels)
        write_parquet(folders["parquet"] / f"day_{day}.parquet", part, group,
                      dense_type=dense_type, sparse_type=sparse_type)  # fmt: skip
    from_text = _batches(folders["tsv"], batch_size)
    from_npy = _batches(folders["npy"], batch_size)
    from_parquet = _batches(folders["parquet"], batch_size)
    assert sum(p["labels"].size for p, _ in from_text) == len(rows)
    _assert_same_batches(from_npy, from_text)
    _assert_same_batches(from_parquet, from_text)
    # Parquet keeps what is missing as the text does: its parsed arrays are the text's.
    for (mine, _), (theirs, _) in zip(from_parquet, from_text, strict=True):
        for key, dtype in PARSED.items():
            assert mine[key].dtype == dtype
            assert np.array_equal(mine[key], theirs[key], equal_nan=True), key


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """1,900 rows in three days of each layout; Parquet in row groups of 130 rows."""
    rows = criteo_rows(1900, 5)
    root = tmp_path_factory.mktemp("days")
    folders = {name: root / name for name in ("tsv", "npy", "parquet")}
    for folder in folders.values():
        folder.mkdir()
    for day, (start, stop) in enumerate([(0, 700), (700, 1300), (1300, 1900)]):
        part = rows.part(start, stop)
        write_tsv(folders["tsv"], f"day_{day}.tsv", part)
        write_npy(folders["npy"], f"day_{day}", part)
        write_parquet(folders["parquet"] / f"day_{day}.parquet", part, 130)
    return folders


@pytest.mark.parametrize("layout", ["npy", "parquet"])
def test_the_pipeline_loses_and_repeats_no_row_while_its_readers_are_resized(days, layout):
    expected = [batch for _, batch in _batches(days["tsv"], 100)]
    got = []
    with build_pipeline(days[layout], batch_size=100, epochs=2) as pipeline:
        for batch in pipeline:
            got.append(batch)
            if len(got) == 3:
                pipeline.apply({"read": 3, "parse": 2})
            elif len(got) == 12:
                pipeline.apply({"read": 1})
            elif len(got) == 25:
                pipeline.apply({"read": 2})
    assert len(got) == 2 * len(expected)
    for mine, theirs in zip(got, expected + expected, strict=True):
        assert torch.equal(mine["labels"], theirs["labels"])
        assert torch.equal(mine["dense"], theirs["dense"])
        assert all(
            torch.equal(a, b)
            for a, b in zip(mine["sparse_values"], theirs["sparse_values"], strict=True)
        )


def test_a_chunk_reads_its_row_range_and_row_groups_not_the_file(days, monkeypatch):
    chunks = formats.plan_chunks(days["parquet"], "parquet", 100)
    # Day 0: 700 rows in row groups of 130: rows 200-299 lie in groups 1 and 2 (130-389).
    assert (chunks[2].start, chunks[2].rows, chunks[2].groups) == (200, 100, (1, 2))
    assert [c.rows for c in chunks[:7]] == [100] * 7 and chunks[7].name == "day_1.parquet"
    read = []
    original = formats._parquet_file

    def spy(path, *args):
        parquet = original(path, *args)
        real = parquet.read_row_group
        parquet.read_row_group = lambda g, **kw: read.append(g) or real(g, **kw)
        return parquet

    monkeypatch.setattr(formats, "_parquet_file", spy)
    reader = formats.TableReader()
    for chunk in chunks[:7]:
        reader(chunk)
    assert read == [0, 1, 2, 3, 4, 5]  # each row group decoded once by this worker

    npy = formats.plan_chunks(days["npy"], "npy", 100)
    ranges = []
    real_range = formats.TableReader._range

    def spy_range(self, path, start, end):
        ranges.append((path.rsplit("/", 1)[-1], start, end))
        return real_range(self, path, start, end)

    monkeypatch.setattr(formats.TableReader, "_range", spy_range)
    reader(npy[3])  # rows 300-399 of day 0
    offsets = {name: offset for name, (offset, _, _) in zip(
        [p.rsplit("/", 1)[-1] for p in npy[3].paths], npy[3].arrays, strict=True)}  # fmt: skip
    assert ranges == [
        (
            "day_0_dense.npy",
            offsets["day_0_dense.npy"] + 300 * 52,
            offsets["day_0_dense.npy"] + 400 * 52,
        ),
        (
            "day_0_sparse.npy",
            offsets["day_0_sparse.npy"] + 300 * 104,
            offsets["day_0_sparse.npy"] + 400 * 104,
        ),
        (
            "day_0_labels.npy",
            offsets["day_0_labels.npy"] + 300 * 4,
            offsets["day_0_labels.npy"] + 400 * 4,
        ),
    ]


def test_a_memory_url_and_a_file_url_read_as_the_folder(days):
    import fsspec

    memory = fsspec.filesystem("memory")
    for layout in ("npy", "parquet"):
        for path in days[layout].iterdir():
            memory.pipe_file(f"memory://days-{layout}/{path.name}", path.read_bytes())
        local = _batches(days[layout], 256)
        _assert_same_batches(_batches(f"memory://days-{layout}", 256), local)
        _assert_same_batches(_batches(days[layout].as_uri(), 256), local)


# ----------------------------------------------------------------------------- what is refused


def test_a_folder_of_two_layouts_is_refused_naming_them_unless_one_is_asked_for(days, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(days["parquet"], mixed)
    shutil.copy(days["tsv"] / "day_0.tsv", mixed / "day_0.tsv")
    (mixed / "_SUCCESS").write_bytes(b"")  # Spark's marker: not data, not a layout
    with pytest.raises(ValueError, match=r"more than one layout.*Parquet: day_0\.parquet, "
                       r"day_1\.parquet, day_2\.parquet; raw Criteo text: day_0\.tsv.*--data-format"):  # fmt: skip
        build_pipeline(mixed, batch_size=100)
    batches = _batches(mixed, 100, data_format="parquet")
    _assert_same_batches(batches, _batches(days["parquet"], 100))
    # The agent's CLI says the same, and takes --data-format.
    with pytest.raises(SystemExit, match="more than one layout"):
        load_pipeline("dlrm", data_dir=str(mixed))
    pipeline = load_pipeline("dlrm", data_dir=str(mixed), data_format="raw")
    with pipeline:
        assert next(iter(pipeline))["labels"].shape[0] == 700  # day_0.tsv, alone
    with pytest.raises(SystemExit, match="--data-format applies to the files of --data-dir"):
        load_pipeline("dlrm", data_format="npy")


def test_a_folder_of_nothing_readable_is_refused_naming_what_it_holds(tmp_path, days):
    (tmp_path / "README.md").write_text("criteo")
    (tmp_path / "schema.pbtxt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"holds no Criteo files .*it holds README\.md, "
                       r"schema\.pbtxt"):  # fmt: skip
        build_pipeline(tmp_path, batch_size=100)
    with pytest.raises(FileNotFoundError, match="of the TorchRec npy layout asked for"):
        build_pipeline(days["parquet"], batch_size=100, data_format="npy")
    with pytest.raises(ValueError, match="data_format='csv'"):
        build_pipeline(days["parquet"], batch_size=100, data_format="csv")


def _one_parquet(folder, rows, **columns):
    """``folder/part-0.parquet``: the rows, with some columns replaced."""
    import pyarrow as pa

    table = parquet_table(rows)
    for name, values in columns.items():
        if values is None:
            table = table.drop_columns([name])
        else:
            table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    folder.mkdir(exist_ok=True)
    pq.write_table(table, folder / "part-0.parquet", row_group_size=60)
    return folder


def test_a_file_that_does_not_fit_is_refused_when_the_pipeline_is_built(tmp_path):
    rows = criteo_rows(200, 9)
    no_label = _one_parquet(tmp_path / "a", rows, label=None)
    with pytest.raises(ValueError, match=r"part-0\.parquet: no column label; it has I1, I2"):
        build_pipeline(no_label, batch_size=50)
    text_dense = _one_parquet(tmp_path / "b", rows, I4=["x"] * 200)
    with pytest.raises(ValueError, match="part-0.parquet: column I4 is string, not a number"):
        build_pipeline(text_dense, batch_size=50)
    (text_dense / "part-0.parquet").write_bytes(b"label,I1\n1,2\n")  # a CSV by another name
    with pytest.raises(ValueError, match="part-0.parquet: not a Parquet file we can read"):
        build_pipeline(text_dense, batch_size=50)

    npy = tmp_path / "npy"
    npy.mkdir()
    write_npy(npy, "day_0", rows)
    write_npy(npy, "day_1", rows)
    (npy / "day_1_dense.npy").write_bytes(b"not an array")
    with pytest.raises(ValueError, match="day_1_dense.npy: not an npy array we can read"):
        build_pipeline(npy, batch_size=50)
    np.save(npy / "day_1_dense.npy", np.zeros((200, 12), np.float32))
    with pytest.raises(ValueError, match=r"day_1_dense\.npy: shape \(200, 12\); a TorchRec "):
        build_pipeline(npy, batch_size=50)
    np.save(npy / "day_1_dense.npy", np.zeros((199, 13), np.float32))
    with pytest.raises(ValueError, match=r"day_1: its files disagree on the number of rows "
                       r"\(day_1_dense\.npy 199, day_1_sparse\.npy 200"):  # fmt: skip
        build_pipeline(npy, batch_size=50)
    (npy / "day_1_labels.npy").unlink()
    np.save(npy / "day_1_dense.npy", np.zeros((200, 13), np.float32))
    with pytest.raises(
        ValueError, match="day_1 lacks day_1_labels.npy: a TorchRec npy day is three files"
    ):
        build_pipeline(npy, batch_size=50)


@pytest.mark.parametrize(
    "column, value, says",
    [
        ("label", float("nan"), "label is NaN"),
        ("label", 2, "label is 2, not 0 or 1"),
        ("label", None, "label is missing"),
        ("C3", "zzzzzzzz", "categorical feature C3 is 'zzzzzzzz', not hex of at most 8 digits"),
        ("C5", "a1b2c3d4e", "categorical feature C5 is 'a1b2c3d4e', not hex of at most 8 digits"),
    ],
    # A hash wider than 32 bits (Spark's xxhash64) is no longer a bad row: its low 32 bits
    # are read (test_spark_and_hive_output_reads_as_they_leave_it.py).
    ids=["nan-label", "label-2", "null-label", "not-hex", "nine-hex-digits"],
)
def test_a_bad_row_is_named_by_file_and_row_or_skipped_and_counted(tmp_path, column, value, says):
    rows = criteo_rows(200, 11)
    hashed = isinstance(value, int) and column.startswith("C")
    original = (
        parquet_table(rows, sparse_type="int" if hashed else "hex").column(column).to_pylist()
    )
    original[137] = value
    folder = _one_parquet(tmp_path / "p", rows, **{column: original})
    chunks = formats.plan_chunks(folder, "parquet", 50)
    reader = formats.TableReader()
    with pytest.raises(ValueError) as failure:
        [formats.TableParse(raw.BadLines())(reader(c)) for c in chunks]
    assert f"part-0.parquet, row 137: {says}" in str(failure.value)
    skipped = raw.BadLines("skip")
    sizes = [formats.TableParse(skipped)(reader(c))["labels"].size for c in chunks]
    assert sizes == [50, 50, 49, 50]
    assert skipped.count == 1


def test_through_the_pipeline_a_bad_row_stops_it_or_is_skipped_and_counted(tmp_path):
    rows = criteo_rows(200, 12)
    labels = [float(v) for v in rows.labels]
    labels[61] = float("nan")
    folder = _one_parquet(tmp_path / "p", rows, label=labels)
    with build_pipeline(folder, batch_size=50, epochs=1) as pipeline:
        with pytest.raises(StageFailed, match=r"part-0\.parquet, row 61: label is NaN \(pass "):
            list(pipeline)
    with build_pipeline(folder, batch_size=50, epochs=1, bad_lines="skip") as pipeline:
        sizes = [int(b["labels"].shape[0]) for b in pipeline]
    assert sizes == [50, 49, 50, 50]
    assert pipeline.bad_lines.count == 1


def test_a_bad_npy_label_names_the_day_and_row(tmp_path):
    rows = criteo_rows(120, 4)
    write_npy(tmp_path, "day_3", rows)
    labels = np.load(tmp_path / "day_3_labels.npy")
    labels[77] = -1  # the fake label TorchRec gives Kaggle's unlabelled test days
    np.save(tmp_path / "day_3_labels.npy", labels)
    with build_pipeline(tmp_path, batch_size=50, epochs=1) as pipeline:
        with pytest.raises(StageFailed, match="day_3, row 77: label is -1, not 0 or 1"):
            list(pipeline)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch, days):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'intune\[parquet\]'"):
        build_pipeline(days["parquet"], batch_size=100)
    with pytest.raises(SystemExit, match=r"--data-dir .*needs pyarrow.*intune\[parquet\]"):
        load_pipeline("dlrm", data_dir=str(days["parquet"]))
    # npy and raw text need no pyarrow.
    assert len(_batches(days["npy"], 500)) == 6  # 700, 600 and 600 rows


def test_hex_of_fewer_digits_reads_as_its_value_and_nine_digits_is_a_bad_row(tmp_path):
    rows = criteo_rows(6, 2)
    values = ["1a", "0000001A", "", None, "fFfFfFfF", "123456789"]
    folder = _one_parquet(tmp_path / "p", rows, C1=values)
    (chunk,) = formats.plan_chunks(folder, "parquet", 10)
    item = formats.convert(formats.TableReader()(chunk))
    assert item["sparse"][:5, 0].tolist() == [0x1A, 0x1A, 0, 0, 0xFFFFFFFF]
    assert item["sparse_present"][:, 0].tolist() == [True, True, False, False, True, False]
    assert item["bad"].tolist() == [False] * 5 + [True]
    assert item["problem"] == (
        "part-0.parquet, row 5: categorical feature C1 is '123456789', not hex of at most 8 digits"
    )


def test_the_fused_pipeline_and_the_cli_flag_take_the_layouts(days):
    from agents.__main__ import build_parser

    args = build_parser().parse_args(["--data-dir", "/data", "--data-format", "parquet"])
    assert args.data_format == "parquet"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data-format", "csv"])
    fused = "read+parse+transform+collate"
    with build_pipeline(days["npy"], batch_size=400, epochs=1, fuse=fused) as pipeline:
        assert pipeline.stage_names == [fused, "prefetch"]
        assert sum(int(b["labels"].shape[0]) for b in pipeline) == 1900
