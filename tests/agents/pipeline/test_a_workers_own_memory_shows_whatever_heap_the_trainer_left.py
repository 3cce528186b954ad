"""A worker's own memory shows in its stage's ``rss_mb`` however the training process left its
heap. A long-running process's heap keeps blocks it freed, resident and mapped; a worker forked
with them mapped reused them for its allocations (copies on write, which its resident set does
not show) and read 0 MB of its own whatever it allocated: the clean-clone suite of 2026-11-30
saw 8 MB workers read as 0 in two tests. The launcher now gives that memory back before it forks
any worker. Each case runs in a fresh process, whose heap the case lays out: a block that raises
glibc's mmap threshold, then blocks freed in the middle of the heap. Generated: sizes, workers."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from agents.pipeline import Pipeline, Stage
    raise_mb, hole_mb, own_mb, workers = map(int, sys.argv[1:])
    x = b"\\x03" * (raise_mb << 20)
    del x  # glibc's mmap threshold rises to it: later blocks below it come from the heap
    blocks = [b"\\x04" * (hole_mb << 20) for _ in range(12)]
    for i in range(0, 12, 2):
        blocks[i] = None  # holes in the middle of the heap, resident
    held = []

    def holding(x):
        if not held:
            held.append(b"\\x01" * (own_mb << 20))
        time.sleep(0.0005)
        return x

    p = Pipeline(range(10**9), [Stage("holds", holding, workers=workers)])
    p.start()
    it = iter(p)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        next(it)
    print(json.dumps(p.metrics()[0]["rss_mb"]))
    p.stop()
    """
)


@pytest.mark.timeout(240)
@settings(max_examples=4, deadline=None)
@given(
    raise_mb=st.sampled_from([12, 16, 24]),
    hole_mb=st.sampled_from([8, 10]),
    own_mb=st.sampled_from([4, 8]),
    workers=st.integers(1, 2),
)
def test_a_workers_allocation_shows_in_a_fresh_heap_or_a_fragmented_one(
    raise_mb, hole_mb, own_mb, workers
):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(raise_mb), str(hole_mb), str(own_mb), str(workers)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rss_mb = json.loads(done.stdout.strip().splitlines()[-1])
    # At least one worker ran (both, as a rule); each holds own_mb of its own.
    assert 0.8 * own_mb <= rss_mb < workers * (own_mb + 48), rss_mb
