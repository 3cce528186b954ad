"""Away from a terminal (a log file, journald, a pipe to Loki) the agent writes one line per
record, and an exception as Python's standard traceback; rich's layout only on a terminal."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.logging import RichHandler

from agents.logs import OneLineFormatter, log_handler

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
RECORD = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"[\w.]+: \S.*"
)
EXCEPTION_LINE = re.compile(r"[\w.]+(Error|Exception)(: .*)?")


def parse_log(text: str) -> list[tuple[str, list[str]]]:
    """Split a log into (record line, traceback lines); fail on a line that is neither a record
    nor part of a standard traceback right after one."""
    records: list[tuple[str, list[str]]] = []
    in_traceback = False
    for number, line in enumerate(text.splitlines(), 1):
        if RECORD.fullmatch(line):
            records.append((line, []))
            in_traceback = False
        elif records and not records[-1][1] and line == "Traceback (most recent call last):":
            records[-1][1].append(line)
            in_traceback = True
        elif in_traceback and (line.startswith("  ") or EXCEPTION_LINE.fullmatch(line)):
            records[-1][1].append(line)
            in_traceback = not EXCEPTION_LINE.fullmatch(line)
        else:
            raise AssertionError(f"line {number} is neither a record nor a traceback: {line!r}")
    return records


def test_a_record_with_newlines_stays_on_one_line_and_an_exception_is_a_standard_traceback():
    script = (
        "import logging\n"
        "from agents.logs import configure_logging\n"
        "configure_logging('INFO')\n"
        "log = logging.getLogger('agents.test')\n"
        "log.info('first line\\nsecond line')\n"
        "try:\n"
        "    {}['missing']\n"
        "except KeyError:\n"
        "    log.exception('could not read %s', 'the key')\n"
        "log.warning('after the traceback')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = parse_log(result.stderr)
    lines = [line for line, _ in records]
    assert [line.split(" ", 1)[1] for line in lines] == [
        "INFO agents.test: first line\\nsecond line",
        "ERROR agents.test: could not read the key",
        "WARNING agents.test: after the traceback",
    ]
    traceback = records[1][1]
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[1].startswith('  File "<string>", line 7, in <module>')
    assert traceback[-1] == "KeyError: 'missing'"


def test_the_agent_writes_one_line_per_record_to_a_pipe(control_plane, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "agents", "--url", control_plane.url, "--job", "7",
         "--api-token", control_plane.api_token, "--state-dir", str(tmp_path),
         "--pipeline", "cli_pipelines:build_whose_first_measurement_fails", "--interval", "0.2",
         "--batch-seconds", "0.5", "--seconds", "2", "--log-level", "INFO"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "COLUMNS": "80"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = parse_log(result.stderr)
    messages = [line.split(": ", 1)[1] for line, _ in records]
    assert any(m.startswith("agent started for host") for m in messages), result.stderr
    assert any(len(line) > 80 for line, _ in records), "long records are not wrapped at 80"
    failed = [tb for line, tb in records if "could not take a sample" in line]
    assert failed and failed[0][0] == "Traceback (most recent call last):", result.stderr
    assert failed[0][-1] == "RuntimeError: the first measurement fails (a test)"
    assert not re.search("[│╭╰─]", result.stderr), "rich's boxes reached a pipe"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_rich_is_kept_for_a_terminal_and_plain_lines_go_everywhere_else(tmp_path):
    assert isinstance(log_handler(Terminal()), RichHandler)
    with open(tmp_path / "agent.log", "w") as log_file:
        handler = log_handler(log_file)
    assert not isinstance(handler, RichHandler)
    assert isinstance(handler.formatter, OneLineFormatter)
