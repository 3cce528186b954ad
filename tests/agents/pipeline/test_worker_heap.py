"""Worker processes reuse the memory they free, instead of faulting it in for every item."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.pipeline import Pipeline, Stage

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/stat")


def _minor_faults() -> int:
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def faults_of_temporaries(_: int) -> int:
    """Hold eight 4 MB temporaries at once and drop them, as a parse step does; count the
    page faults that cost. glibc's own thresholds adapt to the largest single block (4 MB)
    and give the 32 MB back at the end of every item, so the next one faults it in again."""
    before = _minor_faults()
    scratch = [np.ones(2**19) for _ in range(8)]  # 8 x 4 MB
    del scratch
    return _minor_faults() - before


def _faults_per_item(keep_heap: bool) -> list[int]:
    stages = [Stage("scratch", faults_of_temporaries)]
    with Pipeline(range(8), stages, keep_worker_heap=keep_heap) as pipeline:
        return list(pipeline)


def test_a_worker_that_keeps_its_heap_stops_faulting_after_its_first_item():
    faults = _faults_per_item(keep_heap=True)
    assert max(faults[2:]) < 100, faults


def test_with_the_allocators_defaults_every_item_faults_its_memory_in_again():
    # The contrast that makes the test above mean something. In a fresh interpreter: glibc's
    # thresholds adapt to the largest block a process has freed, and workers inherit them from
    # the process that forked them, so after earlier tests freed big arrays in this one the
    # "defaults" of a worker forked from here are not the defaults any more.
    code = (
        "import json; from tests.agents.pipeline.test_worker_heap import _faults_per_item; "
        "print(json.dumps(_faults_per_item(keep_heap=False)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    assert min(faults[2:]) > 1000, faults
