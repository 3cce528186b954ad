"""CPU per metrics batch of the checks the strictness audit added to the lean ingestion path
(docs/reliability.md, "An outside client's malformed requests"), beside what the path already
spent parsing and validating, for scale:

    python -m benchmarks.strict_checks_cpu --rounds 9 --batches 2000

Batches of 5 samples x 8 stages (benchmarks.ingestion_host.batch_maker) as JSON bytes. Each
round times, in this thread's CPU time, per batch: ``parse`` (orjson.loads, as the lean path
reads a body), ``repeat_check`` (webapp.parsers.keys_may_repeat with its orjson.dumps of the
parsed batch), ``validate`` (validate_batch with the clock bound, as shipped) and
``validate_unbounded`` (validate_batch without it), the four in an order that turns each
round. No database, no Django request: only these functions. Prints a JSON object; medians of
the rounds, in microseconds.
"""

import argparse
import json
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.strict_checks_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=2000)
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    import orjson

    from benchmarks.ingestion_host import STAGES, batch_maker
    from webapp.ingestion.validation import latest_sample_ts, validate_batch
    from webapp.parsers import keys_may_repeat

    make = batch_maker()
    bodies = [json.dumps(make()).encode() for _ in range(args.batches)]
    parsed = [orjson.loads(body) for body in bodies]
    names = set(STAGES)

    def parse():
        for body in bodies:
            orjson.loads(body)

    def repeat_check():
        for body, data in zip(bodies, parsed, strict=True):
            assert not keys_may_repeat(body, orjson.dumps(data))

    def validate():
        for data in parsed:
            validate_batch(data, names, 600, latest_sample_ts())

    def validate_unbounded():
        for data in parsed:
            validate_batch(data, names, 600)

    runs = [parse, repeat_check, validate, validate_unbounded]
    timings: dict[str, list[float]] = {run.__name__: [] for run in runs}
    for round_ in range(args.rounds):
        turn = round_ % len(runs)
        for run in runs[turn:] + runs[:turn]:
            started = time.thread_time()
            run()
            timings[run.__name__].append((time.thread_time() - started) / args.batches * 1e6)
    result = {
        "batch_bytes": len(bodies[0]),
        "us_per_batch": {name: round(statistics.median(v), 1) for name, v in timings.items()},
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
