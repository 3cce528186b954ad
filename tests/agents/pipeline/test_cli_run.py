"""`python -m agents.pipeline run` runs a pipeline at an allocation and writes its figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "agents.pipeline", "run", *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip


def test_run_writes_samples_per_second_overall_and_per_stage(tmp_path):
    out = tmp_path / "result.json"
    done = _run(
        "--pipeline", "agents.pipeline.examples:counting", "--allocation", "s0=2,s2=3",
        "--seconds", "1", "--warmup", "0.3", "--option", "work_ms=2", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["allocation"] == {"s0": 2, "s1": 1, "s2": 3}
    assert result["samples_per_s"] > 50
    assert [s["name"] for s in result["stages"]] == ["s0", "s1", "s2"]
    assert all(s["samples_per_s"] > 0 for s in result["stages"])


def test_run_refuses_an_unknown_stage_with_the_known_ones():
    done = _run("--pipeline", "agents.pipeline.examples:counting", "--allocation", "zzz=2")
    assert done.returncode == 2
    assert "unknown stage 'zzz'" in done.stderr and "s0, s1, s2" in done.stderr


def test_run_explains_a_pipeline_it_cannot_find():
    done = _run("--pipeline", "nowhere.to.be:found")
    assert done.returncode == 2
    assert "cannot import 'nowhere.to.be'" in done.stderr


def test_run_takes_a_fusion_of_the_dlrm_stages_and_allocates_the_fused_stage(tmp_path):
    out = tmp_path / "result.json"
    done = _run(
        "--pipeline", "dlrm", "--option", "fuse=read+parse+transform+collate",
        "--option", "rows=4096", "--option", "batch_size=512",
        "--allocation", "read+parse+transform+collate=2",
        "--seconds", "1", "--warmup", "0.5", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["allocation"] == {"read+parse+transform+collate": 2, "prefetch": 1}
    assert result["samples_per_s"] > 0
