"""A live-resizable data pipeline: a source, stages with their own worker pools, a consumer.

from agents.pipeline import Pipeline, Stage

with Pipeline(range(1000), [Stage("square", lambda x: x * x, workers=2)]) as pipeline:
    pipeline.apply({"square": 4})          # live: no restart, nothing lost or repeated
    for item in pipeline:
        ...
    print(pipeline.metrics(), pipeline.consumer_stats())
"""

from agents.pipeline.consume import consume_until
from agents.pipeline.errors import (
    AllocationError,
    LauncherFailed,
    LayoutBusy,
    PipelineStalled,
    PipelineStopped,
    StageFailed,
)
from agents.pipeline.fusion import fuse, fuse_groups
from agents.pipeline.pipeline import Pipeline
from agents.pipeline.stage import Stage

__all__ = [
    "AllocationError",
    "LauncherFailed",
    "LayoutBusy",
    "Pipeline",
    "PipelineStalled",
    "PipelineStopped",
    "Stage",
    "StageFailed",
    "consume_until",
    "fuse",
    "fuse_groups",
]
