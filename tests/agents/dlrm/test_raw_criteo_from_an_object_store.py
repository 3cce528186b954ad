"""Criteo files read from an object store by URL (``s3://bucket/prefix``, any fsspec URL),
through the same DLRM pipeline as a local folder (``agents.dlrm.raw``).

The S3 here is moto's ``ThreadedMotoServer``: a real S3-compatible HTTP server on this host,
spoken to by s3fs/botocore over the S3 API, standing in for AWS, which this machine cannot
reach. The files are written by Python's ``gzip`` module and plain text, not by our generator.
"""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest

from agents.__main__ import load_pipeline
from agents.dlrm import raw
from agents.dlrm.workload import build_pipeline
from tests.agents.daemon.test_cli_registers_once_and_reports import run_agent

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra)")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra)")

BATCH = 500
BUCKET = "criteo-logs"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        dense = [str(rng.randint(0, 900)) if rng.random() > 0.1 else "" for _ in range(13)]
        sparse = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.05 else "" for _ in range(26)]
        out.append("\t".join([str(rng.randint(0, 1)), *dense, *sparse]))
    return out


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def _files() -> dict[str, bytes]:
    """What ``gzip`` and a text editor write: one plain file, one one-member gzip, and one
    many-member gzip (eight ``gzip.compress`` outputs concatenated, as ``cat a.gz b.gz``)."""
    parts = [_text(_lines(1000, seed)) for seed in range(10, 18)]
    return {
        "day_0.tsv": _text(_lines(1200, 1)),
        "day_1.gz": gzip.compress(_text(_lines(1700, 2))),
        "day_2.tsv.gz": b"".join(gzip.compress(p) for p in parts),
    }


@pytest.fixture(scope="module")
def s3():
    """A local S3 API (moto) with the files under ``s3://criteo-logs/days``; the endpoint and
    test credentials as ``storage_options`` and as the environment a CLI agent would use."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    fs = raw.filesystem("s3://", options)
    fs.mkdir(BUCKET)
    for name, body in _files().items():
        fs.pipe_file(f"{BUCKET}/days/{name}", body)
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_DEFAULT_REGION": "eu-west-1"}
    yield fs, options, env
    server.stop()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of this test's own, where the index of a URL is kept."""
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def local_folder(tmp_path):
    folder = tmp_path / "days"
    folder.mkdir()
    for name, body in _files().items():
        (folder / name).write_bytes(body)
    return folder


def _rows(data_dir, **options) -> list[tuple]:
    """Every row the DLRM pipeline yields in one epoch: (label, dense, sparse ids), sorted."""
    rows = []
    with build_pipeline(data_dir, batch_size=BATCH, epochs=1, **options) as pipeline:
        for batch in pipeline:
            labels = batch["labels"].numpy()
            dense = batch["dense"].numpy()
            sparse = np.stack([v.numpy() for v in batch["sparse_values"]], axis=1)
            rows += [
                (float(labels[i]), dense[i].tobytes(), sparse[i].tobytes())
                for i in range(labels.size)
            ]
    return sorted(rows)


def test_the_rows_from_s3_are_the_rows_of_the_same_files_in_a_folder(s3, cache, local_folder):
    _, options, _ = s3
    from_s3 = _rows(f"s3://{BUCKET}/days", storage_options=options)
    assert len(from_s3) == 1200 + 1700 + 8000
    assert from_s3 == _rows(local_folder)


def test_a_file_url_reads_the_same_chunks_as_the_folder(cache, local_folder):
    by_url = raw.load_or_build_index(local_folder.as_uri(), BATCH)
    by_path = raw.load_or_build_index(local_folder, BATCH)
    assert [c.path for c in by_url.chunks] == [local_folder.as_uri() + "/" + c.path.rsplit("/")[-1]
                                               for c in by_path.chunks]  # fmt: skip
    read = raw.RawReader()
    for url_chunk, path_chunk in zip(by_url.chunks, by_path.chunks, strict=True):
        assert read(url_chunk)["text"] == read(path_chunk)["text"]


def test_the_index_is_kept_locally_used_again_and_rebuilt_when_an_object_changes(
    s3, cache, monkeypatch
):
    fs, options, _ = s3
    url = f"s3://{BUCKET}/days/"
    first = raw.load_or_build_index(url, BATCH, options)
    assert first.location.is_relative_to(cache) and first.location.exists()
    # 1200/500 + 1700/500 + 8000/500 chunks; the one-member gzip is read in order.
    assert len(first.chunks) == 3 + 4 + 16 and first.sequential
    assert fs.ls(f"{BUCKET}/days") == [f"{BUCKET}/days/{n}" for n in sorted(_files())]

    def no_scan(*args, **kwargs):
        raise AssertionError("scanned again although no object changed")

    with monkeypatch.context() as patch:
        patch.setattr(raw, "scan_file", no_scan)
        again = raw.load_or_build_index(url, BATCH, options)
    assert again.chunks == first.chunks and again.location == first.location

    fs.pipe_file(f"{BUCKET}/days/day_0.tsv", _text(_lines(600, 99)))  # a new ETag and size
    try:
        rebuilt = raw.load_or_build_index(url, BATCH, options)
        day_0 = [c for c in rebuilt.chunks if c.path.endswith("day_0.tsv")]
        assert [c.rows for c in day_0] == [500, 100]
    finally:
        fs.pipe_file(f"{BUCKET}/days/day_0.tsv", _files()["day_0.tsv"])


def test_a_chunk_of_a_many_member_gzip_object_is_a_ranged_read(s3, cache, monkeypatch):
    fs, options, _ = s3
    index = raw.load_or_build_index(f"s3://{BUCKET}/days", BATCH, options)
    chunks = [c for c in index.chunks if c.path.endswith("day_2.tsv.gz")]
    size = fs.size(f"{BUCKET}/days/day_2.tsv.gz")
    assert not any(raw._needs_order(c) for c in chunks)  # any worker may read any of them
    fetched: list[tuple[int, int]] = []
    call = type(fs)._call_s3

    async def spy(self, method, *args, **kwargs):  # the real ranged GET (If-Match), noted
        if method == "get_object" and "Range" in kwargs:
            start, end = kwargs["Range"].removeprefix("bytes=").split("-")
            fetched.append((int(start), int(end) + 1))
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(type(fs), "_call_s3", spy)
    last = raw.RawReader(storage_options=options)(chunks[-1])
    assert raw.RawParse(raw.BadLines())(last)["labels"].size == 500
    assert fetched and fetched[0][0] == chunks[-1].member_offset > size // 2
    assert sum(end - start for start, end in fetched) < size // 3


def test_a_malformed_line_names_the_object_and_the_line(s3, cache):
    fs, options, _ = s3
    lines = _lines(40, 5)
    lines[4] = "1\t2\tthree"
    fs.pipe_file(f"{BUCKET}/bad/day_9.tsv.gz", gzip.compress(_text(lines)))
    index = raw.load_or_build_index(f"s3://{BUCKET}/bad", 16, options)
    chunk = raw.RawReader(storage_options=options)(index.chunks[0])
    with pytest.raises(ValueError) as failure:
        raw.RawParse(raw.BadLines("error"))(chunk)
    assert f"s3://{BUCKET}/bad/day_9.tsv.gz, line 5: it has 3 tab-separated fields" in str(
        failure.value
    )
    skipped = raw.BadLines("skip")
    assert raw.RawParse(skipped)(chunk)["labels"].size == 15 and skipped.count == 1


def test_a_memory_url_is_read_through_fsspec(cache):
    fs = raw.filesystem("memory://")
    fs.pipe_file("/criteo/day_0.tsv", _text(_lines(30, 8)))
    index = raw.load_or_build_index("memory://criteo", 16)
    assert [c.rows for c in index.chunks] == [16, 14]
    parsed = raw.RawParse(raw.BadLines())(raw.RawReader()(index.chunks[1]))
    assert parsed["labels"].size == 14


def test_what_cannot_be_read_is_said_without_a_traceback(s3, cache, tmp_path, monkeypatch):
    _, options, env = s3
    with pytest.raises(FileNotFoundError, match="no Criteo files found at s3://criteo-logs/void"):
        raw.load_or_build_index(f"s3://{BUCKET}/void", BATCH, options)
    with pytest.raises(raw.StoreError, match=r"needs gcsfs, which is not installed: pip install"):
        raw.load_or_build_index("gs://criteo-logs/days", BATCH)
    with pytest.raises(raw.StoreError, match="fsspec knows no protocol 'nosuch'"):
        raw.load_or_build_index("nosuch://x/y", BATCH)

    # The agent's CLI: the same messages, as its exit message; the endpoint and credentials
    # from the environment.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit, match=f"--data-dir s3://{BUCKET}/void: no Criteo files found"):
        load_pipeline("dlrm", data_dir=f"s3://{BUCKET}/void")
    with pytest.raises(SystemExit, match="pip install gcsfs"):
        load_pipeline("dlrm", data_dir="gs://criteo-logs/days")
    # In an agent of its own (no traceback on its stderr), with no credentials anywhere.
    state = ["--state-dir", str(tmp_path / "state")]
    identity = ["--url", "http://127.0.0.1:9", "--host-id", "1", "--token", "ia_x", *state]
    nobody = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL_S3": env["AWS_ENDPOINT_URL_S3"],
    }
    refused = run_agent(*identity, "--data-dir", f"s3://{BUCKET}/days", seconds=30, env=nobody)
    assert refused.returncode != 0
    assert "could not list s3://criteo-logs/days" in refused.stderr
    assert "check the store's credentials" in refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr


def test_npy_days_and_parquet_in_s3_are_read_by_ranges_as_in_a_folder(
    s3, cache, tmp_path, monkeypatch
):
    """TorchRec's npy days and Parquet files (``agents.dlrm.formats``) in the store: the same
    batches as the same files in a folder, and a chunk fetches its rows, not its objects."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow (the parquet extra)")
    from agents.dlrm import formats
    from benchmarks.data_layouts import criteo_rows, write_npy, write_parquet

    fs, options, _ = s3
    rows = criteo_rows(1300, 21)
    for layout in ("npy", "parquet"):
        (tmp_path / layout).mkdir()
    write_npy(tmp_path / "npy", "day_0", rows.part(0, 800))
    write_npy(tmp_path / "npy", "day_1", rows.part(800, 1300))
    write_parquet(tmp_path / "parquet" / "part-0.parquet", rows.part(0, 800), 300)
    write_parquet(tmp_path / "parquet" / "part-1.parquet", rows.part(800, 1300), 300)
    for layout in ("npy", "parquet"):
        for path in (tmp_path / layout).iterdir():
            fs.pipe_file(f"{BUCKET}/{layout}/{path.name}", path.read_bytes())
        from_s3 = _table_rows(f"s3://{BUCKET}/{layout}", layout, options)
        assert len(from_s3) == 1300
        assert from_s3 == _table_rows(tmp_path / layout, layout)

    fetched: list[tuple[str, int, int]] = []
    fetch = type(fs)._cat_file
    group_0 = pq.ParquetFile(tmp_path / "parquet" / "part-0.parquet").metadata.row_group(0)
    group_0_end = max(
        group_0.column(i).file_offset + group_0.column(i).total_compressed_size
        for i in range(group_0.num_columns)
    )

    async def spy(self, path, start=None, end=None, **kwargs):  # the real ranged GET, noted
        fetched.append((path.rsplit("/", 1)[-1], start, end))
        return await fetch(self, path, start=start, end=end, **kwargs)

    chunks = formats.plan_chunks(f"s3://{BUCKET}/npy", "npy", BATCH, storage_options=options)
    monkeypatch.setattr(type(fs), "_cat_file", spy)
    formats.TableReader(storage_options=options)(chunks[1])  # rows 500-799 of day_0
    assert [(name, end - start) for name, start, end in fetched] == [
        ("day_0_dense.npy", 300 * 13 * 4),
        ("day_0_sparse.npy", 300 * 26 * 4),
        ("day_0_labels.npy", 300 * 4),
    ]
    chunks = formats.plan_chunks(
        f"s3://{BUCKET}/parquet", "parquet", BATCH, storage_options=options
    )
    fetched.clear()
    size = fs.size(f"{BUCKET}/parquet/part-0.parquet")
    assert chunks[1].groups == (1, 2)  # rows 500-799 of part-0 lie in groups of 300 rows 1 and 2
    formats.TableReader(storage_options=options)(chunks[1])
    # Its footer, then its row groups 1 and 2; nothing of group 0.
    assert fetched and all(name == "part-0.parquet" for name, _, _ in fetched)
    assert all(start >= group_0_end for _, start, _ in fetched)
    assert sum(end - start for _, start, end in fetched) < size


def _table_rows(location, layout, options=None) -> list[tuple]:
    """Every row of an npy or Parquet dataset read and parsed in this process (sorted)."""
    from agents.dlrm import formats
    from agents.dlrm.stages import Transform

    chunks = formats.plan_chunks(location, layout, BATCH, storage_options=options)
    reader = formats.TableReader(storage_options=options)
    parse = formats.TableParse(raw.BadLines())
    rows = []
    for chunk in chunks:
        batch = Transform()(parse(reader(chunk)))
        rows += [
            (float(batch["labels"][i]), batch["dense"][i].tobytes(), batch["ids"][i].tobytes())
            for i in range(batch["labels"].size)
        ]
    return sorted(rows)


def test_sub_prefixes_and_a_consoles_folder_markers_read_and_an_objects_url_is_refused(
    s3, cache, local_folder
):
    # The S3 console's "Create folder" leaves empty objects named "spark/" and
    # "spark/day_0/": folders, not files (and not the prefix being an object).
    fs, options, _ = s3
    for key in ("spark/", "spark/day_0/"):
        fs.call_s3("put_object", Bucket=BUCKET, Key=key, Body=b"")
    for name, body in _files().items():
        fs.pipe_file(
            f"{BUCKET}/spark/{name.split('.')[0]}/part-00000.{name.split('.', 1)[1]}", body
        )
    fs.pipe_file(f"{BUCKET}/spark/_SUCCESS", b"")
    fs.invalidate_cache()
    assert _rows(f"s3://{BUCKET}/spark", storage_options=options) == _rows(local_folder)
    with pytest.raises(
        NotADirectoryError, match=rf"give the one that holds it \(s3://{BUCKET}/days\)"
    ):
        build_pipeline(f"s3://{BUCKET}/days/day_0.tsv", batch_size=BATCH, storage_options=options)
