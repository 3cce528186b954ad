"""A child process that runs a pipeline for the signal tests: it prints its phases, its
launcher's pid and its shared-memory prefix, and loops until a signal ends it.

Usage: ``python signalled.py STAGES WORKERS ITEM_BYTES PHASE`` where ``PHASE`` is when the
test means to signal it (``start``, ``iterate``, ``resize``, ``stop``); the child only makes
that phase long enough (a slow source, repeated resizes, a slow stop) to land in."""

from __future__ import annotations

import sys
import time

import numpy as np

from agents.pipeline import Pipeline, Stage


def touch(item):
    return item


def slow_init(slot: int) -> None:
    time.sleep(0.05)


def main() -> int:
    stages, workers, item_bytes, _phase = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )

    def source():
        while True:
            yield np.zeros(item_bytes, dtype=np.uint8)

    pipeline = Pipeline(
        source,
        [
            Stage(f"s{k}", touch, workers=workers, max_workers=4, init=slow_init)
            for k in range(stages)
        ],
        queue_size=4,
        name="signalled",
        stop_timeout_s=1.0,
    )
    print("prefix", pipeline._prefix, flush=True)
    try:
        print("phase start", flush=True)
        pipeline.start()
        if pipeline._zygote is not None:
            print("launcher", pipeline._zygote.pid, flush=True)
        print("phase iterate", flush=True)
        taken = 0
        for _ in pipeline:
            taken += 1
            if taken == 20:
                print("phase resize", flush=True)
            if 20 <= taken < 60:
                pipeline.apply({f"s{k}": 1 + (taken + k) % 3 for k in range(stages)})
            if taken == 60:
                print("phase stop", flush=True)
                break
    finally:
        pipeline.stop()
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
