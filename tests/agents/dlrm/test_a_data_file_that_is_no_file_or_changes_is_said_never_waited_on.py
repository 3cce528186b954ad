"""A data file on disk that is not a regular file (a named pipe, a link that leads nowhere
or in a loop) or that changes under the reader (truncated, grown, deleted, still being
written while it is indexed) ends the DLRM reader at once with an error naming the file and
what to do: never a wait without end (``open()`` of a FIFO waits for a writer for ever), never
rows left out or read out of place unsaid. Found by the probe of 2026-11-29
(docs/reliability.md, "Data where it lies").
"""

from __future__ import annotations

import gzip
import os
import threading
import time

import pytest

from agents.dlrm import raw

pytestmark = pytest.mark.usefixtures("own_cache")

LINE = "\t".join(["1", *["5"] * 13, *["0a1b2c3d"] * 26])
TEXT = ("\n".join([LINE] * 60) + "\n").encode()


def _read_all(index) -> int:
    read, parse = raw.RawReader(), raw.RawParse(raw.BadLines("skip"))
    return sum(parse(read(chunk))["labels"].size for chunk in index.chunks)


def _within(fn, seconds: float = 10.0) -> dict:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the reader still waits after {seconds} s"
    return outcome


@pytest.mark.parametrize("name", ["day_0.tsv", "day_0.gz"])
def test_a_file_replaced_by_a_named_pipe_after_indexing_is_refused_not_waited_on(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(TEXT if name.endswith(".tsv") else gzip.compress(TEXT))
    index = raw.load_or_build_index(tmp_path, 16)
    path.unlink()
    os.mkfifo(path)
    try:
        outcome = _within(lambda: _read_all(index))
    finally:
        # Free a reader left waiting in open() (the failure), so that the test ends.
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert "value" not in outcome, outcome
    assert f"{path} is a named pipe (FIFO), not a file" in str(outcome["error"])


@pytest.mark.parametrize("odd", ["fifo", "broken_link", "link_loop"])
def test_a_data_name_that_holds_no_file_is_refused_not_left_out(tmp_path, odd):
    (tmp_path / "day_0.tsv").write_bytes(TEXT)
    path = tmp_path / "day_1.tsv"
    if odd == "fifo":
        os.mkfifo(path)
    elif odd == "broken_link":
        path.symlink_to(tmp_path / "unmounted" / "day_1.tsv")
    else:
        path.symlink_to(path)
    what = {"fifo": "a named pipe", "broken_link": "a link that leads nowhere",
            "link_loop": "a link that leads nowhere"}[odd]  # fmt: skip
    with pytest.raises(OSError, match=rf"day_1.tsv is {what}.*not a file"):
        raw.load_or_build_index(tmp_path, 16)  # before: 60 rows, day_1 left out unsaid


@pytest.mark.parametrize("change", ["truncated", "grown", "rewritten", "deleted"])
def test_a_file_changed_after_indexing_is_refused_naming_it(tmp_path, change):
    path = tmp_path / "day_0.tsv"
    path.write_bytes(TEXT)
    index = raw.load_or_build_index(tmp_path, 16)
    if change == "truncated":
        path.write_bytes(TEXT[: len(TEXT) // 2])
    elif change == "grown":  # before: the first 60 rows read, the new ones unsaid
        with path.open("ab") as handle:
            handle.write(TEXT)
    elif change == "rewritten":  # same size, a line moved: before, read out of place
        time.sleep(0.01)
        path.write_bytes(b"1\t2\n" + TEXT[:-4])
    else:
        path.unlink()
    said = "no such file any more" if change == "deleted" else "changed after it was indexed"
    with pytest.raises((ValueError, FileNotFoundError), match=rf"day_0.tsv.*{said}.*start"):
        _read_all(index)


def test_a_file_still_being_written_while_it_is_indexed_is_refused(tmp_path, monkeypatch):
    # Before: indexed to wherever the writer had got, its last line maybe cut in a value
    # (a categorical of 4 hex digits reads as another value), the index kept as whole.
    path = tmp_path / "day_0.tsv"
    path.write_bytes(TEXT * 50)
    blocks = raw._blocks

    def written_meanwhile(handle, size=raw._BLOCK):
        yield from blocks(handle, size)
        with path.open("ab") as writer:  # the writer goes on as the scan reads
            writer.write(LINE[:-4].encode())

    monkeypatch.setattr(raw, "_blocks", written_meanwhile)
    with pytest.raises(ValueError, match=r"day_0.tsv changed .*still being written"):
        raw.load_or_build_index(tmp_path, 16)
