"""Generated user sources and consumers: a source that ends, yields nothing, raises, never
ends, or blocks forever; a consumer that takes everything, or breaks early and drops its
iterator; then ``stop()``. Every case runs under a hard bound (a watchdog dumps every
thread's stack and fails the case), stop() returns within its bound, and no worker process
is left behind."""

import faulthandler
import gc
import itertools
import sys
import threading

import psutil
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agents.pipeline import Pipeline, PipelineStopped, Stage, StageFailed
from tests.agents.pipeline.stress import STOP_BOUND_S, bounded

CASE_BOUND_S = 30.0  # the watchdog's: a whole case, stop included
TAKE_BOUND_S = 10.0  # the consumer's part of a case


class Source:
    """A user's source of ``n`` items that then ends, raises, never ends, or blocks."""

    def __init__(self, n: int, end: str, release: threading.Event):
        self.n, self.end, self.release = n, end, release

    def __call__(self):
        yield from range(self.n)
        if self.end == "raise":
            raise OSError("the user's file went away")
        if self.end == "endless":
            i = self.n
            while True:
                yield i
                i += 1
        if self.end == "block":
            self.release.wait()  # as a read on a socket that never answers


def _double(x):
    return x * 2


def _workers_left(before: set[int]) -> list[psutil.Process]:
    children = psutil.Process().children(recursive=True)
    return [p for p in children if p.pid not in before and p.is_running()]


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a hang is reported, not shrunk
)
@given(
    n=st.integers(0, 40),
    end=st.sampled_from(["end", "raise", "endless", "block"]),
    kinds=st.lists(st.sampled_from(["thread", "process"]), min_size=1, max_size=3),
    take=st.none() | st.integers(0, 20),  # None: to the end; a number: break after it
)
def test_a_users_source_and_an_early_break_never_hang(n, end, kinds, take):
    if end in ("endless", "block") and take is None:
        take = n  # a consumer of an endless or blocked source leaves when it has had enough
    # Garbage left by earlier tests of this process is collected here, outside the bounds: the
    # consumer's collection below once finalized another test's torch DataLoader iterator,
    # whose own shutdown (a worker joined 5 s at a time) outlasted the consumer's bound (CI).
    gc.collect()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    release = threading.Event()
    stages = [Stage(f"s{k}", _double, kind=kind) for k, kind in enumerate(kinds)]
    pipeline = Pipeline(Source(n, end, release), stages, stop_timeout_s=1.0, queue_size=4)
    faulthandler.dump_traceback_later(CASE_BOUND_S, exit=True, file=sys.stderr)
    try:
        received, error, stopped = [], [], []

        def consume():
            iterator = iter(pipeline)
            try:
                # islice asks for no item past ``take``: the break comes right after the last.
                received.extend(itertools.islice(iterator, take))
            except StageFailed as exc:
                error.append(exc)
            except PipelineStopped as exc:
                stopped.append(exc)
            del iterator
            gc.collect()  # the dropped iterator is collected while the pipeline runs

        pipeline.start()
        if end == "block" and take is not None and take > n:
            # It would wait for an item the source never gives: stop() must end that wait.
            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            consumer.join(0.5)
            _, took = bounded("stop", STOP_BOUND_S, pipeline.stop)
            consumer.join(TAKE_BOUND_S)
            assert not consumer.is_alive(), "stop() left the consumer waiting"
            # Told, not ended quietly as if the source had ended.
            assert stopped or error, "the consumer's loop ended quietly on stop()"
        else:
            bounded("the consumer", TAKE_BOUND_S, consume)
            _, took = bounded("stop", STOP_BOUND_S, pipeline.stop)
        assert took < STOP_BOUND_S
        factor = 2 ** len(kinds)
        assert received == [factor * i for i in range(len(received))]
        if end == "raise" and take is None:
            assert received == [factor * i for i in range(n)]
            assert error and error[0].stage == "source" and "went away" in str(error[0])
        elif end == "end" and take is None:
            assert received == [factor * i for i in range(n)] and not error
        else:
            assert not error or error[0].stage == "source"
    finally:
        release.set()
        pipeline.stop()
        faulthandler.cancel_dump_traceback_later()
    left = _workers_left(before)
    _, alive = psutil.wait_procs(left, timeout=3.0)
    assert not alive, f"worker processes left behind: {[p.pid for p in alive]}"
