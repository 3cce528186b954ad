"""``intune-agent --data-dir DIR [--bad-lines error|skip]``: the built-in DLRM pipeline over a
folder of Criteo files as they come (``agents.dlrm.raw``); refused, with what to do, for a
user's own pipeline, a missing folder or a policy without a folder."""

from __future__ import annotations

import random

import pytest

from agents.__main__ import build_parser, load_pipeline
from agents.dlrm.schema import STAGE_NAMES
from tests.agents.daemon.test_cli_registers_once_and_reports import run_agent

IDENTITY = ["--url", "http://127.0.0.1:9", "--host-id", "1", "--token", "ia_x"]


def _criteo_line(rng: random.Random) -> str:
    dense = [str(rng.randint(0, 500)) for _ in range(13)]
    sparse = [f"{rng.getrandbits(32):08x}" for _ in range(26)]
    return "\t".join([str(rng.randint(0, 1)), *dense, *sparse])


@pytest.fixture
def criteo_folder(tmp_path):
    """A folder with one plain Criteo file of 300 lines; line 7 (counting from 1) is broken."""
    rng = random.Random(3)
    lines = [_criteo_line(rng) for _ in range(300)]
    lines[6] = "1\tnot\tenough\tfields"
    folder = tmp_path / "criteo"
    folder.mkdir()
    (folder / "day_0.tsv").write_text("\n".join(lines) + "\n")
    return folder


def test_the_flags_are_parsed_and_bad_lines_takes_only_error_or_skip():
    args = build_parser().parse_args(["--data-dir", "/data", "--bad-lines", "skip"])
    assert (args.data_dir, args.bad_lines) == ("/data", "skip")
    assert build_parser().parse_args([]).data_dir is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--bad-lines", "ignore"])


def test_skip_drops_the_broken_line_and_counts_it(criteo_folder):
    pipeline = load_pipeline("dlrm", data_dir=str(criteo_folder), bad_lines="skip")
    with pipeline:
        batch = next(iter(pipeline))
    assert batch["labels"].shape[0] == 299
    assert pipeline.bad_lines.count >= 1  # once per epoch read ahead (it cycles)


def test_error_is_the_default_and_names_the_file_and_line(criteo_folder):
    from agents.pipeline import StageFailed

    pipeline = load_pipeline("dlrm", data_dir=str(criteo_folder))
    with pipeline, pytest.raises(StageFailed) as failure:
        next(iter(pipeline))
    assert "day_0.tsv, line 7" in str(failure.value)


def test_the_agent_runs_the_folder_and_reports_to_the_control_plane(control_plane, criteo_folder):
    host = control_plane.add_host(list(STAGE_NAMES))
    args = ["--data-dir", str(criteo_folder), "--bad-lines", "skip", "--no-train"]
    args += ["--interval", "0.2", "--batch-seconds", "0.5"]
    args += ["--url", control_plane.url, "--host-id", str(host.id), "--token", host.token]
    result = run_agent(*args, "--state-dir", str(criteo_folder.parent / "state"), seconds=3)
    assert result.returncode == 0, result.stderr
    assert len(host.samples) >= 3, result.stderr
    assert host.statuses[-1]["applied_version"] == 1, result.stderr
    assert "skipped 1 malformed line(s)" in result.stderr + result.stdout


@pytest.mark.parametrize(
    "flags, says",
    [
        (
            ["--data-dir", "{folder}", "--pipeline", "cli_pipelines:build"],
            "to --pipeline dlrm only",
        ),
        (
            ["--bad-lines", "skip", "--pipeline", "cli_pipelines:build"],
            "to --pipeline dlrm only",
        ),
        (["--data-dir", "{folder}/nowhere"], "no such folder"),
        (["--bad-lines", "skip"], "--bad-lines applies to the Criteo files of --data-dir"),
        (["--data-dir", "{empty}"], "holds no Criteo files"),
    ],
    ids=["data-dir-elsewhere", "bad-lines-elsewhere", "missing", "policy-alone", "empty"],
)
def test_a_flag_that_cannot_apply_is_refused_with_what_to_do(flags, says, criteo_folder, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    flags = [f.format(folder=criteo_folder, empty=empty) for f in flags]
    result = run_agent(*IDENTITY, *flags, "--state-dir", str(tmp_path / "state"), seconds=30)
    assert result.returncode != 0
    assert says in result.stderr
    assert "Traceback" not in result.stderr
