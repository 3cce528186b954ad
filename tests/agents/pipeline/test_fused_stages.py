"""Neighbouring stages fuse into one: same results, one lever, live resizes keep every item."""

import pytest

from agents.pipeline import AllocationError, Pipeline, Stage, fuse, fuse_groups
from agents.pipeline.examples import Work


def _stages() -> list[Stage]:
    return [Stage(f"s{i}", Work(), max_workers=8) for i in range(4)]


def test_a_fused_stage_applies_its_functions_in_order_under_a_joined_name():
    double = Stage("double", lambda x: 2 * x)
    inc = Stage("inc", lambda x: x + 1, workers=3, max_workers=4)
    fused = fuse([double, inc])
    assert fused.name == "double+inc"
    assert fused.fn(5) == 11  # (5 * 2) + 1, not (5 + 1) * 2
    assert (fused.workers, fused.max_workers) == (3, 4)


def test_fusing_groups_keeps_the_other_stages_where_they_were():
    names = [s.name for s in fuse_groups(_stages(), "s1+s2")]
    assert names == ["s0", "s1+s2", "s3"]
    names = [s.name for s in fuse_groups(_stages(), [["s0", "s1"], "s2+s3"])]
    assert names == ["s0+s1", "s2+s3"]


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        ("s0+s2", "only neighbouring stages fuse"),
        ("s1+s0", "only neighbouring stages fuse"),
        ("s1+nope", "no stage named 'nope'"),
        ("s0+s1,s1+s2", "s1 already in another group"),
        ("s0++s1", "names an empty stage"),
    ],
)
def test_a_group_that_cannot_fuse_is_refused_with_the_reason(groups, says):
    with pytest.raises(ValueError, match=says):
        fuse_groups(_stages(), groups)


def test_a_fused_pipeline_delivers_every_item_once_in_order_through_live_resizes():
    pipeline = Pipeline(range(2000), fuse_groups(_stages(), "s0+s1+s2"), queue_size=4)
    received = []
    with pipeline:
        assert pipeline.stage_names == ["s0+s1+s2", "s3"]
        for i, item in enumerate(pipeline):
            received.append(item)
            if i % 100 == 99:
                pipeline.apply({"s0+s1+s2": 1 + (i // 100) % 4})
        assert pipeline.metrics()[0]["name"] == "s0+s1+s2"
    assert received == [i + 4 for i in range(2000)]


def test_a_stage_that_was_fused_away_cannot_be_allocated_alone():
    pipeline = Pipeline(range(10), fuse_groups(_stages(), "s0+s1"))
    with pytest.raises(AllocationError, match="unknown stage 's0'"):
        pipeline.apply({"s0": 2})
    assert pipeline.allocation == {"s0+s1": 1, "s2": 1, "s3": 1}
