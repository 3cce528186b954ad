"""``python -m benchmarks.data_layouts`` measures every layout and reads every row of each (a
tiny run; the figures are in docs/benchmarks.md)."""

import json

import pytest

from benchmarks import data_layouts

pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra)")


def test_a_tiny_run_measures_the_three_layouts(tmp_path, monkeypatch):
    monkeypatch.setattr(data_layouts, "BATCH", 256)
    # main() points INTUNE_CACHE at its scratch folder; this puts it back afterwards.
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "layouts.json"
    args = ["--rows", "2000", "--days", "2", "--row-group", "300", "--rounds", "1"]
    assert data_layouts.main([*args, "--json", str(out)]) == 0
    medians = json.loads(out.read_text())["medians"]
    assert set(medians) == {"tsv", "npy", "parquet"}
    for figures in medians.values():
        assert figures["read_rows_per_s"] > 0 and figures["pipeline_rows_per_s"] > 0
