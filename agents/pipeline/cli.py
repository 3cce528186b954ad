"""``python -m agents.pipeline run``: run a pipeline at a fixed allocation and measure it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agents.pipeline.consume import consume_until
from agents.pipeline.errors import AllocationError
from agents.pipeline.loading import build, parse_allocation, parse_options
from agents.pipeline.pipeline import Pipeline

log = logging.getLogger("agents.pipeline")


def measure(
    pipeline: Pipeline,
    seconds: float,
    warmup: float = 2.0,
    train: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Consume a started pipeline for ``warmup + seconds`` and return what it did meanwhile.

    With ``train`` the DLRM trainer consumes the batches; otherwise they are discarded.
    """
    trainer = None
    if train:
        from agents.dlrm.trainer import Trainer

        trainer = Trainer()
    stop = threading.Event()
    consumed = [0]

    def consume() -> None:
        if trainer is not None:
            trainer.run(pipeline, stop)
            return

        def count(_item) -> None:
            consumed[0] += 1

        consume_until(pipeline, stop, count)

    consumer = threading.Thread(target=consume, name="consumer", daemon=True)
    consumer.start()
    _wait(warmup, "warming up", progress)
    pipeline.metrics()
    pipeline.consumer_stats()
    if trainer is not None:
        trainer.stats()
    began, before = time.monotonic(), consumed[0]
    _wait(seconds, "measuring", progress)
    elapsed = time.monotonic() - began
    stages = pipeline.metrics()
    consumer_stats = pipeline.consumer_stats()
    stop.set()
    consumer.join(timeout=10)
    for stage in stages:
        stage["samples_per_s"] = stage["items_per_s"] * pipeline.samples_per_item
    result = {
        "pipeline": pipeline.name,
        "allocation": pipeline.allocation,
        "seconds": elapsed,
        "samples_per_item": pipeline.samples_per_item,
        "samples_per_s": consumer_stats["throughput"],
        "items_per_s": consumer_stats["throughput"] / pipeline.samples_per_item,
        "consumer": consumer_stats,
        "stages": stages,
    }
    if trainer is not None:
        result["trainer"] = trainer.stats()
        result["trainer"]["loss"] = trainer.last_loss
    if trainer is None:
        result["items_consumed"] = consumed[0] - before
    return result


def _wait(seconds: float, label: str, progress: bool) -> None:
    if seconds <= 0:
        return
    if not progress or not sys.stderr.isatty():
        time.sleep(seconds)
        return
    from tqdm import tqdm

    steps = max(1, int(seconds * 10))
    for _ in tqdm(
        range(steps), desc=label, unit="", leave=False, bar_format="{desc} {bar} {elapsed}"
    ):
        time.sleep(seconds / steps)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m agents.pipeline``."""
    parser = argparse.ArgumentParser(
        prog="python -m agents.pipeline",
        description="Run a live-resizable ingestion pipeline and measure it.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run a pipeline at a fixed allocation; write samples/s overall and per stage",
        description="Run a pipeline at a fixed allocation for some seconds and write its "
        "throughput (samples/s overall and per stage) and per-stage measurements as JSON.",
    )
    run.add_argument(
        "--pipeline",
        default="dlrm",
        help="'dlrm' (built in) or 'module:factory' returning a Pipeline",
    )
    run.add_argument(
        "--allocation",
        default="",
        help="workers per stage, e.g. read=1,parse=3,transform=1 (others keep theirs)",
    )
    run.add_argument("--seconds", type=float, default=10.0, help="how long to measure (s)")
    run.add_argument("--warmup", type=float, default=2.0, help="seconds to run before measuring")
    run.add_argument("--json", dest="json_out", help="write the result here (default: stdout)")
    run.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword for the factory, JSON-decoded (e.g. batch_size=2048); repeat",
    )
    run.add_argument("--pin", action="store_true", help="pin each stage's workers to its own cores")
    run.add_argument(
        "--train",
        action="store_true",
        help="consume with the DLRM trainer (dlrm only) instead of discarding",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="log more")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        allocation = parse_allocation(args.allocation)
        options = parse_options(args.option)
        if args.pin:
            options["pin_cpus"] = True
        pipeline = build(args.pipeline, **options)
        pipeline.apply(allocation)
    except (AllocationError, ValueError, TypeError) as exc:
        parser.error(str(exc))
    log.info(
        "running %s at %s for %.0f s (+%.0f s warm-up)",
        pipeline.name,
        pipeline.allocation,
        args.seconds,
        args.warmup,
    )
    with pipeline:
        result = measure(pipeline, args.seconds, args.warmup, train=args.train)
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
        log.info("%.0f samples/s; wrote %s", result["samples_per_s"], args.json_out)
    else:
        print(text)
    return 0
