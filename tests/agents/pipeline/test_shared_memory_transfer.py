"""Results move between processes through shared memory, intact, and leave no files behind."""

import glob

import numpy as np
import torch

from agents.pipeline import Pipeline, Stage, shm


def test_pack_and_unpack_give_back_the_same_arrays_tensors_and_bytes():
    batch = {
        "dense": torch.randn(512, 13),
        "ids": [torch.arange(1000, dtype=torch.int64), torch.empty(0, dtype=torch.int64)],
        "mask": np.random.rand(300, 26) > 0.5,
        "text": b"x" * 70000,
        "note": "kept as is",
    }
    packet = shm.pack(batch, "intune-test")
    assert isinstance(packet, shm.SharedPacket)
    back = shm.unpack(packet)
    assert torch.equal(back["dense"], batch["dense"])
    assert torch.equal(back["ids"][0], batch["ids"][0]) and back["ids"][1].numel() == 0
    assert np.array_equal(back["mask"], batch["mask"])
    assert back["text"] == batch["text"] and back["note"] == "kept as is"
    batch["dense"].zero_()  # the copy the receiver got is its own
    assert back["dense"].abs().sum() > 0


def test_a_pooled_file_is_reused_once_its_receiver_freed_it():
    first = shm.pack({"x": np.ones(100_000)}, "intune-test")
    shm.unpack(first)
    second = shm.pack({"x": np.zeros(100_000)}, "intune-test")
    assert second.pooled and second.path == first.path
    assert shm.unpack(second)["x"].sum() == 0
    shm.release_pool()
    assert not glob.glob(first.path)


def test_a_file_in_flight_when_its_producer_exits_is_removed_by_its_receiver():
    packet = shm.pack({"x": np.ones(100_000)}, "intune-test")
    shm.release_pool()  # the producer leaves while the packet is still in a queue
    assert glob.glob(packet.path)
    assert shm.unpack(packet)["x"].sum() == 100_000
    assert not glob.glob(packet.path)


def test_small_results_travel_by_pickle():
    small = {"x": np.zeros(10)}
    assert shm.pack(small, "intune-test") is small


def make_tensor(i: int) -> torch.Tensor:
    return torch.full((256, 256), float(i))


def test_a_pipeline_moves_tensors_through_shared_memory_and_cleans_up():
    pipeline = Pipeline(range(50), [Stage("make", make_tensor, workers=2)])
    with pipeline:
        sums = [float(t.sum()) for t in pipeline]
    assert sums == [256 * 256 * i for i in range(50)]
    assert not glob.glob(f"{shm.SHM_DIR}/{pipeline._prefix}-*")


def test_stopping_with_results_in_flight_removes_their_files():
    pipeline = Pipeline(range(10**6), [Stage("make", make_tensor, workers=2)], queue_size=4)
    with pipeline:
        next(iter(pipeline))
    assert not glob.glob(f"{shm.SHM_DIR}/{pipeline._prefix}-*")


def test_views_of_one_storage_travel_once_and_come_back_as_views_of_one_copy():
    table = torch.arange(26 * 4096, dtype=torch.int64).reshape(26, 4096)
    offsets = torch.arange(4096)
    batch = {"values": list(table.unbind(0)), "offsets": [offsets] * 26}
    packet = shm.pack(batch, "intune-test")
    # One storage for the 26 views and one offsets tensor: about 0.9 MB, not 26 copies of each.
    assert packet.size < 2 * (table.nbytes + offsets.nbytes) + 2**20
    back = shm.unpack(packet)
    assert all(torch.equal(a, b) for a, b in zip(back["values"], table.unbind(0), strict=True))
    storages = {v.untyped_storage().data_ptr() for v in back["values"]}
    assert len(storages) == 1
    assert all(o is back["offsets"][0] for o in back["offsets"])  # one object, as sent
    table.zero_()  # the receiver's copy is its own
    assert int(back["values"][25][-1]) == 26 * 4096 - 1


def test_a_small_slice_of_a_big_tensor_travels_alone():
    big = torch.zeros(4 * 2**20, dtype=torch.uint8)
    parts = [big[:40_000], big[40_000:80_000]]
    packet = shm.pack(parts, "intune-test")
    assert packet.size < 2**20 + 4096  # not the 4 MiB storage the slices belong to
    back = shm.unpack(packet)
    assert [p.numel() for p in back] == [40_000, 40_000]


def test_two_empty_tensors_come_back_as_two_objects():
    batch = [torch.empty(0), torch.empty(0), torch.ones(100_000)]
    back = shm.unpack(shm.pack(batch, "intune-test"))
    assert back[0] is not back[1]
    assert float(back[2].sum()) == 100_000


def _same(x):
    return x


def test_a_stage_that_sends_everything_through_shared_memory_takes_small_items_after_empty_ones():
    # shm_min_bytes=0: an item with no buffer made a pooled file with no room (its header
    # only), which the next item of a few bytes was then given: "could not broadcast input
    # array from shape (4,) into shape (0,)", the item failed.
    items = [None, np.float32(1.5), {}, torch.ones(3)[1:], "", b"x", [], np.zeros((0, 3))]
    with Pipeline(items, [Stage("all-shared", _same, shm_min_bytes=0)]) as pipeline:
        got = list(pipeline)
    assert [type(x) for x in got] == [type(x) for x in items]
    assert got[1] == np.float32(1.5) and torch.equal(got[3], torch.ones(2)) and got[5] == b"x"
    assert got[7].shape == (0, 3)


def test_an_item_with_no_buffer_stays_out_of_shared_memory_whatever_the_threshold():
    assert shm.pack({"note": "kept"}, "intune-test", min_bytes=0) == {"note": "kept"}
