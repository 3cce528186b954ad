"""``python -m benchmarks.pipeline`` runs every pipeline benchmark and writes its figures (a tiny run:
the figures themselves are measured on a quiet machine, docs/benchmarks.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.pipeline.measure import LAYOUTS

ROOT = Path(__file__).resolve().parents[2]


def test_a_tiny_run_writes_every_figure_and_the_docs_section(tmp_path):
    out, docs = tmp_path / "bench.json", tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Pipeline\n\nold figures\n\n## Tuner\n\nkept\n")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.pipeline", "--cores", "1", "--seconds", "0.4",
         "--warmup", "0.2", "--resizes", "3", "--rows", "8192", "--batch-size", "512",
         "--json", str(out), "--write-docs", str(docs)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "INTUNE_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    (row,) = result["scaling"]["rows"]
    assert row["cores"] == 1 and row["layout"] in {"staged", "halves", "fused"}
    assert set(row["of_ideal_by_layout"]) == {"staged", "halves", "fused"}
    assert 0 < row["of_ideal"] < 2
    assert {t["fuse"] for t in row["tried"]} == set(LAYOUTS.values())
    assert result["dataloader"]["ratio"] > 0 and result["resize"]["resizes"] == 3
    text = docs.read_text()
    assert "old figures" not in text and "## Tuner\n\nkept" in text
    assert f"**{row['of_ideal']:.2f}**" in text
