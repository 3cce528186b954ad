"""The shape of Criteo-format data, and the embedding table sizes the workload hashes into."""

from __future__ import annotations

import os
from pathlib import Path

NUM_DENSE = 13
NUM_SPARSE = 26
FIELDS = 1 + NUM_DENSE + NUM_SPARSE  # label, I1..I13, C1..C26

# Distinct values of C1..C26 in the Criteo Kaggle display-advertising logs.
CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip

# Embedding rows per table: the Criteo cardinality, capped so the model fits a small host.
TABLE_SIZE_CAP = 50_000
DEFAULT_TABLE_SIZES = [min(c, TABLE_SIZE_CAP) for c in CRITEO_CARDINALITIES]

# The stages of the DLRM ingestion pipeline, in order: the one list the workload builds its
# stages from, and the web app's demo job and the tests register.
STAGE_NAMES = ["read", "parse", "transform", "collate", "prefetch"]


def cache_dir() -> Path:
    """Where generated datasets (and indexes of read-only raw folders) are kept:
    ``$INTUNE_CACHE`` or ``~/.cache/intune``."""
    return Path(os.environ.get("INTUNE_CACHE", Path.home() / ".cache" / "intune"))
