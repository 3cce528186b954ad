"""What group commit could save: PostgreSQL's CPU for N agents' usual batches stored as shipped
(one statement each, its own transaction: ``services.store_usual_batch``) against the same
statements in ONE transaction (one commit for the group, what a flusher collecting the batches
that arrived together would do in the happy case).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/intune_bench \\
        python -m benchmarks.group_commit_pg --hosts 100 --rounds 6

In process, on DATABASE_URL's PostgreSQL (on this machine: its backends' CPU is read with
psutil). Alternated round by round; prints medians per batch of 5 samples x 8 stages.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.burst_cpu import backends_cpu
from benchmarks.ingestion_host import (
    STAGES,
    batch_maker,
    postgres_database,
    register_hosts,
    setup_django,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.group_commit_pg",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)

    setup_django(Path(tempfile.mkdtemp(prefix="intune-group-commit-")))
    from django.db import transaction

    from webapp.ingestion import services
    from webapp.ingestion.validation import validate_batch

    database = postgres_database(parser.error)
    hosts = [host for host, _ in register_hosts(args.hosts, prefix="group")]
    makers = [batch_maker(samples=5) for _ in hosts]
    names = frozenset(STAGES)

    def each_its_own(batches) -> None:
        for host, batch in zip(hosts, batches, strict=True):
            assert services.store_usual_batch(host, batch) is not None

    def one_transaction(batches) -> None:
        with transaction.atomic():
            for host, batch in zip(hosts, batches, strict=True):
                services._insert_on_postgres(host, batch, whole=True)

    variants = {"each_its_own": each_its_own, "one_transaction": one_transaction}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        order = list(variants) if round_ % 2 == 0 else list(reversed(list(variants)))
        for name in order:
            batches = [validate_batch(json.loads(json.dumps(m())), names, 100) for m in makers]
            pg0, cpu0 = backends_cpu(database), time.process_time()
            variants[name](batches)
            pg, cpu = backends_cpu(database) - pg0, time.process_time() - cpu0
            results[name].append((pg / len(hosts) * 1000, cpu / len(hosts) * 1000))
    figures = {"hosts": args.hosts, "rounds": args.rounds}
    for name, rounds in results.items():
        figures[name] = {
            "pg_ms": round(statistics.median(r[0] for r in rounds), 3),
            "web_ms": round(statistics.median(r[1] for r in rounds), 3),
        }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
