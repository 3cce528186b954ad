"""The same Criteo rows as raw TSV, TorchRec npy days and Parquet: rows/s of each layout.

``python -m benchmarks.data_layouts [--rows 200000] [--days 2] [--row-group 65536]
[--rounds 3] [--json OUT]``

Writes ``--rows`` random Criteo rows (5% of values missing; each categorical feature drawn
from a vocabulary of Criteo's size capped at 50,000, skewed) in ``--days`` files of each layout
into a scratch folder: plain ``.tsv``; TorchRec's npy (``log(x + 3)`` dense float32, int32
sparse, int32 labels, as ``BinaryCriteoUtils`` writes them); Parquet (hex-string categorical
columns, nullable int64 dense, ``--row-group`` rows a row group, snappy). Then measures, for
each layout, alternately, ``--rounds`` times (the median is kept):

- ``read+parse``: every chunk of ``BATCH`` rows read and parsed in this process, in order:
  one worker's rate (the raw layout's index is built before, not timed);
- ``pipeline``: one epoch of the DLRM pipeline (``build_pipeline``, default workers).

The writers (``criteo_rows``, ``write_tsv``, ``write_npy``, ``write_parquet``) are also what
the tests use to write one set of rows in every layout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.dlrm import formats, raw
from agents.dlrm.schema import DEFAULT_TABLE_SIZES, NUM_DENSE, NUM_SPARSE
from agents.dlrm.workload import build_pipeline

BATCH = 4096


@dataclass
class CriteoRows:
    """Criteo rows as arrays: labels 0/1, integer counts, 32-bit hashes, and what is missing."""

    labels: np.ndarray  # int64 (N,)
    dense: np.ndarray  # int64 (N, 13)
    dense_missing: np.ndarray  # bool (N, 13)
    sparse: np.ndarray  # uint32 (N, 26)
    sparse_missing: np.ndarray  # bool (N, 26)

    def __len__(self) -> int:
        return int(self.labels.size)

    def part(self, start: int, stop: int) -> CriteoRows:
        """Rows ``start`` to ``stop``."""
        return CriteoRows(*(a[start:stop] for a in vars(self).values()))


def criteo_rows(
    n: int,
    seed: int,
    missing: float = 0.05,
    largest: int = 100_000,
    vocabularies: list[int] | None = None,
) -> CriteoRows:
    """``n`` random rows: counts from -3 to ``largest``, a share ``missing`` of values absent;
    each categorical feature any 32-bit hash, or, with ``vocabularies``, one of that many
    hashes of its own, drawn with a Zipf-like skew as Criteo's are (few values most often)."""
    rng = np.random.default_rng(seed)
    if vocabularies is None:
        sparse = rng.integers(0, 1 << 32, (n, NUM_SPARSE), dtype=np.uint64).astype(np.uint32)
    else:
        sparse = np.empty((n, NUM_SPARSE), dtype=np.uint32)
        for i, size in enumerate(vocabularies):
            words = rng.integers(0, 1 << 32, size, dtype=np.uint64).astype(np.uint32)
            rank = np.minimum(rng.zipf(1.2, n), size) - 1
            sparse[:, i] = words[rank]
    return CriteoRows(
        rng.integers(0, 2, n),
        rng.integers(-3, largest, (n, NUM_DENSE)),
        rng.random((n, NUM_DENSE)) < missing,
        sparse,
        rng.random((n, NUM_SPARSE)) < missing,
    )


def tsv_text(rows: CriteoRows) -> bytes:
    """Criteo's text: a tab-separated line per row, missing values empty."""
    lines = []
    for i in range(len(rows)):
        dense = ["" if m else str(v) for v, m in zip(rows.dense[i], rows.dense_missing[i],
                                                    strict=True)]  # fmt: skip
        sparse = ["" if m else f"{v:08x}" for v, m in zip(rows.sparse[i], rows.sparse_missing[i],
                                                         strict=True)]  # fmt: skip
        lines.append("\t".join([str(rows.labels[i]), *dense, *sparse]))
    return "".join(line + "\n" for line in lines).encode()


def write_tsv(folder: Path, name: str, rows: CriteoRows) -> None:
    """``folder/name``: the rows as Criteo text."""
    (folder / name).write_bytes(tsv_text(rows))


def write_npy(
    folder: Path,
    day: str,
    rows: CriteoRows,
    sparse_dtype: str = "int32",
    logged: bool = True,
    flat_labels: bool = False,
) -> None:
    """``{day}_dense.npy``, ``_sparse.npy``, ``_labels.npy`` as TorchRec's
    ``BinaryCriteoUtils.tsv_to_npys`` writes them: missing values 0, dense ``log(x + 3)`` in
    float32 (``logged=False``: the counts, int32), sparse hashes as ``sparse_dtype`` (an int32
    holds those of 2**31 and up as negatives), labels int32 (N, 1) (``flat_labels``: (N,))."""
    dense = np.where(rows.dense_missing, 0, rows.dense).astype(np.int64)
    if logged:
        with np.errstate(divide="ignore"):
            dense = np.log((dense + 3).astype(np.float32), dtype=np.float32)
    else:
        dense = dense.astype(np.int32)
    sparse = np.where(rows.sparse_missing, 0, rows.sparse).astype(np.int64)
    labels = rows.labels.astype(np.int32)
    np.save(folder / f"{day}_dense.npy", dense)
    np.save(folder / f"{day}_sparse.npy", sparse.astype(sparse_dtype))
    np.save(folder / f"{day}_labels.npy", labels if flat_labels else labels.reshape(-1, 1))


def parquet_table(rows: CriteoRows, dense_type: str = "int64", sparse_type: str = "hex"):  # noqa: ANN201
    """The rows as an Arrow table of Criteo's columns: nulls where missing, the categorical
    features as 8-digit hex strings (``sparse_type="hex"``) or int64 hashes (``"int"``)."""
    import pyarrow as pa

    data = {"label": pa.array(rows.labels, pa.int64())}
    for i in range(NUM_DENSE):
        data[f"I{i + 1}"] = pa.array(rows.dense[:, i], mask=rows.dense_missing[:, i]).cast(
            dense_type
        )
    for i in range(NUM_SPARSE):
        values = rows.sparse[:, i]
        if sparse_type == "hex":
            column = pa.array([f"{v:08x}" for v in values.tolist()], pa.string(),
                              mask=rows.sparse_missing[:, i])  # fmt: skip
        else:
            column = pa.array(values.astype(np.int64), mask=rows.sparse_missing[:, i])
        data[f"C{i + 1}"] = column
    return pa.table(data)


def write_parquet(path: Path, rows: CriteoRows, row_group: int, **kinds: str) -> None:
    """One Parquet file of the rows, ``row_group`` rows a row group."""
    import pyarrow.parquet as pq

    pq.write_table(parquet_table(rows, **kinds), path, row_group_size=max(row_group, 1))


def write_layouts(root: Path, rows: CriteoRows, days: int, row_group: int) -> dict[str, Path]:
    """The rows in ``days`` files of each layout, under ``root/{tsv,npy,parquet}``."""
    folders = {name: root / name for name in ("tsv", "npy", "parquet")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    edges = np.linspace(0, len(rows), days + 1).astype(int)
    for day in range(days):
        part = rows.part(edges[day], edges[day + 1])
        write_tsv(folders["tsv"], f"day_{day}.tsv", part)
        write_npy(folders["npy"], f"day_{day}", part)
        write_parquet(folders["parquet"] / f"day_{day}.parquet", part, row_group)
    return folders


def measure(folder: Path) -> dict[str, float]:
    chunks, reader, parser = formats.read_and_parse_stages(folder, BATCH)
    rows = 0
    started = time.perf_counter()
    for chunk in chunks:
        rows += parser(reader(chunk))["labels"].size
    read = time.perf_counter() - started
    started = time.perf_counter()
    seen = 0
    with build_pipeline(folder, batch_size=BATCH, epochs=1) as pipe:
        for batch in pipe:
            seen += int(batch["labels"].shape[0])
    epoch = time.perf_counter() - started
    assert seen == rows, (seen, rows)
    return {"read_rows_per_s": rows / read, "pipeline_rows_per_s": rows / epoch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows in all")
    parser.add_argument("--days", type=int, default=2, help="files (days) per layout")
    parser.add_argument("--row-group", type=int, default=65_536, help="Parquet rows a group")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="data-layouts-bench-"))
    os.environ["INTUNE_CACHE"] = str(work / "cache")
    try:
        # Criteo's vocabularies, capped as the workload's tables are.
        rows = criteo_rows(args.rows, 1, vocabularies=DEFAULT_TABLE_SIZES)
        folders = write_layouts(work, rows, args.days, args.row_group)
        sizes = {
            name: sum(p.stat().st_size for p in folder.iterdir() if not p.name.startswith("."))
            for name, folder in folders.items()
        }
        raw.load_or_build_index(folders["tsv"], BATCH)  # the raw index, once (not timed)
        figures: dict[str, list[dict[str, float]]] = {name: [] for name in folders}
        names = list(folders)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                figures[name].append(measure(folders[name]))
                print(f"round {round_ + 1} {name}: {figures[name][-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in figures.items()
    }
    print(f"\n{args.rows} rows in {args.days} files a layout; batch {BATCH}; Parquet row groups "
          f"of {args.row_group}; median of {args.rounds}; bytes {sizes}")  # fmt: skip
    print(f"{'layout':<8} {'read+parse rows/s':>18} {'pipeline rows/s':>16}")
    for name, m in medians.items():
        print(f"{name:<8} {m['read_rows_per_s']:>18,.0f} {m['pipeline_rows_per_s']:>16,.0f}")
    if args.json:
        args.json.write_text(json.dumps({"medians": medians, "runs": figures, "sizes": sizes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
