"""A user's own pipeline for the CLI tests: ``--pipeline cli_pipelines:build``."""

import itertools

from agents.pipeline import Pipeline, Stage


def read(n: int) -> int:
    return n


def parse(n: int) -> int:
    return n + 1


def build() -> Pipeline:
    """Two stages named as the stand-in control plane's default job has them."""
    return Pipeline(
        itertools.count(), [Stage("read", read), Stage("parse", parse, kind="thread")], queue_size=4
    )


def build_whose_first_measurement_fails() -> Pipeline:
    """``build()``, but its first ``metrics()`` raises: the agent logs a traceback for it."""
    pipeline = build()
    measure = pipeline.metrics
    calls = itertools.count()

    def metrics(**options) -> list[dict]:  # by_unit=..., as Pipeline.metrics takes
        if next(calls) == 0:
            raise RuntimeError("the first measurement fails (a test)")
        return measure(**options)

    pipeline.metrics = metrics
    return pipeline


def finite() -> Pipeline:
    """``build()`` over 30 items only: the source ends."""
    return Pipeline(range(30), [Stage("read", read), Stage("parse", parse, kind="thread")])


def fail_on_twenty(n: int) -> int:
    if n == 20:
        raise ValueError("record 20 is malformed")
    return n


def failing() -> Pipeline:
    """``build()`` whose first stage raises on item 20."""
    return Pipeline(
        itertools.count(), [Stage("read", fail_on_twenty), Stage("parse", parse, kind="thread")]
    )


def not_a_pipeline() -> list:
    return [read, parse]


def other_stages() -> Pipeline:
    """Stages the stand-in's default job (read, parse) does not have."""
    return Pipeline(itertools.count(), [Stage("fetch", read), Stage("decode", parse)])


def _stuck(n: int) -> int:
    if n >= 3:
        import time

        time.sleep(600)  # user code that never returns in time
    return n


def build_stuck() -> Pipeline:
    """``build()``'s stages, but ``read`` hangs in user code from its fourth item on."""
    return Pipeline(
        itertools.count(),
        [Stage("read", _stuck, workers=2), Stage("parse", parse, kind="thread")],
        queue_size=4,
    )
