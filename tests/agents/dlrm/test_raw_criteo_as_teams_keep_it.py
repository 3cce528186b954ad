"""Raw Criteo text as teams have it on disk (Windows line endings, blank lines, a header,
a byte-order mark, empty files) reads as the same rows, and what is not Criteo is said,
naming the file and line (``agents.dlrm.raw``)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from agents.dlrm import raw
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
    index = raw.load_or_build_index(folder, batch_size)
    reader, parser = raw.RawReader(), raw.RawParse(raw.BadLines(bad_lines))
    parsed = [parser(reader(chunk)) for chunk in index.chunks]
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
    with pytest.raises(ValueError, match=rf"{name}\) hold no lines"):
        build_pipeline(str(tmp_path), batch_size=4, epochs=None)
