"""Small pipelines for tests, demos and ``--pipeline agents.pipeline.examples:counting``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from agents.pipeline.pipeline import Pipeline
from agents.pipeline.stage import Stage


@dataclass(frozen=True)
class Work:
    """A stage function that spends ``ms`` milliseconds (sleeping or spinning) and adds one."""

    ms: float = 0.0
    spin: bool = False

    def __call__(self, item: int) -> int:
        """Return ``item + 1`` after the configured delay."""
        if self.ms > 0:
            if self.spin:
                end = time.perf_counter() + self.ms / 1000.0
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(self.ms / 1000.0)
        return item + 1


def counting(
    n: int | None = None,
    stages: int = 3,
    work_ms: float = 0.0,
    spin: bool = False,
    kind: str = "process",
    queue_size: int = 8,
    ordered: bool = True,
) -> Pipeline:
    """Numbers 0.. (``n`` of them, or endless) through ``stages`` stages that each add one.

    The consumer receives ``i + stages`` for every ``i``: easy to check for loss, duplicates
    and order.
    """
    source = range(n) if n is not None else _endless
    return Pipeline(
        source,
        [
            Stage(f"s{i}", Work(work_ms, spin), kind=kind, ordered=ordered, max_workers=16)
            for i in range(stages)
        ],
        queue_size=queue_size,
        name="counting",
    )


def _endless():
    i = 0
    while True:
        yield i
        i += 1


# ----------------------------------------------------------------------------- object store


@dataclass(frozen=True)
class ObjectStoreGet:
    """Fetch one record: wait ``latency_ms`` as a GET from an object store does (the CPU
    idles meanwhile), then return ``kb`` kilobytes of text made from the item's number."""

    latency_ms: float = 25.0
    kb: int = 40

    def __call__(self, key: int) -> bytes:
        """The record stored under ``key``."""
        time.sleep(self.latency_ms / 1000.0)
        word = f"record{key % 9973:04d} lorem ipsum dolor sit amet ".encode()
        return (word * (self.kb * 1024 // len(word) + 1))[: self.kb * 1024]


def decode_text(record: bytes) -> str:
    """Decode the record (CPU: a pass over every byte)."""
    return record.decode("utf-8").lower()


def tokenize_text(text: str) -> list[str]:
    """Split into words, as a tokenizer's pre-pass does (CPU)."""
    return [w.strip(".,") for w in text.split()]


def pack_tokens(tokens: list[str]) -> list[int]:
    """Hash each token to an id in a 2**18 vocabulary (CPU); a 10-60 kB list travels on."""
    return [hash(t) % 262144 for t in tokens[:4096]]


def object_store_text(
    n: int | None = None,
    latency_ms: float = 25.0,
    kb: int = 40,
    fetch_workers: int = 1,
    queue_size: int = 8,
    max_fetch_workers: int = 64,
) -> Pipeline:
    """An I/O-bound pipeline: a thread stage that waits on an object store, then three
    CPU-bound text stages in processes whose items (10-60 kB) travel by pickle.

    ``fetch`` needs many threads (each mostly waits) but little CPU; the text stages need
    CPU. It is the shape that used to hang the runtime and that a budget counting every
    worker as a CPU starves.
    """
    source = range(n) if n is not None else _endless
    return Pipeline(
        source,
        [
            Stage(
                "fetch",
                ObjectStoreGet(latency_ms, kb),
                workers=fetch_workers,
                kind="thread",
                max_workers=max_fetch_workers,
            ),
            Stage("decode", decode_text, max_workers=16),
            Stage("tokenize", tokenize_text, max_workers=16),
            Stage("pack", pack_tokens, max_workers=16),
        ],
        queue_size=queue_size,
        name="object-store-text",
    )
