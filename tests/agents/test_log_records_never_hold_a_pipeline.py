"""A log record keeps its arguments unformatted until a handler formats it, and some handlers
keep records (pytest's capture, ``logging.handlers.MemoryHandler``, an error tracker's
breadcrumbs). An exception passed as an argument holds its traceback, whose frames hold the
pool and so the pipeline: a pipeline dropped by its consumer was then never collected, and its
launcher, workers and shared memory stayed (found by the pipeline hunter under pytest: the
case below left 41 shared-memory files and 6 processes; it passed with pytest's log capture
off). So the agents' log calls pass an exception as text, never the object.
"""

from __future__ import annotations

import ast
import logging
import random
from pathlib import Path

from tests.agents.pipeline.hunt import run_case, run_forked

AGENTS = Path(__file__).resolve().parents[2] / "agents"
LEVELS = {"debug", "info", "warning", "error", "critical", "exception", "log"}

# A pipeline hunter's case: the launcher killed twice, then stopped past its answers' wait
# (LauncherGone is logged), the pipeline dropped without stop().
CASE = {'stages': [{'name': 's0', 'kind': 'process', 'size': 300000, 'behaviour': 'raise_stopiteration', 'ms': 0.5, 'raise_at': 26, 'ordered': True, 'shm_min_bytes': 65536}, {'name': 's1', 'kind': 'thread', 'size': 300000, 'behaviour': 'spin', 'ms': 0.5, 'raise_at': 37, 'ordered': True, 'shm_min_bytes': 65536}, {'name': 's2', 'kind': 'process', 'size': 8, 'behaviour': 'io_wait', 'ms': 0.0, 'raise_at': 13, 'ordered': True, 'shm_min_bytes': 65536}, {'name': 's3', 'kind': 'process', 'size': 3000000, 'behaviour': 'sleep', 'ms': 10.0, 'raise_at': 1, 'ordered': True, 'shm_min_bytes': 65536}, {'name': 's4', 'kind': 'thread', 'size': 3000000, 'behaviour': 'sleep', 'ms': 2.0, 'raise_at': 27, 'ordered': True, 'shm_min_bytes': 65536}], 'items': 117, 'queue_size': 7, 'layout': ['s0', 's1', 's2', 's3', 's4'], 'ops': [['signal_worker', 0, 'SIGTERM'], ['kill_launcher', 1.5], ['kill_launcher', 0.3], ['stop_launcher', 12.0], ['burst', [{'s4': 1}, {'s4': 1}, {'s4': 1}]], ['apply', {'s3': 2}], ['apply', {'s2': 3}], ['relayout', ['s0+s1', 's2+s3', 's4']], ['apply', {'s3': 2}], ['kill', 1, 0.05], ['zero', 's3', 0], ['apply', {'s2': 3}], ['sleep', 0.01], ['stop_launcher', 0.3]], 'end': 'drop', 'max_item_retries': 50, 'agent': True, 'source_stops_at': 101, 'fsize_limit': None}  # fmt: skip


class KeepRecords(logging.Handler):
    """Keeps every record, as pytest's capture and a MemoryHandler do."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _with_records_kept(case: dict, log: list) -> None:
    keep = KeepRecords()
    logging.getLogger("agents").addHandler(keep)
    try:
        random.seed(0)
        run_case(case, log)
        assert keep.records, "the case logged nothing: it no longer tests what it should"
    finally:
        logging.getLogger("agents").removeHandler(keep)


def test_a_dropped_pipeline_is_collected_while_a_handler_keeps_its_records(tmp_path):
    outcome, took, report = run_forked(_with_records_kept, CASE, 60, tmp_path / "case.log")
    assert outcome == "ok", f"{outcome} after {took:.1f} s\n{report[-4000:]}"


def test_no_log_call_of_the_agents_passes_a_caught_exception_as_an_argument():
    found = []
    for path in sorted(AGENTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for handler in ast.walk(tree):
            if not isinstance(handler, ast.ExceptHandler) or not handler.name:
                continue
            for node in ast.walk(handler):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LEVELS
                    and any(
                        isinstance(arg, ast.Name) and arg.id == handler.name
                        for arg in node.args[1:]
                    )
                ):
                    found.append(f"{path.relative_to(AGENTS.parent)}:{node.lineno}")
    assert not found, f"log calls passing the exception object (pass str(exc)): {found}"
