"""A payload comes out of the runtime as it went in: every container's exact type, dict
order, tuples against lists, and its arrays and tensors, by either road (pickle under
``shm_min_bytes``, shared memory over it); generated with hypothesis."""

from __future__ import annotations

import pickle
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, Stage, shm

Point = namedtuple("Point", "x y")


@dataclass
class Sample:
    """A user's own item type."""

    features: Any
    label: Any = 0
    extra: dict = field(default_factory=dict)


def _tensors() -> st.SearchStrategy:
    dtypes = st.sampled_from([torch.float32, torch.int64, torch.uint8, torch.bool, torch.float16])
    shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3)
    big = st.just((300, 64))  # 76 kB as float32: over the 64 kB threshold by itself

    def make(dtype, shape, seed):
        generator = torch.Generator().manual_seed(seed)
        values = torch.randint(0, 100, tuple(shape), generator=generator)
        return values.to(dtype)

    return st.builds(make, dtypes, st.one_of(shapes, big), st.integers(0, 2**16))


def _arrays() -> st.SearchStrategy:
    dtypes = st.sampled_from(["<f4", "<i8", "|u1", "|b1"])
    return st.builds(
        lambda dtype, n: (np.arange(n) % 7).astype(dtype), dtypes, st.integers(0, 20_000)
    )


RECORD = [("label", "<i4"), ("dense", "<f4", (3,)), ("id", ">i8")]  # a Criteo-like row


def _records() -> st.SearchStrategy:
    """Arrays a dataset reads from binary files: structured (record) dtypes, one with a
    Python object among its fields, and a byte-swapped one (their string, ``|V24``, lost the
    field names: the record came back as raw bytes)."""
    dtypes = st.sampled_from([RECORD, [("a", "<i4"), ("note", "O")], ">f8"])
    return st.builds(
        lambda dtype, n: np.array([tuple(range(len(dtype)))] * n if isinstance(dtype, list)
                                  else range(n), dtype=dtype),
        dtypes,
        st.integers(0, 3_000),
    )  # fmt: skip


def _nested_tensors() -> st.SearchStrategy:
    """torch.nested tensors (jagged rows, the default layout: its tensors say "strided")."""
    return st.lists(st.integers(0, 30), min_size=1, max_size=4).map(
        lambda lengths: torch.nested.nested_tensor([torch.arange(float(n)) for n in lengths])
    )


LEAVES = st.one_of(
    _records(),
    _nested_tensors(),
    st.integers(-(2**40), 2**40),
    st.text(max_size=8),
    st.none(),
    st.binary(max_size=64),
    st.integers(0, 255).map(lambda byte: bytearray([byte]) * 70_000),
    _tensors(),
    _arrays(),
    st.lists(st.integers(0, 9), max_size=4).map(torch.Size),
)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    keys = st.text(min_size=1, max_size=5)
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(keys, children, max_size=4).map(lambda d: OrderedDict(reversed(d.items()))),
        st.builds(Point, children, children),
        st.builds(Sample, children, children, st.dictionaries(keys, children, max_size=2)),
        st.dictionaries(keys, st.lists(children, max_size=2), max_size=3).map(
            lambda d: defaultdict(list, d)
        ),
    )


PAYLOADS = st.recursive(LEAVES, _containers, max_leaves=12)


def assert_same(back: Any, sent: Any, where: str = "payload") -> None:
    """``back`` is ``sent``: same types all the way down, same order, same values."""
    assert type(back) is type(sent), f"{where}: {type(back).__name__} != {type(sent).__name__}"
    if isinstance(sent, torch.Tensor) and sent.is_nested:
        assert back.is_nested and back.layout == sent.layout, where
        for i, (b, s) in enumerate(zip(back.unbind(), sent.unbind(), strict=True)):
            assert_same(b, s, f"{where}.unbind()[{i}]")
    elif isinstance(sent, torch.Tensor):
        assert back.dtype == sent.dtype and back.shape == sent.shape, where
        assert torch.equal(back, sent), where
    elif isinstance(sent, np.ndarray):
        assert back.dtype == sent.dtype and back.shape == sent.shape, where
        assert np.array_equal(back, sent), where
    elif isinstance(sent, dict):
        assert list(back) == list(sent), f"{where}: keys {list(back)} != {list(sent)}"
        if isinstance(sent, defaultdict):
            assert back.default_factory is sent.default_factory, where
        for key in sent:
            assert_same(back[key], sent[key], f"{where}[{key!r}]")
    elif isinstance(sent, Sample):
        for name in ("features", "label", "extra"):
            assert_same(getattr(back, name), getattr(sent, name), f"{where}.{name}")
    elif isinstance(sent, tuple | list):
        assert len(back) == len(sent), where
        for i, (b, s) in enumerate(zip(back, sent, strict=True)):
            assert_same(b, s, f"{where}[{i}]")
    else:
        assert back == sent, where


def _through_shared_memory(payload: Any) -> Any:
    packet = shm.pack(payload, "intune-test-types", min_bytes=1)
    if not isinstance(packet, shm.SharedPacket):  # no buffer at all: it goes by pickle
        return pickle.loads(shm.dumps(packet))
    return shm.unpack(pickle.loads(pickle.dumps(packet)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_shared_memory_gives_back_every_container_type_and_order(payload):
    assert_same(_through_shared_memory(payload), payload)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PAYLOADS)
def test_the_pickled_road_gives_back_every_container_type_and_order(payload):
    assert_same(pickle.loads(shm.dumps(payload)), payload)


def test_a_tensor_held_twice_and_views_of_one_tensor_come_back_shared():
    base = torch.arange(40_000, dtype=torch.float32).reshape(100, 400)
    rows = base.unbind(0)
    payload = {"a": base, "again": base, "rows": rows, "size": base.shape}
    back = _through_shared_memory(payload)
    assert back["a"] is back["again"]
    assert_same(back, payload)
    assert (
        back["rows"][3].untyped_storage().data_ptr() == back["rows"][4].untyped_storage().data_ptr()
    )


def test_a_slice_of_a_big_tensor_travels_alone_by_pickle():
    big = torch.zeros(1_000_000)
    assert len(shm.dumps(big[:10])) < 1000


def _passing(item):
    return item


def test_a_pipeline_of_process_stages_hands_the_consumer_the_types_it_was_given():
    payloads = [
        Point(torch.ones(3), OrderedDict(b=torch.Size([2, 3]), a=(1, [2]))),
        Sample(features=torch.ones(200, 100), label=np.arange(3), extra={"z": 1, "a": 2}),
        defaultdict(list, {"k": [Point(1, 2)]}),
    ]
    stages = [Stage("one", _passing), Stage("two", _passing, shm_min_bytes=1)]
    with Pipeline(payloads, stages) as pipeline:
        received = list(pipeline)
    for back, sent in zip(received, payloads, strict=True):
        assert_same(back, sent)
