"""Raw Criteo files read from a local folder, from ``file://`` through fsspec, and from S3.

``python -m benchmarks.raw_store [--lines 60000] [--rounds 3] [--json OUT]``

Three files written by Python's ``gzip`` module and as plain text (``--lines`` each): a
``.tsv``, a one-member ``.gz`` and a many-member ``.tsv.gz`` (one member per batch, as
``cat``-ed gzip files). The S3 is moto's ``ThreadedMotoServer`` on this host (needs the test
extra): an S3-compatible server, so the figures are the overhead of the S3 API, s3fs and
HTTP, not a network's latency or bandwidth.

Every source is measured in one run, alternately, ``--rounds`` times (the median is kept):

- ``scan``: building the chunk index from nothing (every file read and inflated once);
- ``read+parse``: every chunk read (``RawReader``) and parsed (``RawParse``) in this process,
  in order: one worker's rate;
- ``pipeline``: one epoch of the DLRM pipeline (``build_pipeline``, default workers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from agents.dlrm import raw
from agents.dlrm.workload import build_pipeline

BATCH = 4096
BUCKET = "bench"


def criteo_text(lines: int, seed: int) -> bytes:
    """``lines`` Criteo lines: a label, 13 integers and 26 hashes (some empty)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, lines)
    dense = rng.integers(0, 1000, (lines, 13))
    sparse = rng.integers(0, 1 << 32, (lines, 26), dtype=np.uint64)
    rows = []
    for i in range(lines):
        fields = [str(labels[i]), *map(str, dense[i]), *(f"{h:08x}" for h in sparse[i])]
        rows.append("\t".join(fields))
    return ("\n".join(rows) + "\n").encode()


def write_files(folder: Path, lines: int) -> dict[str, bytes]:
    plain = criteo_text(lines, 1)
    single = gzip.compress(criteo_text(lines, 2))
    text = criteo_text(lines, 3).splitlines(keepends=True)
    parts = [b"".join(text[i : i + BATCH]) for i in range(0, len(text), BATCH)]
    files = {
        "day_0.tsv": plain,
        "day_1.gz": single,
        "day_2.tsv.gz": b"".join(gzip.compress(p) for p in parts),
    }
    for name, body in files.items():
        (folder / name).write_bytes(body)
    return files


def forget_index(source: str | Path) -> None:
    for location in raw.index_locations(source, BATCH):
        location.unlink(missing_ok=True)


def measure(source: str | Path, options: dict | None) -> dict[str, float]:
    forget_index(source)
    started = time.perf_counter()
    index = raw.load_or_build_index(source, BATCH, options)
    scan = time.perf_counter() - started
    rows = sum(c.rows for c in index.chunks)
    reader, parser = raw.RawReader(storage_options=options), raw.RawParse(raw.BadLines())
    started = time.perf_counter()
    for chunk in index.chunks:
        parser(reader(chunk))
    read = time.perf_counter() - started
    started = time.perf_counter()
    seen = 0
    with build_pipeline(source, batch_size=BATCH, epochs=1, storage_options=options) as pipe:
        for batch in pipe:
            seen += int(batch["labels"].shape[0])
    epoch = time.perf_counter() - started
    assert seen == rows, (seen, rows)
    return {"scan_s": scan, "read_rows_per_s": rows / read, "pipeline_rows_per_s": rows / epoch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=60_000, help="lines per file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's line per request

    work = Path(tempfile.mkdtemp(prefix="raw-store-bench-"))
    os.environ["INTUNE_CACHE"] = str(work / "cache")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "endpoint_url": f"http://{host}:{port}",
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"region_name": "eu-west-1"},
        }
        folder = work / "days"
        folder.mkdir()
        files = write_files(folder, args.lines)
        fs = raw.filesystem("s3://", options)
        fs.mkdir(BUCKET)
        for name, body in files.items():
            fs.pipe_file(f"{BUCKET}/days/{name}", body)
        sources = {
            "local": (folder, None),
            "file://": (folder.as_uri(), None),
            "s3 (moto)": (f"s3://{BUCKET}/days", options),
        }
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
        names = list(sources)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                figures[name].append(measure(*sources[name]))
                print(f"round {round_ + 1} {name}: {figures[name][-1]}", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in figures.items()
    }
    sizes = {name: len(body) for name, body in files.items()}
    print(f"\nfiles: {sizes}; {3 * args.lines} lines; batch {BATCH}; median of {args.rounds}")
    print(f"{'source':<10} {'scan s':>8} {'read+parse rows/s':>18} {'pipeline rows/s':>16}")
    for name, m in medians.items():
        print(
            f"{name:<10} {m['scan_s']:>8.2f} {m['read_rows_per_s']:>18,.0f} "
            f"{m['pipeline_rows_per_s']:>16,.0f}"
        )
    local = medians["local"]
    for name in names[1:]:
        m = medians[name]
        print(
            f"{name} / local: scan time x{m['scan_s'] / local['scan_s']:.2f}, read+parse "
            f"x{m['read_rows_per_s'] / local['read_rows_per_s']:.2f}, pipeline "
            f"x{m['pipeline_rows_per_s'] / local['pipeline_rows_per_s']:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "runs": figures, "sizes": sizes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
