"""The DLRM ingestion pipeline, assembled: dataset on disk -> read -> ... -> prefetch."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# The pipeline's batches are torch tensors, rebuilt from shared memory by the receiving thread.
# Import torch here, in the thread that builds the pipeline and before any worker is forked or
# started: a first import of torch in a worker thread while the main thread forks new workers
# (a live resize) can crash the process.
import torch  # noqa: F401

from agents.dlrm import formats, raw
from agents.dlrm.generate import INDEX_FILE, DatasetSpec, generate, load_index
from agents.dlrm.schema import DEFAULT_TABLE_SIZES, STAGE_NAMES, cache_dir
from agents.dlrm.stages import Prefetch, ReadTask, Transform, chunk_tasks, collate, parse, read
from agents.pipeline import Pipeline, Stage, fuse_groups

log = logging.getLogger(__name__)

DEFAULT_CHUNKS = 32


def ensure_dataset(
    rows: int | None = None, batch_size: int = 4096, seed: int = 0, compress: bool = True
) -> Path:
    """Return the folder of a generated dataset with these parameters, generating it once."""
    rows = rows or DEFAULT_CHUNKS * batch_size
    name = f"criteo-{rows}-{batch_size}-{seed}-{'gz' if compress else 'tsv'}"
    target = cache_dir() / name
    if (target / INDEX_FILE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Generate beside the target and rename, so a concurrent reader never sees half a dataset.
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    log.info("generating a %d-row Criteo-format dataset in %s", rows, target)
    generate(
        scratch, DatasetSpec(rows=rows, rows_per_chunk=batch_size, seed=seed, compress=compress)
    )
    try:
        scratch.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _source(tasks: list[ReadTask], epochs: int | None) -> Iterator[ReadTask]:
    if not tasks:
        return  # cycling over nothing would spin for ever
    passes = itertools.count() if epochs is None else range(epochs)
    for _ in passes:
        yield from tasks


def build_pipeline(
    data_dir: str | Path | None = None,
    batch_size: int = 4096,
    seed: int = 0,
    *,
    epochs: int | None = None,
    workers: dict[str, int] | None = None,
    table_sizes: Sequence[int] | None = None,
    multi_hot: int = 1,
    device: str = "cpu",
    queue_size: int = 4,
    pin_cpus: bool | list[int] = False,
    rows: int | None = None,
    compress: bool = True,
    max_workers: int | None = None,
    fuse: str | Sequence[str] | None = None,
    bad_lines: str = "error",
    storage_options: dict[str, Any] | None = None,
    store_timeouts: raw.StoreTimeouts | None = None,
    data_format: str = "auto",
    columns: formats.Columns | None = None,
    **options: Any,
) -> Pipeline:
    """Build the DLRM ingestion pipeline over a Criteo-format dataset.

    With no ``data_dir`` a seeded dataset (``rows`` lines, default 32 batches) is generated
    once in ``cache_dir()``. A batch is one chunk of the dataset, so ``batch_size`` must match
    the dataset's ``rows_per_chunk``. A ``data_dir`` without our generator's ``index.json``
    is a folder of Criteo files as they come (``.tsv``, ``.txt``, ``.csv``, ``.gz``, ``.bz2``,
    ``.deflate``, ``.zst``, Spark's ``part-00000``: ``agents.dlrm.raw`` lists them): it is indexed once
    in batches of ``batch_size`` lines (``agents.dlrm.raw``, which says what reading them
    costs), and a malformed line stops the pipeline naming the file and line
    (``bad_lines="error"``) or is skipped and counted (``"skip"``; the count is
    ``pipeline.bad_lines.count``). ``data_dir`` may be an object-store URL
    (``s3://bucket/prefix``, ``gs://...``, any fsspec URL), read through fsspec with
    ``storage_options``, every request bounded by ``store_timeouts`` (``raw.StoreTimeouts``:
    connect 10 s, read 30 s, 60 s a request, 4 attempts); its index is kept in the cache folder.
    ``data_dir`` may instead hold TorchRec's npy days (``day_0_dense.npy``, ``_sparse``,
    ``_labels``) or Parquet files (columns ``label``, ``I1``..``I13``, ``C1``..``C26``, or as
    ``columns`` says): the layout is found from the file names, or forced by ``data_format``
    (``raw``, ``npy``, ``parquet``; ``agents.dlrm.formats`` says how each is read and mapped).
    ``epochs=None`` cycles over the data until stopped.
    Stages: read, parse, transform, collate (processes) and prefetch (a thread that hands the
    batch to ``device``). ``fuse`` runs neighbouring stages in one worker
    (``"read+parse+transform+collate"``; see ``agents.pipeline.fusion``); ``workers`` then
    names the fused stage. Extra ``options`` go to ``Pipeline``.
    """
    transform = Transform(tuple(table_sizes or DEFAULT_TABLE_SIZES), multi_hot)
    bad = raw.BadLines(bad_lines)

    read_name, parse_name, transform_name, collate_name, prefetch_name = STAGE_NAMES

    def stages_of(read_fn: Any, parse_fn: Any, read_ceiling: int | None) -> list[Stage]:
        stages = [
            Stage(read_name, read_fn, max_workers=read_ceiling),
            Stage(parse_name, parse_fn, max_workers=max_workers),
            Stage(transform_name, transform, max_workers=max_workers),
            Stage(collate_name, collate, max_workers=max_workers),
            # A thread: it unpacks the batch where the trainer lives and moves it to the device.
            Stage(
                prefetch_name,
                Prefetch(device),
                kind="thread",
                max_workers=min(max_workers or 4, 4),
            ),
        ]
        stages = fuse_groups(stages, fuse)
        names = [s.name for s in stages]
        unknown = sorted(set(workers or {}) - set(names))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; this DLRM pipeline's stages are {names}")
        # replace() runs the stage's own checks on the count.
        return [
            dataclasses.replace(s, workers=(workers or {}).get(s.name, s.workers)) for s in stages
        ]

    # The stages first: a wrong fusion or count is refused before any data is generated or read.
    stages = stages_of(read, parse, max_workers)
    if data_format not in formats.FORMATS:
        raise ValueError(f"data_format={data_format!r}: use one of {', '.join(formats.FORMATS)}")
    chunks = None
    table_chunks = None
    generated = (
        data_dir is not None
        and not raw.is_url(data_dir)
        and (Path(data_dir) / INDEX_FILE).exists()
        and data_format in ("auto", "raw")
    )
    layout = None
    if data_dir is not None and not generated:
        layout = formats.detect_layout(data_dir, data_format, storage_options, store_timeouts)
    if layout in ("npy", "parquet"):
        table_chunks = formats.plan_chunks(
            data_dir, layout, batch_size, columns, storage_options, store_timeouts
        )
        reader = formats.TableReader(columns or formats.Columns(), storage_options, store_timeouts)
        stages = stages_of(reader, formats.TableParse(bad), max_workers)
    elif layout == "raw":
        chunks = raw.load_or_build_index(data_dir, batch_size, storage_options, store_timeouts)
        # Single-member gzip files are inflated in order, by one reader that keeps its place.
        ceiling = 1 if chunks.sequential else max_workers
        if chunks.sequential:
            log.info("%s holds gzip files of one member: one worker reads them", data_dir)
        stages = stages_of(
            raw.RawReader(storage_options=storage_options, store_timeouts=store_timeouts),
            raw.RawParse(bad),
            ceiling,
        )
    if table_chunks is not None:
        tasks: list[Any] = table_chunks
    elif chunks is not None:
        tasks = chunks.chunks
    else:
        if data_dir is None:
            data_dir = ensure_dataset(rows, batch_size, seed, compress)
        index = load_index(data_dir)
        chunk_rows = int(index["spec"]["rows_per_chunk"])
        if chunk_rows != batch_size:
            raise ValueError(
                f"{data_dir} holds chunks of {chunk_rows} rows but batch_size is {batch_size}; "
                f"pass batch_size={chunk_rows} or generate a dataset with --rows-per-chunk "
                f"{batch_size}"
            )
        tasks = chunk_tasks(data_dir, index)
    pipeline = Pipeline(
        lambda: _source(tasks, epochs),
        stages,
        queue_size=queue_size,
        name="dlrm",
        pin_cpus=pin_cpus,
        samples_per_item=batch_size,
        **options,
    )
    pipeline.bad_lines = bad  # how many malformed lines or rows were skipped
    return pipeline
