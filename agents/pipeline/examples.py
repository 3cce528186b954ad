"""Small pipelines for tests, demos and ``--pipeline agents.pipeline.examples:counting``."""

from __future__ import annotations

import functools
import multiprocessing
import time
import zlib
from dataclasses import dataclass
from typing import Any

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


# ----------------------------------------------------------------------------- contended compress


def make_block(key: int, kb: int = 64) -> bytes:
    """A block of ``kb`` kilobytes of log-like text made from ``key`` (compresses about 4:1)."""
    line = f"{key:08d} GET /objects/{key % 7919:05d} 200 {key * 2654435761 % 10**9:09d}\n"
    data = line.encode() * (kb * 1024 // len(line) + 1)
    return data[: kb * 1024]


@dataclass(frozen=True)
class ContendedCompress:
    """Compress a block, the first ``serial`` part of it while holding a lock that every worker
    of the stage shares (a shared dictionary or cache being updated): the stage's throughput
    grows sublinearly with its workers, as Amdahl's law says, although each worker computes."""

    lock: Any
    serial: float = 0.4
    level: int = 6
    lock_timeout_s: float = 30.0

    def __call__(self, block: bytes) -> bytes:
        """The block compressed in two parts, the first under the shared lock.

        Raises ``TimeoutError`` when the lock is not free within ``lock_timeout_s``: a
        ``multiprocessing`` lock stays held when the worker holding it is killed (the OOM
        killer, a stop past its grace), and every other worker of the stage would wait for it
        forever; the stage fails instead."""
        cut = int(len(block) * self.serial)
        if not self.lock.acquire(timeout=self.lock_timeout_s):
            raise TimeoutError(
                f"the compress stage's shared lock was not free within {self.lock_timeout_s:g} s:"
                " a worker killed while holding it leaves it held; restart the pipeline"
            )
        try:
            head = zlib.compress(block[:cut], self.level)
        finally:
            self.lock.release()
        return head + zlib.compress(block[cut:], self.level)


def checksum(packed: bytes) -> tuple[int, int]:
    """A small record of the compressed block: its CRC-32 and size (light CPU)."""
    return zlib.crc32(packed), len(packed)


def contended_compress(
    n: int | None = None, kb: int = 64, serial: float = 0.4, level: int = 6, queue_size: int = 8
) -> Pipeline:
    """A CPU-heavy stage that scales sublinearly: ``make`` builds 64 kB blocks (a thread),
    ``compress`` compresses them in processes that hold one shared lock for ``serial`` of each
    block, ``checksum`` reduces them (a process).

    A model that takes a stage's rate as linear in its workers (rate per busy worker times
    workers) overestimates what a second ``compress`` worker gives: the shape where a tuner has
    to measure rather than predict.
    """
    if not 0.0 <= serial <= 1.0:
        raise ValueError(f"serial is the locked fraction of each block, 0 to 1; got {serial}")
    source = range(n) if n is not None else _endless
    lock = multiprocessing.get_context("fork").Lock()  # inherited by the forked workers
    return Pipeline(
        source,
        [
            Stage("make", functools.partial(make_block, kb=kb), kind="thread", max_workers=4),
            Stage("compress", ContendedCompress(lock, serial, level), max_workers=16),
            Stage("checksum", checksum, max_workers=16),
        ],
        queue_size=queue_size,
        name="contended-compress",
    )
