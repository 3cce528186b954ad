"""``python -m agents`` (the ``intune-agent`` script): registers the host once, keeps the token
and sequence in its state file, runs a user's module:factory pipeline and reports it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[2]


# An identity whose control plane is never reached: for what the agent refuses before it calls.
UNREACHABLE = ["--url", "http://127.0.0.1:9", "--host-id", "1", "--token", "ia_x"]


def run_agent(*args: str, seconds: float = 2.0, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "agents", *args, "--seconds", str(seconds), "--log-level", "INFO"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_names_every_option():
    result = subprocess.run(
        [sys.executable, "-m", "agents", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    options = "--url --host-id --token --pipeline --interval --batch-seconds --buffer-samples"
    options += " --worker-budget --memory-budget-mb --prometheus-port --no-train --job --fuse"
    for option in (options + " --api-token --state-dir").split():
        assert option in result.stdout


def test_registers_once_then_reuses_its_token_and_continues_its_sequence(control_plane, tmp_path):
    common = ["--url", control_plane.url, "--job", "7", "--api-token", control_plane.api_token,
              "--state-dir", str(tmp_path), "--pipeline", "cli_pipelines:build",
              "--interval", "0.2", "--batch-seconds", "0.5"]  # fmt: skip
    first = run_agent(*common)
    assert first.returncode == 0, first.stderr
    state = json.loads((tmp_path / "agent.json").read_text())
    assert (tmp_path / "agent.json").stat().st_mode & 0o777 == 0o600
    host = control_plane.hosts[state["host_id"]]
    assert state["agent_token"] == host.token
    first_seqs = set(host.samples)
    assert len(first_seqs) >= 3, first.stderr
    assert state["last_seq"] == max(first_seqs)

    second = run_agent(*common)
    assert second.returncode == 0, second.stderr
    assert len(control_plane.hosts) == 1, "the second run registered the host again"
    new = set(host.samples) - first_seqs
    assert new and min(new) > max(first_seqs)
    assert host.statuses[-1]["applied_version"] == 1


def test_without_an_identity_it_says_what_to_pass(tmp_path):
    result = run_agent(
        "--state-dir", str(tmp_path), "--pipeline", "cli_pipelines:build",
        env={"INTUNE_URL": "", "INTUNE_HOST_ID": "", "INTUNE_AGENT_TOKEN": ""},
    )  # fmt: skip
    assert result.returncode != 0
    assert "--url, --host-id and --token" in result.stderr


def test_a_bad_pipeline_spec_says_what_is_expected(tmp_path):
    result = run_agent(
        *UNREACHABLE, "--pipeline", "no_such_module:build", "--state-dir", str(tmp_path)
    )
    assert result.returncode != 0
    assert "cannot import 'no_such_module'" in result.stderr


def test_a_fusion_that_cannot_be_made_is_refused_before_anything_runs(tmp_path):
    result = run_agent(
        *UNREACHABLE, "--fuse", "read+transform", "--state-dir", str(tmp_path), seconds=30
    )
    assert result.returncode != 0
    assert "--fuse read+transform" in result.stderr
    assert "only neighbouring stages fuse" in result.stderr


def test_fusion_is_for_the_dlrm_pipeline_only(tmp_path):
    result = run_agent(
        *UNREACHABLE, "--pipeline", "cli_pipelines:build", "--fuse", "a+b",
        "--state-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode != 0
    assert "--fuse applies to --pipeline dlrm only" in result.stderr
    assert "fuses its own stages" in result.stderr


def registered(control_plane, tmp_path, pipeline: str) -> list[str]:
    return ["--url", control_plane.url, "--job", "7", "--api-token", control_plane.api_token,
            "--state-dir", str(tmp_path), "--pipeline", pipeline,
            "--interval", "0.2", "--batch-seconds", "0.5"]  # fmt: skip


def test_an_exhausted_pipeline_stops_the_agent_at_once_and_cleanly(control_plane, tmp_path):
    began = time.monotonic()
    result = run_agent(*registered(control_plane, tmp_path, "cli_pipelines:finite"), seconds=40)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began < 30, "the agent idled on after its pipeline ended"
    assert "the pipeline is exhausted" in result.stderr


def test_a_failing_stage_stops_the_agent_with_the_error_and_a_failing_status(
    control_plane, tmp_path
):
    result = run_agent(*registered(control_plane, tmp_path, "cli_pipelines:failing"), seconds=40)
    assert result.returncode == 1
    assert "stage 'read' failed" in result.stderr
    assert "ValueError: record 20 is malformed" in result.stderr


def test_a_factory_that_returns_no_pipeline_is_refused_with_what_it_lacks(tmp_path):
    result = run_agent(
        *UNREACHABLE, "--pipeline", "cli_pipelines:not_a_pipeline", "--state-dir", str(tmp_path)
    )
    assert result.returncode != 0
    assert "returned list, not a pipeline" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_pipeline_whose_stages_are_not_the_jobs_is_refused_naming_both(control_plane, tmp_path):
    result = run_agent(*registered(control_plane, tmp_path, "cli_pipelines:other_stages"))
    assert result.returncode != 0
    assert "stages read, parse" in result.stderr and "fetch, decode" in result.stderr
