"""Where PostgreSQL's CPU for a batch goes: the same batch statement (5 samples x 8 stages, the
shipped ``inserts.BatchInsertPostgres``) against the sample tables as they were before migration
ingestion 0004 and with what it dropped, each stored alone (its own commit) and 128 in one
transaction (what the web process's gathered groups do).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME python -m benchmarks.sample_rows_pg

Works on a database of its own, NAME_sample_rows (made here, dropped at the end), migrated and
then taken back to ingestion 0003. Variants are cumulative, in this order: ``0003`` (the three
single-column indexes and stagesample.host's constraint), ``-indexes`` (the indexes dropped),
``-host-fk`` (stagesample.host's constraint dropped too: what 0004 ships), ``-sample-fk``
(stagesample.sample's constraint dropped too: NOT shipped, for scale only). CPU of the one
backend that runs the statements (/proc), per batch, medians of --rounds. Needs PostgreSQL on
this machine.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

VARIANTS = {
    "0003": [],
    "-indexes": [
        'DROP INDEX "ingestion_hostsample_host_id_753b6a4d"',
        'DROP INDEX "ingestion_stagesample_host_id_303c9c7c"',
        'DROP INDEX "ingestion_stagesample_sample_id_744c80ea"',
    ],
    "-host-fk": [
        'ALTER TABLE "ingestion_stagesample" '
        'DROP CONSTRAINT "ingestion_stagesample_host_id_303c9c7c_fk_jobs_host_id"'
    ],
    "-sample-fk": [
        'ALTER TABLE "ingestion_stagesample" '
        'DROP CONSTRAINT "ingestion_stagesampl_sample_id_744c80ea_fk_ingestion"'
    ],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sample_rows_pg",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batches", type=int, default=128, help="batches a round (hosts)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL server on this machine")
    url = urlsplit(base)
    name = f"{url.path.lstrip('/')}_sample_rows"
    scratch = urlunsplit(url._replace(path=f"/{name}"))
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        figures = measure(scratch, args.batches, args.rounds)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps(figures, indent=2))
    return 0


def measure(url: str, batches: int, rounds: int) -> dict:
    os.environ["DATABASE_URL"] = url
    from benchmarks.ingestion_host import STAGES, batch_maker, register_hosts, setup_django

    setup_django(Path(tempfile.mkdtemp(prefix="intune-sample-rows-")))
    from django.core.management import call_command
    from django.utils import timezone

    from webapp.ingestion import services
    from webapp.ingestion.inserts import samples_json
    from webapp.ingestion.validation import validate_batch

    call_command("migrate", "ingestion", "0003", verbosity=0)
    hosts = [host for host, _ in register_hosts(batches, prefix="rows")]
    makers = [batch_maker(samples=5) for _ in hosts]
    sql = services._batch_insert_postgres().sql_whole
    conn = psycopg.connect(url, autocommit=True)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    ticks = os.sysconf("SC_CLK_TCK")

    def backend_cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    def params(i: int) -> dict:
        batch = validate_batch(json.loads(json.dumps(makers[i]())), frozenset(STAGES), 100)
        samples = batch["samples"]
        return {
            "samples": samples_json(samples), "host": hosts[i].pk, "now": timezone.now(),
            "status": "online", "max_seq": max(s["seq"] for s in samples), "applied": None,
            "dropped": 0, "count": len(samples),
        }  # fmt: skip

    def one_round(together: bool) -> float:
        every = [params(i) for i in range(len(hosts))]
        cursor = conn.cursor()
        before = backend_cpu()
        if together:
            cursor.execute("BEGIN")
        for p in every:
            cursor.execute(sql, p, prepare=True)
            cursor.fetchall()
        if together:
            cursor.execute("COMMIT")
        return (backend_cpu() - before) / len(hosts) * 1000

    figures: dict = {"batches": batches, "rounds": rounds}
    for variant, statements in VARIANTS.items():
        for statement in statements:
            conn.execute(statement)
        one_round(False)  # warm: the plan, the caches
        alone, together = [], []
        for round_ in range(rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for grouped in order:
                (together if grouped else alone).append(one_round(grouped))
        figures[variant] = {
            "pg_ms_a_batch_alone": round(statistics.median(alone), 3),
            "pg_ms_a_batch_together": round(statistics.median(together), 3),
        }
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    figures["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    conn.close()
    from django.db import connections

    connections.close_all()
    return figures


if __name__ == "__main__":
    sys.exit(main())
