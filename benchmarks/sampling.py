"""What one agent sample of a running pipeline costs: ``metrics()`` + ``consumer_stats()``.

    python -m benchmarks.sampling --rounds 3 --calls 200

Starts the DLRM pipeline (or ``--pipeline module:factory``) at ``--allocation``, lets it run,
then times ``--calls`` samples in this thread's CPU time, ``--rounds`` times, and prints the
milliseconds of CPU per sample of each round (the agent takes one a second).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from agents.pipeline.loading import build, parse_allocation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sampling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pipeline", default="dlrm", help="'dlrm' or module:factory")
    parser.add_argument("--allocation", default="read=1,parse=2,transform=1,collate=1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="samples a round")
    args = parser.parse_args(argv)
    pipeline = build(args.pipeline).start()
    try:
        pipeline.apply(parse_allocation(args.allocation))
        items = iter(pipeline)
        for _ in range(20):  # every worker has started and produced
            next(items)

        def round_ms(calls: int) -> float:
            started = time.thread_time()
            for _ in range(calls):
                pipeline.metrics()
                pipeline.consumer_stats()
            return (time.thread_time() - started) / calls * 1000

        round_ms(20)  # warm-up
        rounds = [round(round_ms(args.calls), 3) for _ in range(args.rounds)]
    finally:
        pipeline.stop()
    print(json.dumps({"pipeline": args.pipeline, "cpu_ms_per_sample": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
