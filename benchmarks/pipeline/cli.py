"""``python -m benchmarks.pipeline``: the pipeline benchmarks, printed, saved and documented."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from agents.dlrm import build_pipeline, ensure_dataset
from agents.pipeline import consume_until
from benchmarks.pipeline import measure as bench

console = Console(stderr=True, soft_wrap=True)
log = logging.getLogger("benchmarks.pipeline")


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, {memory:.0f} GiB, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def _usable_cores(limit: int | None) -> list[int]:
    """The cores this run uses: those this process may run on, the first ``limit`` of them."""
    return sorted(os.sched_getaffinity(0))[: limit or None]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmarks the arguments ask for and return every figure."""
    say = console.print
    cores = _usable_cores(args.cores)
    say(f"[bold]data[/]: {args.rows:,} rows in chunks of {args.batch_size}")
    data_dir = ensure_dataset(args.rows, args.batch_size, seed=0)
    result: dict[str, Any] = {
        "machine": _machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.pipeline "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "batch_size": args.batch_size,
        "seconds_per_point": args.seconds,
        "load_average_before": os.getloadavg(),
    }
    say("[bold]scaling[/] (best allocation per core count, against N x one worker)")
    counts = args.core_counts or bench.default_core_counts(len(cores))
    result["scaling"] = bench.scaling(
        data_dir, args.batch_size, cores, args.seconds, args.warmup, say, core_counts=counts
    )
    best = result["scaling"]["rows"][-1]
    allocation, fuse = best["allocation"], best["fuse"]
    say(f"[bold]against DataLoader[/] on {len(cores)} core(s), pipeline at {allocation}")
    result["dataloader"] = bench.against_dataloader(
        data_dir, args.batch_size, cores, allocation, args.seconds, args.warmup, say, fuse
    )
    say("[bold]resize latency[/] (apply() to the new worker's first output)")
    result["resize"] = bench.resize_latency(data_dir, args.batch_size, args.resizes, say)
    say("[bold]sampling cost[/] (metrics() + consumer_stats(), as an agent calls them)")
    pipeline = build_pipeline(data_dir, batch_size=args.batch_size)
    with pipeline:
        stop = threading.Event()
        threading.Thread(target=consume_until, args=(pipeline, stop), daemon=True).start()
        time.sleep(1.0)
        result["sampling"] = bench.sampling_cost(pipeline)
        stop.set()
    result["load_average_after"] = os.getloadavg()
    return result


def render(result: dict[str, Any]) -> str:
    """The ``## Pipeline`` section of docs/benchmarks.md for a result."""
    scaling = result["scaling"]
    loader = result["dataloader"]
    resize = result["resize"]
    lines = [
        "## Pipeline",
        "",
        f"Measured {result['date'][:10]} on {result['machine']}, with "
        f"`{result['command']}` (batches of {result['batch_size']} samples, "
        f"{result['seconds_per_point']:g} s per point). Load average "
        f"{result['load_average_before'][0]:.1f} before, "
        f"{result['load_average_after'][0]:.1f} after (the benchmark itself keeps the cores "
        f"busy). The speed of a shared machine drifts, so every ratio below is of figures "
        f"measured alternately in one run.",
        "",
        f"**Scaling.** The unit is one worker doing the whole preprocessing in one loop on one "
        f"core, in a fresh process set up as the pipeline's workers are (one torch thread, heap "
        f"kept): {scaling['one_worker_samples_per_s']:,.0f} samples/s on average. For each core "
        f"count the benchmark climbs from one worker per stage (adding one to the busiest "
        f"stage) under each layout: `staged` (a process stage per step), `halves` "
        f"(read+parse, transform+collate), `fused` (every step in each worker); then it "
        f"measures the best one again, alternately with one worker, and compares the means.",
        "",
        "| cores | best layout and allocation | samples/s | ideal (N x one worker) "
        "| of ideal | each layout's best in its climb, of ideal |",
        "|---|---|---|---|---|---|",
    ]
    for row in scaling["rows"]:
        alloc = ", ".join(f"{k}={v}" for k, v in row["allocation"].items())
        by_layout = ", ".join(f"{k} {v:.2f}" for k, v in row["of_ideal_by_layout"].items())
        lines.append(
            f"| {row['cores']} | {row['layout']}: {alloc} | {row['samples_per_s']:,.0f} | "
            f"{row['ideal_samples_per_s']:,.0f} | **{row['of_ideal']:.2f}** | {by_layout} |"
        )
    sweep = ", ".join(f"{w}: {r:,.0f}" for w, r in loader["dataloader_sweep"].items())
    lines += [
        "",
        f"**Against DataLoader** ({loader['cores']} cores, same preprocessing functions, "
        f"measured alternately in one run): pipeline at a fixed allocation "
        f"{loader['allocation']} {loader['pipeline_samples_per_s']:,.0f} samples/s; "
        "`torch.utils.data.DataLoader` at its best "
        f"`num_workers={loader['dataloader_num_workers']}` "
        f"{loader['dataloader_samples_per_s']:,.0f} samples/s (sweep, samples/s by num_workers: "
        f"{sweep}). **Ratio {loader['ratio']:.2f}** (target at least 0.9). Both runtimes' "
        f"workers keep their heap (`agents.pipeline.heap`; DataLoader's through "
        f"`worker_init_fn`); DataLoader with the allocator's defaults, as it comes: "
        f"{loader['dataloader_default_heap_samples_per_s']:,.0f} samples/s (ratio "
        f"{loader['ratio_to_default_heap']:.2f}).",
        "",
        f"**Resize latency** (from `apply()` adding a parse worker to that worker's first "
        f"output, {resize['resizes']} resizes): p50 {resize['p50_s'] * 1000:.0f} ms, "
        f"p95 {resize['p95_s'] * 1000:.0f} ms, max {resize['max_s'] * 1000:.0f} ms "
        f"(target p95 under 1 s).",
        "",
        "**What the runtime does for these figures.** Worker processes keep their heap "
        "(`agents.pipeline.heap`: the temporaries of one batch are reused by the next, not "
        "faulted in again), and tensors that are views of one storage cross to the consumer "
        "once (`agents.pipeline.shm`). Fusing neighbouring stages (`agents.pipeline.fusion`, "
        "`intune-agent --fuse`) removes hand-offs between processes, which pays on few cores; "
        "keeping stages apart gives the tuner one lever per stage, which pays where the "
        "stages' needs differ and the host has cores to give.",
        "",
        f"**Sampling cost** (`metrics()` + `consumer_stats()`, what the agent calls each "
        f"interval): {result['sampling']['cpu_ms_per_sample']:.2f} ms of CPU per sample, "
        f"{result['sampling']['core_percent_at_1hz']:.2f}% of one core at 1 Hz. The agent's "
        f"own overhead is in its section.",
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Put ``section`` in place of the file's ``## Pipeline`` section (or append it)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    pattern = re.compile(r"^## Pipeline\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def _print_summary(result: dict[str, Any]) -> None:
    table = Table(title="pipeline benchmarks")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target")
    last = result["scaling"]["rows"][-1]
    table.add_row(
        f"scaling at {last['cores']} cores (of ideal), {last['layout']}",
        f"{last['of_ideal']:.2f}",
        ">= 0.85",
    )
    for layout, share in last["of_ideal_by_layout"].items():
        if layout != last["layout"]:
            table.add_row(f"  {layout} layout", f"{share:.2f}", "")
    table.add_row("pipeline / DataLoader", f"{result['dataloader']['ratio']:.2f}", ">= 0.9")
    table.add_row("resize p95", f"{result['resize']['p95_s'] * 1000:.0f} ms", "< 1000 ms")
    table.add_row(
        "sampling at 1 Hz", f"{result['sampling']['core_percent_at_1hz']:.2f}% core", "< 1%"
    )
    console.print(table)


def _core_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("core counts are whole numbers from 1")
    return counts  # the upper bound depends on --cores: main() checks it


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.pipeline``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pipeline",
        description="Benchmark the DLRM ingestion pipeline: scaling with cores, against "
        "torch's DataLoader, live-resize latency and the cost of sampling its metrics.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="shorter points and fewer resizes (about two minutes on 2 cores)",
    )
    parser.add_argument("--seconds", type=float, help="seconds per measured point (default 6)")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per point (default 2)")
    parser.add_argument("--cores", type=int, help="use at most this many cores (default all)")
    parser.add_argument(
        "--core-counts",
        type=_core_counts,
        help="core counts to measure scaling at, e.g. 1,4,16 (default 1 to 4, then doubling, and all)",
    )
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per batch")
    parser.add_argument("--rows", type=int, help="rows of generated data (default 64 batches)")
    parser.add_argument("--resizes", type=int, help="resizes to time (default 30)")
    parser.add_argument("--json", dest="json_out", help="also write every figure here")
    parser.add_argument(
        "--write-docs",
        nargs="?",
        const="docs/benchmarks.md",
        metavar="PATH",
        help="replace the '## Pipeline' section of this file (default docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    cores = len(_usable_cores(args.cores))
    if args.core_counts and args.core_counts[-1] > cores:
        parser.error(
            f"--core-counts goes up to {args.core_counts[-1]} but this run has {cores} cores"
        )
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 2.0)
    args.resizes = args.resizes or (15 if args.quick else 30)
    args.rows = args.rows or 64 * args.batch_size
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = run(args)
    _print_summary(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    if args.write_docs:
        write_section(Path(args.write_docs), render(result))
        console.print(f"wrote the Pipeline section of {args.write_docs}")
    return 0
