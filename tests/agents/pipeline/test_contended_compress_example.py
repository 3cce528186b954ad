"""The sublinear example pipeline (``agents.pipeline.examples:contended_compress``) delivers every
block once, in order, compressed in two parts that decompress to the block, with its ``compress``
workers sharing one lock (at two workers, as the shoot-out runs it)."""

import zlib

import pytest

from agents.pipeline.examples import checksum, contended_compress, make_block


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
