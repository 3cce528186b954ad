"""User code that does what a stage function should not never hangs the pipeline.

Each case consumes the pipeline in a thread joined with a bound, so a hang fails the test
(with the case named) rather than stalling the suite.
"""

import os
import signal
import sys
import threading
import time

import pytest

from agents.pipeline import Pipeline, Stage, StageFailed

BOUND_S = 20.0
BAD_ITEM = 4


class NeedsTwoArguments(Exception):
    """An exception that cannot be rebuilt from its args, so it does not unpickle."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def raise_keyboard_interrupt():
    raise KeyboardInterrupt


def raise_system_exit():
    sys.exit(3)


def raise_unpicklable():
    raise NeedsTwoArguments("no", 1)


def raise_generator_exit():
    raise GeneratorExit


RAISERS = [raise_keyboard_interrupt, raise_system_exit, raise_unpicklable, raise_generator_exit]


class RaiseOn:
    def __init__(self, raiser):
        self.raiser = raiser

    def __call__(self, item):
        if item == BAD_ITEM:
            self.raiser()
        return item


def consume(pipeline: Pipeline, loops: int = 1) -> tuple[list, list[BaseException]]:
    """Iterate ``loops`` times (going on after a StageFailed); fail the test on a hang."""
    received: list = []
    errors: list[BaseException] = []

    def run():
        for _ in range(loops):
            try:
                received.extend(pipeline)
            except StageFailed as exc:
                errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"the consumer hung for {BOUND_S} s"
    return received, errors


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("raiser", RAISERS, ids=lambda f: f.__name__)
def test_any_exception_from_a_stage_reaches_the_consumer_and_the_rest_follows(kind, raiser):
    stages = [Stage("odd", RaiseOn(raiser), kind=kind, workers=2), Stage("after", abs)]
    with Pipeline(range(10), stages, max_item_retries=0) as pipeline:
        received, errors = consume(pipeline, loops=2)
    assert len(errors) == 1 and errors[0].stage == "odd"
    assert received == [i for i in range(10) if i != BAD_ITEM]


@pytest.mark.parametrize("raiser", RAISERS, ids=lambda f: f.__name__)
def test_any_exception_from_the_source_ends_the_stream_as_an_error(raiser):
    def source():
        yield from range(BAD_ITEM)
        raiser()

    with Pipeline(source, [Stage("a", abs, kind="thread"), Stage("b", abs)]) as pipeline:
        received, errors = consume(pipeline, loops=2)
    assert received == list(range(BAD_ITEM))
    assert len(errors) == 1 and errors[0].stage == "source"


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_pipeline_looped_over_again_after_its_end_ends_at_once(kind):
    with Pipeline(range(6), [Stage("a", abs, kind=kind)]) as pipeline:
        received, errors = consume(pipeline, loops=3)
    assert received == list(range(6)) and not errors


class ForksAHelper:
    """A stage function that starts a helper process on its first item, as one that starts a
    ``multiprocessing`` pool or a ``Manager`` does: the helper outlives the worker."""

    def __init__(self, hold_path: str):
        self.hold_path = hold_path
        self.helper = None

    def __call__(self, item):
        if self.helper is None:
            self.helper = os.fork()
            if self.helper == 0:
                try:
                    end = time.monotonic() + 60
                    while os.path.exists(self.hold_path) and time.monotonic() < end:
                        time.sleep(0.05)
                finally:
                    os._exit(0)
        time.sleep(0.01)
        return item


def test_a_worker_killed_while_its_helper_process_lives_on_is_replaced(tmp_path):
    # The helper holds the worker's result pipe open: the pipe's end never comes, and the
    # pipeline must see the death from the process itself.
    hold = tmp_path / "helpers-live"
    hold.touch()
    stage = Stage("forks", ForksAHelper(str(hold)), kind="process", workers=2)
    received: list = []
    try:
        with Pipeline(range(100), [stage], max_item_retries=5) as pipeline:

            def run():
                for item in pipeline:
                    received.append(item)
                    if len(received) == 10:
                        for worker in pipeline._pools[0].active:
                            worker.signal(signal.SIGKILL)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(BOUND_S)
            assert not thread.is_alive(), f"the consumer hung for {BOUND_S} s"
            # Both were killed holding items (1 s of work was left), which went elsewhere.
            assert pipeline._pools[0].died >= 2
    finally:
        hold.unlink()
    assert received == list(range(100))


class SlowForkerOfLargeItems(ForksAHelper):
    def __call__(self, item):
        super().__call__(item)
        time.sleep(0.3)  # the next item waits in the pipe, which it fills
        return item[0]


def test_the_relay_feeding_a_killed_worker_with_a_live_helper_ends(tmp_path):
    # The helper also holds the item pipe's read end: a write to the dead worker's full pipe
    # would never return, and its relay would stay for good.
    hold = tmp_path / "helpers-live"
    hold.touch()
    forker = SlowForkerOfLargeItems(str(hold))
    # Through the pipe, not shared memory: the second item fills the pipe while the worker
    # is busy with the first.
    stage = Stage("forks", forker, kind="process", workers=1, shared_memory=False)
    items = [(i, bytes(400_000)) for i in range(6)]
    try:
        with Pipeline(items, [stage], max_item_retries=5, queue_size=2) as pipeline:
            iterator = iter(pipeline)
            received = [next(iterator)]
            pool = pipeline._pools[0]
            killed = pool.active[0]
            killed.signal(signal.SIGKILL)
            received += list(iterator)
            deadline = time.monotonic() + 5.0
            while any(r.is_alive() for r in killed.relays) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(r.is_alive() for r in killed.relays), "a relay of the dead worker stayed"
    finally:
        hold.unlink()
    assert received == list(range(6))
