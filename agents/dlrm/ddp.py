"""Train DLRM with DDP, one training process per rank, every rank's pipeline tuned as one host.

Run it under torchrun; each rank builds the DLRM ingestion pipeline, wraps the model in
``DistributedDataParallel`` and attaches its pipeline to the host's one agent (``agents.attach``
reads ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; the identity comes from ``INTUNE_URL``,
``INTUNE_HOST_ID`` and ``INTUNE_AGENT_TOKEN``, as for a single process)::

    INTUNE_URL=http://intune:8000 INTUNE_HOST_ID=3 INTUNE_AGENT_TOKEN=ia_... \\
        torchrun --nproc-per-node 2 -m agents.dlrm.ddp --seconds 600

Register the host with ``"ranks": 2`` (``POST /api/v1/jobs/{id}/hosts/``) so that its default
budget holds one worker per stage of each rank. The ranks stop together (every step they agree
by an all-reduce whether to go on), after ``--seconds`` or once ``--stop-file`` exists;
``--report`` writes each rank's figures as JSON (``report-rank<N>.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from agents.dlrm.model import ModelConfig
from agents.dlrm.trainer import Trainer
from agents.dlrm.workload import build_pipeline
from agents.logs import configure_logging

log = logging.getLogger("agents.dlrm.ddp")


def build_parser() -> argparse.ArgumentParser:
    """The command line (each rank parses the same)."""
    p = argparse.ArgumentParser(prog="python -m agents.dlrm.ddp", description=__doc__)
    p.add_argument("--seconds", type=float, default=60.0, help="train this long (default 60)")
    p.add_argument("--stop-file", type=Path, default=None, help="stop once this file exists")
    p.add_argument("--batch-size", type=int, default=1024, help="rows per batch (default 1024)")
    p.add_argument("--rows", type=int, default=None, help="rows of the generated dataset")
    p.add_argument("--data-dir", default=None, help="a Criteo folder instead of generated data")
    p.add_argument(
        "--workers",
        default=None,
        help="starting workers per stage and rank, e.g. parse=2,transform=2 (default one each)",
    )
    p.add_argument(
        "--no-agent",
        action="store_true",
        help="train without the agent: the allocation stays the starting one (a baseline)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="agent's seconds per sample")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds not counted in the report")
    p.add_argument("--report", type=Path, default=None, help="folder for report-rank<N>.json")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (default gloo)")
    p.add_argument("--log-level", default="INFO")
    return p


def parse_workers(spec: str | None) -> dict[str, int] | None:
    """``parse=2,transform=3`` -> ``{"parse": 2, "transform": 3}``."""
    if not spec:
        return None
    workers = {}
    for part in spec.split(","):
        name, _, count = part.partition("=")
        if not name or not count.isdigit():
            raise SystemExit(f"--workers {spec!r}: write stage=count pairs, e.g. parse=2,collate=1")
        workers[name.strip()] = int(count)
    return workers


def _agree_to_stop(stop: bool) -> bool:
    """Whether any rank wants to stop: DDP needs every rank to take the same steps."""
    flag = torch.tensor([1 if stop else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def reduce_sparse_gradients(tables: list[torch.Tensor]) -> None:
    """Average the embedding tables' sparse gradients over the ranks, as DDP averages the dense
    ones: every rank's rows and values gathered, divided by the world size.

    DDP reduces a sparse gradient with gloo's sparse all-reduce, one per table, on gloo's
    worker thread. Under CPU load that path corrupted the heap of a rank process (SIGSEGV and
    SIGABRT in the gloo thread, 4 of 17 runs of this entry beside two busy loops, in
    ``AsyncSparseAllreduceWork``'s coalesce and in the allocations of the next all-reduce).
    Here one dense all-gather of sizes and two of padded rows and values carry the same
    figures; the tables are left out of DDP (``_set_params_and_buffers_to_ignore_for_model``).
    """
    world = dist.get_world_size()
    grads = [t.grad for t in tables]
    if any(g is not None and not g.is_sparse for g in grads):
        raise ValueError("reduce_sparse_gradients takes tables with sparse gradients only")
    dim = tables[0].shape[1]
    rows = [g._indices()[0] if g is not None else torch.empty(0, dtype=torch.int64) for g in grads]
    values = [g._values() if g is not None else torch.empty(0, dim) for g in grads]
    counts = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
    every_count = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(every_count, counts)
    totals = [int(c.sum()) for c in every_count]
    longest = max(totals)
    mine = torch.zeros(longest, dtype=torch.int64)
    mine_values = torch.zeros(longest, dim, dtype=values[0].dtype)
    mine[: totals[dist.get_rank()]] = torch.cat(rows)
    mine_values[: totals[dist.get_rank()]] = torch.cat(values)
    every_row = [torch.empty_like(mine) for _ in range(world)]
    every_value = [torch.empty_like(mine_values) for _ in range(world)]
    dist.all_gather(every_row, mine)
    dist.all_gather(every_value, mine_values)
    for t, table in enumerate(tables):
        parts_rows, parts_values = [], []
        for r in range(world):
            start = int(every_count[r][:t].sum())
            end = start + int(every_count[r][t])
            parts_rows.append(every_row[r][start:end])
            parts_values.append(every_value[r][start:end])
        index = torch.cat(parts_rows).unsqueeze(0)
        table.grad = torch.sparse_coo_tensor(
            index, torch.cat(parts_values) / world, table.shape, check_invariants=True
        ).coalesce()


def main(argv: list[str] | None = None) -> int:
    """Train on this rank until the ranks agree to stop; return the exit status."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Each rank computes on its own share of the CPUs; the pipelines' workers take the rest.
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    pipeline = build_pipeline(
        args.data_dir,
        batch_size=args.batch_size,
        rows=args.rows,
        workers=parse_workers(args.workers),
    )
    pipeline.start()
    trainer = Trainer(ModelConfig(), device="cpu")
    tables = [table.weight for table in trainer.model.tables]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        trainer.model, [f"tables.{i}.weight" for i in range(len(tables))]
    )
    trainer.model = DistributedDataParallel(trainer.model)
    trainer.after_backward = lambda: reduce_sparse_gradients(tables)
    attached: Any = None
    if not args.no_agent:
        from agents import attach

        attached = attach(pipeline, trainer_stats=trainer.stats, interval_s=args.interval)
    batches = iter(pipeline)
    started = time.monotonic()
    deadline = started + args.seconds
    counted_from = started + args.warmup
    samples_at_warmup = None
    allocations: list[dict] = []
    try:
        while not _agree_to_stop(
            time.monotonic() >= deadline or (args.stop_file is not None and args.stop_file.exists())
        ):
            if samples_at_warmup is None and time.monotonic() >= counted_from:
                samples_at_warmup = (trainer.samples, time.monotonic())
            if trainer.run(batches, threading.Event(), max_steps=1) == 0:
                break
            allocation = dict(pipeline.allocation)
            if not allocations or allocations[-1]["workers"] != allocation:
                allocations.append(
                    {"at_s": round(time.monotonic() - started, 2), "workers": allocation}
                )
        ended = time.monotonic()
        base_samples, base_at = samples_at_warmup or (0, started)
        report = {
            "rank": rank,
            "local_rank": local_rank,
            "steps": trainer.steps,
            "samples": trainer.samples,
            "seconds": round(ended - started, 3),
            "samples_per_s": (trainer.samples - base_samples) / max(ended - base_at, 1e-9),
            "allocations": allocations,
            "final_allocation": dict(pipeline.allocation),
            "hosted_agent": bool(attached is not None and attached.agent is not None),
            "applied_total": attached.applied_total if attached is not None else 0,
            "last_loss": trainer.last_loss,
        }
        log.info("rank %d done: %s", rank, report)
        if args.report is not None:
            args.report.mkdir(parents=True, exist_ok=True)
            path = args.report / f"report-rank{rank}.json"
            path.write_text(json.dumps(report, indent=2))
    finally:
        if attached is not None:
            attached.stop()
        pipeline.stop()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
