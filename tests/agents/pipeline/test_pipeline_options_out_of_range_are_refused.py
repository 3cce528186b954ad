"""Options that could only hang or mislead are refused when the pipeline is built, naming the
option: a ``prefetch`` below 1 left the collector no room for any item (the consumer waited
for ever: with ``item_timeout_s=3``, ``PipelineStalled`` after 3 s), and a negative
``stop_timeout_s`` named the pipeline's own threads as stuck in user code."""

import pytest

from agents.pipeline import Pipeline, Stage


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("prefetch", -1),
        ("prefetch", 0),
        ("prefetch", 0.5),
        ("prefetch", True),
        ("stop_timeout_s", -1.0),
        ("stop_timeout_s", float("nan")),
    ],
)
def test_an_option_out_of_range_is_refused_naming_it(option, value):
    with pytest.raises(ValueError, match=option):
        Pipeline(range(3), [Stage("a", abs, kind="thread")], **{option: value})


def test_the_smallest_prefetch_and_stop_timeout_still_deliver_every_item():
    with Pipeline(
        range(20), [Stage("a", abs, kind="thread")], prefetch=1, stop_timeout_s=0
    ) as pipeline:
        assert list(pipeline) == list(range(20))
