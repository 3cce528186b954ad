"""Raw Criteo text as teams have it on disk (Windows line endings, blank lines, a header,
a byte-order mark, empty files) reads as the same rows, and what is not Criteo is said,
naming the file and line (``agents.dlrm.raw``)."""

from __future__ import annotations

import gzip
import io
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.dlrm import formats, raw
from agents.dlrm.workload import build_pipeline


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """A cache folder of this module's own."""
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path_factory.mktemp("cache")))


def _line(n: int) -> str:
    dense = [str(n + i - 2) if (n + i) % 5 else "" for i in range(13)]
    sparse = [f"{(n * 2654435761 + i) % 2**32:08x}" if (n + i) % 7 else "" for i in range(26)]
    return "\t".join([str(n % 2), *dense, *sparse])


def _rows(folder, batch_size: int, bad_lines: str = "error") -> dict[str, np.ndarray]:
    """Every row of ``folder`` read and parsed in this process, in order."""
    chunks, reader, parser = formats.read_and_parse_stages(
        folder, batch_size, bad_lines, data_format="raw"
    )
    parsed = [parser(reader(chunk)) for chunk in chunks]
    return {k: np.concatenate([p[k] for p in parsed]) for k in parsed[0]}


def _assert_same_rows(mine: dict, theirs: dict) -> None:
    assert mine.keys() == theirs.keys()
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key])


@pytest.mark.parametrize("content", [b"", gzip.compress(b"")], ids=["empty", "gzip-of-nothing"])
def test_a_folder_whose_files_hold_no_lines_is_refused_when_the_pipeline_is_built(
    tmp_path, content
):
    # Before, the pipeline was built over no chunks and, cycling over them (epochs=None),
    # spun for ever without a batch.
    name = "day_0.gz" if content else "day_0.tsv"
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=rf"{name}\) hold no lines: they are empty"):
        build_pipeline(str(tmp_path), batch_size=4, epochs=None)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 12),
    batch_size=st.integers(1, 5),
    crlf=st.booleans(),
    bom=st.booleans(),
    header=st.booleans(),
    blanks=st.lists(st.integers(0, 12), max_size=4),
    newline_at_end=st.booleans(),
    gzip_members=st.integers(0, 3),
)
def test_line_endings_blank_lines_a_header_and_a_byte_order_mark_read_as_the_plain_rows(
    tmp_path_factory, rows, batch_size, crlf, bom, header, blanks, newline_at_end, gzip_members
):
    # Before, a CRLF file was refused at its first line ("C26 is b'...\r'"), a blank line
    # or a header row stopped the pipeline, and a byte-order mark made the first label 0.
    lines = [_line(n) for n in range(rows)]
    plain = tmp_path_factory.mktemp("plain")
    (plain / "day_0.tsv").write_text("\n".join(lines) + "\n")
    quirky_lines = list(lines)
    for at in sorted(blanks, reverse=True):
        quirky_lines.insert(min(at, len(quirky_lines)), "")
    if header:
        names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
        quirky_lines.insert(0, "\t".join(names))
    end = "\r\n" if crlf else "\n"
    text = end.join(quirky_lines) + (end if newline_at_end else "")
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode()
    quirky = tmp_path_factory.mktemp("quirky")
    if gzip_members:
        cut = np.linspace(0, len(data), gzip_members + 1).astype(int)
        parts = [data[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]
        (quirky / "day_0.tsv.gz").write_bytes(b"".join(gzip.compress(p) for p in parts))
    else:
        (quirky / "day_0.tsv").write_bytes(data)
    index = raw.load_or_build_index(quirky, batch_size)
    assert [c.rows for c in index.chunks] == [
        min(batch_size, rows - s) for s in range(0, rows, batch_size)
    ]
    _assert_same_rows(_rows(quirky, batch_size), _rows(plain, batch_size))


def test_a_bad_line_after_blank_lines_and_a_header_is_named_by_its_line_in_the_file(tmp_path):
    header = "\t".join(["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(26))])
    lines = [header, _line(0), "", "", _line(1), _line(2), "", _line(3).replace("\t", " ", 1)]
    (tmp_path / "day_0.tsv").write_text("\r\n".join(lines) + "\r\n")
    with pytest.raises(ValueError, match=r"day_0.tsv, line 8: it has 39 tab-separated fields"):
        _rows(tmp_path, batch_size=2)
    kept = _rows(tmp_path, batch_size=2, bad_lines="skip")
    assert kept["labels"].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("label", ["", "2", "1.0", "-1", "true", "\xef\xbb\xbf1"])
def test_a_label_that_is_not_0_or_1_is_a_bad_line_not_a_silent_0(tmp_path, label):
    # Before, a line's label was 1 when its first byte was "1" and 0 otherwise, whatever
    # followed; the other layouts refuse such a label.
    lines = [_line(0), _line(1), "\t".join([label, *_line(2).split("\t")[1:]])]
    (tmp_path / "day_0.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"day_0.tsv, line 3: label is .*, not 0 or 1"):
        _rows(tmp_path, batch_size=4)
    assert _rows(tmp_path, batch_size=4, bad_lines="skip")["labels"].tolist() == [0.0, 1.0]


def test_a_lone_minus_sign_is_a_bad_line_and_19_digits_do_not_wrap_round_to_a_negative(tmp_path):
    # Before, "-" read as a missing value without a word, and 9999999999999999999 (past
    # int64's largest) as -8.4e18.
    fields = _line(1).split("\t")
    big = "\t".join([fields[0], "9999999999999999999", *fields[2:]])
    minus = "\t".join([fields[0], "-", *fields[2:]])
    (tmp_path / "day_0.tsv").write_text(f"{_line(0)}\n{big}\n{minus}\n")
    with pytest.raises(ValueError, match=r"day_0.tsv, line 3: integer feature I1 is b'-'"):
        _rows(tmp_path, batch_size=4)
    kept = _rows(tmp_path, batch_size=4, bad_lines="skip")
    assert kept["dense"][1, 0] == pytest.approx(1e19, rel=1e-6)


def test_criteos_kaggle_tar_gz_and_its_unlabelled_test_file_are_refused_saying_what_they_are(
    tmp_path,
):
    # Before, dac.tar.gz read as Criteo text whose first line was the tar header ("label is
    # b'train.txt\x00...'"), and test.txt's lines were only "39 fields; a Criteo line has 40".
    text = ("\n".join(_line(n) for n in range(6)) + "\n").encode()
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.txt")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    (kaggle / "dac.tar.gz").write_bytes(packed.getvalue())
    with pytest.raises(ValueError, match=r"dac.tar.gz is a tar archive.*tar -xzf dac.tar.gz"):
        raw.load_or_build_index(kaggle, 4)
    test = tmp_path / "test"
    test.mkdir()
    unlabelled = "\n".join(_line(n).split("\t", 1)[1] for n in range(3)) + "\n"
    (test / "test.txt").write_text(unlabelled)
    with pytest.raises(ValueError, match=r"test.txt, line 1: .*39 .*test files have no label"):
        _rows(test, batch_size=4)


def test_a_comma_separated_file_is_said_to_be_one(tmp_path):
    (tmp_path / "day_0.txt").write_text("\n".join(_line(n).replace("\t", ",") for n in range(3)))
    with pytest.raises(ValueError, match=r"day_0.txt, line 1: .*it is comma-separated"):
        _rows(tmp_path, batch_size=4)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    hashes=st.lists(st.integers(0, 2**32 - 1), min_size=26, max_size=26),
    upper=st.booleans(),
)
def test_hex_without_its_leading_zeros_reads_as_its_value_as_parquet_reads_it(
    tmp_path_factory, hashes, upper
):
    # Before, "a1b2c" (a writer that dropped the leading zeros of 000a1b2c) was a bad line,
    # while a Parquet file's "a1b2c" read as 0xa1b2c.
    def text(width: str) -> str:
        values = [format(h, width).upper() if upper else format(h, width) for h in hashes]
        return "\t".join(["1", *map(str, range(13)), *values]) + "\n"

    padded, stripped = tmp_path_factory.mktemp("padded"), tmp_path_factory.mktemp("stripped")
    (padded / "day_0.tsv").write_text(text("08x") * 3)
    (stripped / "day_0.tsv").write_text(text("x") * 3)
    _assert_same_rows(_rows(stripped, batch_size=2), _rows(padded, batch_size=2))
    assert _rows(stripped, batch_size=2)["sparse"][0].tolist() == hashes


def test_hex_of_nine_digits_is_still_a_bad_line(tmp_path):
    fields = _line(1).split("\t")
    (tmp_path / "day_0.tsv").write_text("\t".join([*fields[:14], "123456789", *fields[15:]]))
    with pytest.raises(ValueError, match=r"line 1: categorical feature C1 is b'123456789', not"):
        _rows(tmp_path, batch_size=4)
