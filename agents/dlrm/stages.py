"""The DLRM ingestion stages: read, parse, transform, collate, prefetch.

Each is a plain function of one item (a chunk of ``rows_per_chunk`` lines on its way to
becoming a batch), vectorised with numpy, so that the pipeline's worker count per stage is what
decides throughput. Items between stages are dicts of arrays; the runtime moves them between
processes through shared memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.dlrm.schema import DEFAULT_TABLE_SIZES, FIELDS, NUM_DENSE, NUM_SPARSE

_HEX = np.full(256, 255, dtype=np.uint32)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_TAB, _NEWLINE, _MINUS, _ZERO = 9, 10, 45, 48
_MAX_DIGITS = 19


@dataclass(frozen=True)
class ReadTask:
    """Where one chunk lies: a byte range of a shard file."""

    path: str
    offset: int
    length: int
    compressed: bool


def read(task: ReadTask) -> bytes:
    """Read one chunk from disk and decompress it (a gzip member) when needed."""
    with open(task.path, "rb") as handle:
        handle.seek(task.offset)
        data = handle.read(task.length)
    if len(data) != task.length:
        raise ValueError(
            f"{task.path}: expected {task.length} bytes at offset {task.offset}, found "
            f"{len(data)}; the file is shorter than its index says: regenerate the dataset"
        )
    return zlib.decompress(data, 31) if task.compressed else data


def parse(text: bytes) -> dict[str, np.ndarray]:
    """Split Criteo lines into arrays: labels, dense values (NaN: missing), hashes, masks."""
    raw = np.frombuffer(text, dtype=np.uint8)
    if raw.size and raw[-1] != _NEWLINE:
        raw = np.append(raw, np.uint8(_NEWLINE))
    seps = np.flatnonzero((raw == _TAB) | (raw == _NEWLINE))
    rows = seps.size // FIELDS
    line_ends = np.flatnonzero(raw[seps] == _NEWLINE)
    if seps.size != rows * FIELDS or not np.array_equal(
        line_ends, np.arange(FIELDS - 1, seps.size, FIELDS)
    ):
        bad = _first_bad_line(line_ends)
        raise ValueError(f"line {bad}: a Criteo line has {FIELDS} tab-separated fields")
    if rows == 0:
        return {
            "labels": np.zeros(0, np.float32),
            "dense": np.zeros((0, NUM_DENSE), np.float32),
            "sparse": np.zeros((0, NUM_SPARSE), np.uint32),
            "sparse_present": np.zeros((0, NUM_SPARSE), bool),
        }
    starts = np.empty_like(seps)
    starts[0] = 0
    starts[1:] = seps[:-1] + 1
    starts = starts.reshape(rows, FIELDS)
    lengths = seps.reshape(rows, FIELDS) - starts
    padded = np.append(raw, np.zeros(_MAX_DIGITS + 8, dtype=np.uint8))

    label = padded[starts[:, 0]]
    if np.any((lengths[:, 0] != 1) | ((label != _ZERO) & (label != _ZERO + 1))):
        raise ValueError("a label is not 0 or 1")
    labels = (label == _ZERO + 1).astype(np.float32)
    dense = _parse_integers(padded, starts[:, 1 : 1 + NUM_DENSE], lengths[:, 1 : 1 + NUM_DENSE])
    hashes, present = _parse_hex(padded, starts[:, 1 + NUM_DENSE :], lengths[:, 1 + NUM_DENSE :])
    return {"labels": labels, "dense": dense, "sparse": hashes, "sparse_present": present}


def _first_bad_line(line_ends: np.ndarray) -> int:
    fields = np.diff(np.concatenate([[-1], line_ends]))
    wrong = np.flatnonzero(fields != FIELDS)
    return int(wrong[0]) + 1 if wrong.size else int(line_ends.size) + 1


def _parse_integers(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Decimal integers (optionally negative) to float32; empty fields become NaN."""
    negative = (raw[starts] == _MINUS) & (lengths > 0)
    starts = starts + negative
    lengths = lengths - negative
    if np.any(negative & (lengths == 0)):
        raise ValueError("an integer feature is a lone minus sign")
    width = int(lengths.max(initial=0))
    if width > _MAX_DIGITS:
        raise ValueError(f"an integer feature has {width} digits; at most {_MAX_DIGITS} fit")
    if width == 0:
        return np.full(starts.shape, np.nan, dtype=np.float32)
    position = np.arange(width)
    digits = raw[starts[..., None] + position].astype(np.int64) - _ZERO
    exponent = lengths[..., None] - 1 - position
    valid = exponent >= 0
    if np.any(valid & ((digits < 0) | (digits > 9))):
        raise ValueError("an integer feature holds a character that is not a digit")
    # 19 digits may pass int64's largest (9.2e18) and wrap round to a negative: in float64.
    ten = 10 if width < _MAX_DIGITS else 10.0
    values = np.where(valid, digits * ten ** np.maximum(exponent, 0), 0).sum(axis=-1)
    values = np.where(negative, -values, values).astype(np.float32)
    values[lengths == 0] = np.nan
    return values


def _parse_hex(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple:
    """Categorical hashes of up to 8 hex digits (Criteo's are 8; fewer read as their value,
    as a Parquet file's do) to uint32, and a mask of the fields present."""
    present = lengths > 0
    if np.any(lengths > 8):
        raise ValueError("a categorical feature has more than 8 hex digits")
    if np.any(present & (lengths < 8)):
        # The 8 bytes that end where the value ends; those before its start are leading zeros.
        at = (starts + lengths)[..., None] - 8 + np.arange(8)
        nibbles = _HEX[raw[np.maximum(at, 0)]]
        nibbles[at < starts[..., None]] = 0
    else:
        nibbles = _HEX[raw[starts[..., None] + np.arange(8)]]
    if np.any(present[..., None] & (nibbles > 15)):
        raise ValueError("a categorical feature holds a character that is not a hex digit")
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    hashes = np.bitwise_or.reduce(nibbles << shifts, axis=-1).astype(np.uint32)
    hashes[~present] = 0
    return hashes, present


@dataclass(frozen=True)
class Transform:
    """Fill missing values, ``log(x + 3)`` the dense features, hash categoricals into tables.

    ``multi_hot`` > 1 turns each categorical value into that many ids (a bag per table), derived
    from the value's hash, as the MLPerf DLRM-v2 benchmark synthesises multi-hot features.
    """

    table_sizes: Sequence[int] = tuple(DEFAULT_TABLE_SIZES)
    multi_hot: int = 1

    def __call__(self, parsed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Turn parsed arrays into model inputs: dense float32 and per-table int64 ids."""
        dense = np.nan_to_num(parsed["dense"], nan=0.0)
        # Criteo's I2 goes down to -3; clamp so the log stays defined.
        dense = np.log(np.maximum(dense, -2.0) + 3.0).astype(np.float32)
        hashes = parsed["sparse"].astype(np.int64)
        sizes = np.asarray(self.table_sizes, dtype=np.int64)
        if sizes.size != NUM_SPARSE:
            raise ValueError(f"need {NUM_SPARSE} table sizes, got {sizes.size}")
        if self.multi_hot > 1:
            salt = np.arange(self.multi_hot, dtype=np.int64) * 0x9E3779B1
            ids = (hashes[..., None] ^ salt) * 2654435761 % (1 << 32)
            ids = ids % sizes[None, :, None]
        else:
            ids = (hashes % sizes)[..., None]
        return {"labels": parsed["labels"], "dense": dense, "ids": ids}


def collate(transformed: dict[str, np.ndarray]) -> dict[str, Any]:
    """Make the batch the trainer takes: torch tensors, sparse as values and offsets per table.

    ``{"dense": float32 (B, 13), "labels": float32 (B,), "sparse_values": [int64] * 26,
    "sparse_offsets": [int64 (B,)] * 26}``: the inputs of ``nn.EmbeddingBag`` per table.
    """
    import torch

    ids = transformed["ids"]  # (B, tables, hot)
    rows, tables, hot = ids.shape
    offsets = torch.arange(0, rows * hot, hot, dtype=torch.int64)
    per_table = np.ascontiguousarray(ids.transpose(1, 0, 2)).reshape(tables, rows * hot)
    values = torch.from_numpy(per_table)
    return {
        "dense": torch.from_numpy(np.ascontiguousarray(transformed["dense"])),
        "labels": torch.from_numpy(np.ascontiguousarray(transformed["labels"])),
        "sparse_values": list(values.unbind(0)),
        "sparse_offsets": [offsets] * tables,
    }


@dataclass(frozen=True)
class Prefetch:
    """Hand a batch over to the trainer's device: pinned memory and an async copy on CUDA."""

    device: str = "cpu"

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Return the batch on ``device`` (unchanged on the CPU)."""
        if self.device == "cpu":
            return batch

        def move(t: Any) -> Any:
            return t.pin_memory().to(self.device, non_blocking=True)

        return {
            k: [move(t) for t in v] if isinstance(v, list) else move(v) for k, v in batch.items()
        }


def batch_rows(batch: dict[str, Any]) -> int:
    """The number of samples in a collated batch."""
    return int(batch["labels"].shape[0])


def chunk_tasks(data_dir: str | Path, index: dict) -> list[ReadTask]:
    """The read tasks of every chunk of a dataset, in index order."""
    compressed = bool(index["spec"]["compress"])
    root = Path(data_dir)
    return [
        ReadTask(str(root / name), offset, length, compressed)
        for name, offset, length, _rows in index["chunks"]
    ]
