"""TorchRec-layout npy days as teams save them: what does not fit TorchRec's own is said,
naming the file (when the pipeline is built) or the day and row, not read as something else
(``agents.dlrm.formats``)."""

from __future__ import annotations

import numpy as np
import pytest

from agents.dlrm import formats
from agents.dlrm.workload import build_pipeline
from benchmarks.data_layouts import criteo_rows, write_npy


def _rows(folder, batch_size: int, bad_lines: str = "error") -> dict[str, np.ndarray]:
    chunks, reader, parser = formats.read_and_parse_stages(
        folder, batch_size, bad_lines, data_format="npy"
    )
    parsed = [parser(reader(chunk)) for chunk in chunks]
    return {k: np.concatenate([p[k] for p in parsed]) for k in parsed[0]}


def _counts_as_floats(folder, rows) -> None:
    write_npy(folder, "day_0", rows, logged=False)
    counts = np.load(folder / "day_0_dense.npy").astype(np.float32)
    np.save(folder / "day_0_dense.npy", counts)


def test_counts_saved_as_floats_are_refused_when_the_pipeline_is_built(tmp_path):
    # Before, a float dense array of counts (not their logs) read as exp(count) - 3: inf for
    # every count above 709, 1e43 for 100, without a word.
    _counts_as_floats(tmp_path, criteo_rows(40, 3, largest=1000))
    with pytest.raises(ValueError, match=r"day_0_dense.npy: row \d+, column \d+ holds .*integers"):
        build_pipeline(tmp_path, batch_size=16)


def test_a_count_past_the_first_rows_looked_at_is_a_bad_row_named_by_day_and_row(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(formats, "_NPY_SAMPLE_ROWS", 5)
    rows = criteo_rows(40, 3, largest=30)
    rows.dense[:, 4] = 1  # small counts' floats pass for logs
    rows.dense[27, 4] = 5000
    _counts_as_floats(tmp_path, rows)
    with pytest.raises(ValueError, match=r"day_0, row 27: dense column 4 is 5000, not TorchRec's"):
        _rows(tmp_path, batch_size=16)
    kept = _rows(tmp_path, batch_size=16, bad_lines="skip")
    assert kept["labels"].size == 39 and np.isfinite(kept["dense"]).all()


def test_an_npy_file_cut_off_is_refused_when_the_pipeline_is_built_naming_it(tmp_path):
    # Before, it was found by the read worker that reached its end, in the middle of an epoch.
    write_npy(tmp_path, "day_0", criteo_rows(300, 4))
    whole = (tmp_path / "day_0_sparse.npy").read_bytes()
    (tmp_path / "day_0_sparse.npy").write_bytes(whole[: len(whole) - 1000])
    with pytest.raises(ValueError, match=r"day_0_sparse.npy: its header says 300 rows .*cut off"):
        build_pipeline(tmp_path, batch_size=64)
