"""The sublinear example pipeline (``agents.pipeline.examples:contended_compress``) delivers every
block once, in order, compressed in two parts that decompress to the block, with its ``compress``
workers sharing one lock (at two workers, as the shoot-out runs it)."""

import zlib

import pytest

from agents.pipeline.examples import ContendedCompress, checksum, contended_compress, make_block


def test_every_block_arrives_once_in_order_and_compressed_right():
    blocks = 24
    pipeline = contended_compress(n=blocks, kb=16, serial=0.5)
    pipeline.apply({"make": 2, "compress": 2, "checksum": 1})
    with pipeline:
        out = list(pipeline)
    assert len(out) == blocks
    for key, (crc, size) in enumerate(out):
        block = make_block(key, kb=16)
        cut = len(block) // 2
        packed = zlib.compress(block[:cut], 6) + zlib.compress(block[cut:], 6)
        assert (crc, size) == checksum(packed)
        head = zlib.decompressobj()
        assert head.decompress(packed) + zlib.decompress(head.unused_data) == block


def test_a_serial_fraction_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="serial is the locked fraction"):
        contended_compress(serial=1.5)


def test_a_lock_left_held_by_a_killed_worker_fails_the_stage_within_its_bound():
    import multiprocessing
    import os
    import signal
    import time

    lock = multiprocessing.get_context("fork").Lock()
    holder = os.fork()
    if holder == 0:  # takes the lock and is killed holding it, as the OOM killer would
        lock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(holder, 0)
    compress = ContendedCompress(lock, serial=0.5, lock_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="a worker killed while holding it"):
        compress(make_block(0, kb=4))
    assert time.monotonic() - started < 2.0
