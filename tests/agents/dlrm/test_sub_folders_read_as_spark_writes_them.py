"""A folder of sub-folders, as Spark writes its output (``day_0/part-00000...``,
``date=.../``, beside ``_SUCCESS``, ``.crc`` files and an unfinished ``_temporary/``), reads as
the same files in one folder, in every layout, locally and by URL (``raw.list_tree``)."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.__main__ import load_pipeline
from agents.dlrm import raw
from agents.dlrm.workload import build_pipeline
from benchmarks.data_layouts import criteo_rows, tsv_text, write_npy, write_parquet

from .conftest import rows_read

pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra)")
DAYS = ["day_0", "day_1", "day_2", "day_10"]  # day_10 after day_2: natural order


pytestmark = pytest.mark.usefixtures("own_cache")


def _write(folder, layout: str, name: str, rows) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "raw":
        (folder / f"{name}.gz").write_bytes(gzip.compress(tsv_text(rows)))
    elif layout == "npy":
        write_npy(folder, name, rows)
    else:
        write_parquet(folder / f"{name}.parquet", rows, row_group=7)


@pytest.mark.parametrize("layout", ["raw", "npy", "parquet"])
@pytest.mark.parametrize("url", [False, True], ids=["folder", "file-url"])
def test_day_folders_beside_sparks_side_files_read_as_one_folder_of_the_days(tmp_path, layout, url):
    # Before, a folder of sub-folders was refused: "holds no Criteo files; it holds no file".
    rows = criteo_rows(4 * 23, 5)
    flat, spark = tmp_path / "flat", tmp_path / "spark"
    for i, day in enumerate(DAYS):
        part = rows.part(23 * i, 23 * (i + 1))
        _write(flat, layout, day, part)
        _write(spark / day, layout, "part-00000" if layout != "npy" else "day", part)
        (spark / day / ".part-00000.crc").write_bytes(b"\0\1")
    (spark / "_SUCCESS").write_bytes(b"")
    _write(spark / "_temporary" / "0", layout, "part-00007", rows.part(0, 5))  # unfinished
    location = f"file://{spark}" if url else spark
    mine, theirs = rows_read(location, batch_size=10), rows_read(flat, batch_size=10)
    for key in theirs:
        np.testing.assert_array_equal(mine[key], theirs[key])


def test_a_bad_line_in_a_sub_folder_is_named_by_its_path_under_the_folder(tmp_path):
    text = tsv_text(criteo_rows(5, 1)).replace(b"\t", b" ", 1)
    (tmp_path / "date=2026-11-28").mkdir()
    (tmp_path / "date=2026-11-28" / "part-00000.tsv").write_bytes(text)
    with pytest.raises(ValueError, match=r"^date=2026-11-28/part-00000.tsv, line 1: it has 39"):
        rows_read(tmp_path, batch_size=4)


@pytest.mark.parametrize("url", [False, True], ids=["path", "file-url"])
def test_a_file_given_for_the_folder_is_refused_naming_the_folder_to_give(tmp_path, url):
    # Before, a file's URL was read as a folder holding itself: "Not a directory:
    # '.../day_0.tsv/day_0.tsv'".
    (tmp_path / "day_0.tsv").write_bytes(tsv_text(criteo_rows(3, 1)))
    given = f"file://{tmp_path}/day_0.tsv" if url else str(tmp_path / "day_0.tsv")
    with pytest.raises(
        NotADirectoryError, match=rf"day_0.tsv is .*give .*\({'file://' if url else ''}{tmp_path}\)"
    ):
        build_pipeline(given, batch_size=4)


def test_the_cli_refuses_a_file_for_the_data_folder_naming_the_folder(tmp_path):
    (tmp_path / "day_0.tsv").write_bytes(tsv_text(criteo_rows(3, 1)))
    with pytest.raises(SystemExit, match=rf"a file; give the folder that holds it \({tmp_path}\)"):
        load_pipeline("dlrm", data_dir=str(tmp_path / "day_0.tsv"))


def test_a_sub_folder_that_cannot_be_listed_is_said_not_left_out(tmp_path, monkeypatch):
    # Before, os.walk left out a sub-folder it could not list (another user's, mode 700),
    # and the days in it with it, without a word.
    for day in ("day_0", "day_1"):
        (tmp_path / day).mkdir()
        (tmp_path / day / "part-00000.tsv").write_bytes(tsv_text(criteo_rows(3, 1)))
    scandir = os.scandir

    def refused(path="."):
        if str(path).endswith(("day_1", "lost+found")):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refused)
    with pytest.raises(PermissionError, match=r"could not list .*day_1 \(Permission denied\)"):
        build_pipeline(tmp_path, batch_size=4)
    # A disk's lost+found, which only root may list, is not data: the days read.
    (tmp_path / "day_1").rename(tmp_path / "lost+found")
    assert [f["name"] for f in raw.list_tree(tmp_path)] == ["day_0/part-00000.tsv"]


def test_a_link_back_up_the_folder_is_walked_once(tmp_path):
    (tmp_path / "day_0").mkdir()
    (tmp_path / "day_0" / "part-00000.tsv").write_bytes(tsv_text(criteo_rows(3, 1)))
    (tmp_path / "day_0" / "up").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "day_1").mkdir()
    (tmp_path / "day_1" / "linked.tsv").symlink_to(tmp_path / "day_0" / "part-00000.tsv")
    names = [f["name"] for f in raw.list_tree(tmp_path)]
    assert names == ["day_0/part-00000.tsv", "day_1/linked.tsv"]


_PART = st.text(alphabet="ab_.-= é0129", min_size=1, max_size=6).filter(
    lambda p: p not in (".", "..") and "/" not in p
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(paths=st.lists(st.lists(_PART, min_size=1, max_size=3), min_size=1, max_size=8))
def test_a_folder_and_its_file_and_memory_urls_list_the_same_tree(tmp_path_factory, paths):
    folder = tmp_path_factory.mktemp("tree")
    store = raw.filesystem("memory://")
    prefix = f"/tree-{folder.name}"
    written = set()
    for parts in paths:
        name = "/".join(parts)
        if any(name.startswith(w + "/") or w.startswith(name + "/") for w in written | {name}):
            continue  # a name both a file and a folder
        written.add(name)
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(name.encode())
        store.pipe_file(f"{prefix}/{name}", name.encode())
    wanted = sorted(
        (n for n in written if not any(p.startswith(("_", ".")) for p in n.split("/"))),
        key=raw.natural_key,
    )
    if any("/" not in n for n in wanted):  # the folder holds files of its own: those only
        wanted = [n for n in wanted if "/" not in n]
    for location in (folder, f"file://{folder}", f"memory://{prefix}"):
        listed = raw.list_tree(location)
        assert [f["name"] for f in listed] == wanted, location
        assert [f["size"] for f in listed] == [len(n.encode()) for n in wanted]


def test_a_folder_with_days_of_its_own_reads_those_and_says_it_left_its_sub_folders(
    tmp_path, caplog
):
    # As a folder was always read: a sample/ beside the days is not read twice over them.
    rows = criteo_rows(30, 6)
    (tmp_path / "day_0.tsv").write_bytes(tsv_text(rows.part(0, 20)))
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "day_0.tsv").write_bytes(tsv_text(rows.part(0, 5)))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "day_0.gz").write_bytes(gzip.compress(tsv_text(rows.part(20, 30))))
    with caplog.at_level("WARNING", logger="agents.dlrm.raw"):
        assert rows_read(tmp_path, batch_size=8)["labels"].size == 20
    assert "2 more in its sub-folders (raw/, sample/) are left out" in caplog.text


@pytest.mark.parametrize("layout", ["raw", "npy", "parquet"])
def test_a_file_this_process_may_not_read_is_said_with_what_to_do(tmp_path, monkeypatch, layout):
    # Before: "[Errno 13] Permission denied: '.../b.tsv'"; for Parquet, "b.parquet: not a
    # Parquet file we can read (... Permission denied)". (This host's tests run as root, who
    # reads every file: the refusal is the kernel's, stood in for.)
    rows = criteo_rows(6, 1)
    _write(tmp_path, layout, "day_0", rows)
    locked = {"raw": "day_0.gz", "npy": "day_0_sparse.npy", "parquet": "day_0.parquet"}[layout]
    real_open = os.open  # data files are opened with os.open (agents.dlrm.opening)

    def refused(path, *args, **kwargs):
        if str(path).endswith(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    original = pq.ParquetFile

    def parquet_refused(source, *args, **kwargs):
        if str(source).endswith(locked):
            raise PermissionError(
                f"Failed to open local file '{source}'. [errno 13] Permission denied"
            )
        return original(source, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", parquet_refused)
    with pytest.raises(
        PermissionError, match=rf"{locked}: this process .* may not read it .*chmod"
    ):
        build_pipeline(tmp_path, batch_size=4)
