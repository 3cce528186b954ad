"""An allocation with a ``layout`` fuses or splits the pipeline's stages live: the agent
checks it, applies it with ``Pipeline.relayout()`` without losing an item, keeps reporting
each stage as written (a fused group's time shared by its functions' times), and refuses a
layout that is not one, changing nothing. An allocation without ``layout`` that names every
stage runs them each alone again."""

import pytest

from .conftest import refusals


def test_a_layout_is_applied_live_and_the_stages_are_still_reported_as_written(
    agent, control_plane, pipeline, consumer, wait_for
):
    agent, host = agent
    version = control_plane.publish(
        host.id, {"parse+transform": 2}, layout=[["parse", "transform"]]
    )
    wait_for(lambda: agent.applied_version == version, what="the fused layout to be applied")
    assert pipeline.stage_names == ["parse+transform"]
    assert pipeline.allocation == {"parse+transform": 2}
    shipped = len(host.samples)
    wait_for(lambda: len(host.samples) > shipped + 2, what="samples in the fused layout")
    newest = host.samples[max(host.samples)]
    assert [s["name"] for s in newest["stages"]] == ["parse", "transform"]
    assert all(s["workers"] == 2 for s in newest["stages"])
    # Without a layout, an allocation of every stage runs them each alone again.
    version = control_plane.publish(host.id, {"parse": 2, "transform": 1})
    wait_for(lambda: agent.applied_version == version, what="the staged layout to be applied")
    assert pipeline.stage_names == ["parse", "transform"]
    assert pipeline.allocation == {"parse": 2, "transform": 1}
    taken = len(consumer.items)
    wait_for(lambda: len(consumer.items) > taken + 50, what="items after the changes")
    items = list(consumer.items)
    assert items == [2 * n + 1 for n in range(len(items))], "an item lost, repeated or reordered"


@pytest.mark.parametrize(
    ("layout", "workers", "reason"),
    [
        ([["transform", "parse"]], {"transform+parse": 1}, "pipeline order"),
        ([["parse"], ["decode"]], {"parse": 1, "decode": 1}, "unknown stage(s) decode"),
        ("parse+transform", {"parse+transform": 1}, "non-empty list of groups"),
        ([["parse", "transform"]], {"parse": 1, "transform": 1}, "must name its groups"),
        ([["parse", "transform"]], {"parse+transform": 9}, "at most 4"),
    ],
)
def test_a_bad_layout_is_refused_with_a_reason_and_changes_nothing(
    agent, control_plane, pipeline, layout, workers, reason, wait_for
):
    agent, host = agent
    version = control_plane.publish(host.id, workers, layout=layout)
    wait_for(lambda: version in refusals(host), what=f"version {version} to be refused")
    assert reason in refusals(host)[version]
    assert pipeline.stage_names == ["parse", "transform"]
    assert pipeline.allocation == {"parse": 1, "transform": 1}
    assert agent.applied_version == 1
