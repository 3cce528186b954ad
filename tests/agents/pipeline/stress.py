"""Generated pipelines under generated operations, for the stress tests (short and soak forms).

A scenario is a pipeline shape (1 to 6 stages, thread or process, items of a few bytes to a
few MB on both sides of the shared-memory threshold, as bytes or as torch tensors, ordered or
not, a function that sleeps, spins, raises, or forks a helper process that outlives its worker) and a sequence of operations applied while the consumer takes items: live
resizes, SIGKILL of a worker process (or of the launcher), and a stop that may come before
the source is exhausted. Every operation runs under a bound; a bound that passes fails the
run with every thread's stack, which is what a hang looks like.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import multiprocessing
import os
import queue
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import strategies as st

from agents.pipeline import LayoutBusy, Pipeline, Stage, StageFailed, shm

# Bounds (seconds). Generous for a 2-core machine kept busy, still far below a hang.
APPLY_BOUND_S = 5.0
STOP_BOUND_S = 6.0  # stop_timeout_s (2) + kill + joins
RELAYOUT_TIMEOUT_S = 2.0  # how long a relayout waits for the last one to empty
RELAYOUT_BOUND_S = RELAYOUT_TIMEOUT_S + 3.0
ITEM_BOUND_S = 30.0  # the longest the consumer may wait for one item
SIZES = [8, 1024, 40_000, 200_000, 2_000_000]  # bytes; the shm threshold is 64 kB


def _tensors(size: int) -> dict:
    """A payload of torch tensors of about ``size`` bytes in all, a view among them: below
    the shared-memory threshold they travel by pickle, above it through shared memory."""
    data = torch.zeros(max(size // 4, 1), dtype=torch.float32)
    return {"data": data, "head": data[:2], "shape": data.shape}


@dataclass(frozen=True)
class Step:
    """One stage's function: carries ``(i, blob)`` on, with a blob of ``size`` bytes (or
    tensors of about that size, ``payload="tensor"``)."""

    name: str
    size: int
    behaviour: str  # "sleep", "spin", "raise", "none", "fork"
    ms: float
    raise_at: int = -1
    payload: str = "bytes"  # "bytes" or "tensor"
    hold_path: str = ""  # "fork": the helper process lives while this file exists

    def __call__(self, item: tuple[int, object]) -> tuple[int, object]:
        """Wait or spin, raise on item ``raise_at``, and pass the item's number on."""
        i, _ = item
        if self.behaviour == "raise" and i == self.raise_at:
            raise ValueError(f"{self.name} refuses item {i}")
        if self.behaviour == "fork":
            _fork_a_helper(self.hold_path)
        if self.behaviour == "sleep":
            time.sleep(self.ms / 1000.0)
        elif self.behaviour == "spin":
            end = time.perf_counter() + self.ms / 1000.0
            while time.perf_counter() < end:
                pass
        if self.payload == "tensor":
            return i, _tensors(self.size)
        return i, bytes(self.size)


_HELPER_OF: set[int] = set()  # the processes that started a helper already
_TEST_PROCESS = os.getpid()  # a thread stage's function runs here: it forks nothing


def _fork_a_helper(hold_path: str) -> None:
    """Once per process: fork a helper that outlives this process, as a stage function's
    ``multiprocessing`` helper or ``Manager`` does. It holds every descriptor the worker
    had, its result pipe's write end among them, so a worker killed under it does not close
    that pipe. It leaves when ``hold_path`` is removed (the scenario's end), or after 120 s."""
    if os.getpid() in _HELPER_OF or os.getpid() == _TEST_PROCESS or not hold_path:
        return
    _HELPER_OF.add(os.getpid())
    if os.fork() == 0:
        try:
            end = time.monotonic() + 120.0
            while os.path.exists(hold_path) and time.monotonic() < end:
                time.sleep(0.05)
        finally:
            os._exit(0)


def _source(n: int, size: int):
    for i in range(n):
        yield i, bytes(size)


@dataclass
class Scenario:
    """A generated pipeline shape and the operations to run on it."""

    kinds: list[str]
    steps: list[Step]
    ordered: list[bool]
    items: int
    source_size: int
    queue_size: int
    operations: list[tuple] = field(default_factory=list)
    layout: list[str] | None = None  # the groups of stages fused at the start

    @property
    def raises_at(self) -> int | None:
        """The first item some stage raises on, if any."""
        marks = [
            s.raise_at for s in self.steps if s.behaviour == "raise" and s.raise_at < self.items
        ]
        return min(marks) if marks else None

    def build(self) -> Pipeline:
        """The pipeline this scenario describes (not started)."""
        stages = [
            Stage(step.name, step, kind=kind, ordered=ordered, max_workers=4)
            for step, kind, ordered in zip(self.steps, self.kinds, self.ordered, strict=True)
        ]
        return Pipeline(
            lambda: _source(self.items, self.source_size),
            stages,
            queue_size=self.queue_size,
            name="stress",
            max_item_retries=50,  # kills are random: an item may be unlucky a few times
            layout=self.layout,
        )


@st.composite
def scenarios(
    draw, max_stages: int = 6, max_items: int = 120, max_operations: int = 8, min_stages: int = 1
):
    """Random pipeline shapes with random operations."""
    n = draw(st.integers(min_stages, max_stages))
    items = draw(st.integers(0, max_items))
    kinds = draw(st.lists(st.sampled_from(["thread", "process"]), min_size=n, max_size=n))
    steps = []
    for k in range(n):
        behaviour = draw(st.sampled_from(["none", "sleep", "spin", "raise", "fork"]))
        steps.append(
            Step(
                name=f"s{k}",
                size=draw(st.sampled_from(SIZES)),
                behaviour=behaviour,
                ms=draw(st.sampled_from([0.0, 0.5, 2.0, 5.0])),
                raise_at=draw(st.integers(0, max(items - 1, 0))) if behaviour == "raise" else -1,
                payload=draw(st.sampled_from(["bytes", "tensor"])),
            )
        )
    ordered = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    process_stages = [k for k in range(n) if kinds[k] == "process"]
    operation = st.one_of(
        st.tuples(
            st.just("apply"),
            st.dictionaries(st.sampled_from([s.name for s in steps]), st.integers(1, 4)),
        ),
        st.tuples(st.just("consume"), st.integers(0, 30)),
        *(
            [
                st.tuples(st.just("kill"), st.sampled_from(process_stages)),
                st.tuples(st.just("kill_launcher")),
            ]
            if process_stages
            else []
        ),
    )
    return Scenario(
        kinds=kinds,
        steps=steps,
        ordered=ordered,
        items=items,
        source_size=draw(st.sampled_from(SIZES)),
        queue_size=draw(st.integers(1, 8)),
        operations=draw(st.lists(operation, max_size=max_operations)),
    )


def _layouts(names: list[str]):
    """Random layouts of ``names``: each gap between neighbours cut or not."""
    return st.lists(st.booleans(), min_size=len(names) - 1, max_size=len(names) - 1).map(
        lambda cuts: _groups(names, cuts)
    )


@st.composite
def _relayouts(draw, names: list[str]):
    """A relayout operation: the new groups, and worker counts for some of them (or none)."""
    groups = draw(_layouts(names))
    allocation = draw(st.none() | st.dictionaries(st.sampled_from(groups), st.integers(1, 4)))
    return ("relayout", groups, allocation, RELAYOUT_TIMEOUT_S)


def _groups(names: list[str], cuts: list[bool]) -> list[str]:
    groups, current = [], [names[0]]
    for name, cut in zip(names[1:], cuts, strict=True):
        if cut:
            groups.append("+".join(current))
            current = []
        current.append(name)
    return [*groups, "+".join(current)]


@st.composite
def relayout_scenarios(draw, max_items: int = 120, max_operations: int = 10):
    """Pipelines of 2 to 5 stages whose layout changes live, among resizes, kills of worker
    processes and a CPU burner started and stopped."""
    scenario = draw(scenarios(max_stages=5, max_items=max_items, max_operations=0, min_stages=2))
    names = [s.name for s in scenario.steps]
    n = len(names)
    operation = st.one_of(
        _relayouts(names),
        st.tuples(st.just("apply"), st.dictionaries(st.sampled_from(names), st.integers(1, 4))),
        st.tuples(st.just("consume"), st.integers(0, 30)),
        st.tuples(st.just("burn"), st.booleans()),
        *(
            [st.tuples(st.just("kill"), st.integers(0, n - 1))]
            if "process" in scenario.kinds
            else []
        ),
    )
    scenario.layout = draw(_layouts(names))
    scenario.operations = draw(st.lists(operation, min_size=2, max_size=max_operations))
    return scenario


def _in_layout(pipeline: Pipeline, allocation: dict[str, int]) -> dict[str, int]:
    """An allocation of the stages as written, for the groups the pipeline runs now (a
    group gets the most any of its stages asks)."""
    group_of = {unit: group for group in pipeline.stage_names for unit in group.split("+")}
    result: dict[str, int] = {}
    for unit, count in allocation.items():
        group = group_of.get(unit, unit)
        result[group] = max(result.get(group, 1), count)
    return result


class Burner:
    """A process that keeps one CPU busy, started and stopped by the test."""

    def __init__(self) -> None:
        self.process = None

    def set(self, on: bool) -> None:
        """Start the burner (``True``) or kill it (``False``)."""
        if on and self.process is None:
            self.process = multiprocessing.get_context("fork").Process(target=_burn, daemon=True)
            self.process.start()
        elif not on and self.process is not None:
            self.process.kill()
            self.process.join(5)
            self.process = None


def _burn() -> None:
    while True:
        pass


class Hang(AssertionError):
    """An operation did not finish within its bound."""


def bounded(what: str, seconds: float, fn, *args):
    """Run ``fn(*args)`` in a thread; fail with every thread's stack if it outlasts
    ``seconds``. Returns what it returned, and how long it took."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    began = time.monotonic()
    thread = threading.Thread(target=run, name=f"bounded-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    took = time.monotonic() - began
    if thread.is_alive():
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        raise Hang(f"{what} did not finish within {seconds} s (stacks on stderr)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value"), took


def write_tally(tally: object, name: str) -> None:
    """Write a stress run's tally (a dataclass of counts) to ``var/NAME``, after every case:
    docs/reliability.md quotes these files."""
    out = Path(__file__).resolve().parents[3] / "var" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(tally.__dict__, indent=2) + "\n")


@dataclass
class Tally:
    """What the stress runs did, for docs/reliability.md."""

    runs: int = 0
    operations: int = 0
    kills: int = 0
    hangs: int = 0
    longest_stop_s: float = 0.0
    longest_apply_s: float = 0.0
    relayouts: int = 0
    relayouts_busy: int = 0  # refused with LayoutBusy: the last change still emptying
    longest_relayout_s: float = 0.0


_DONE = object()


class Consumer:
    """Takes items in a thread of its own, so that the test can wait on it with a bound."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.items: queue.Queue = queue.Queue()
        self.wanted = threading.Semaphore(0)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(pipeline,), daemon=True)
        self.thread.start()

    def _run(self, pipeline: Pipeline) -> None:
        try:
            for item in pipeline:
                self.items.put(item[0])
                while not self.wanted.acquire(timeout=0.05):
                    if self.done.is_set():
                        return
        except BaseException as exc:  # noqa: BLE001 - looked at by the test
            self.error = exc
        finally:
            self.done.set()
            self.items.put(_DONE)

    def take(self, count: int, received: list[int]) -> None:
        """Let ``count`` more items through; fail if one takes longer than ``ITEM_BOUND_S``."""
        for _ in range(count):
            try:
                item = self.items.get(timeout=ITEM_BOUND_S)
            except queue.Empty:
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                raise Hang(f"no item within {ITEM_BOUND_S} s") from None
            if item is _DONE:
                self.items.put(_DONE)  # for the next take()
                return
            received.append(item)
            self.wanted.release()


def _kill_a_worker(pipeline: Pipeline, stage: int, rng: random.Random) -> bool:
    pools = pipeline._pools  # of the layout now; with relayouts, also those still emptying
    pools = [pools[stage % len(pools)], *(p for run in pipeline._draining for p in run)]
    workers = [w for pool in pools for w in pool.active + pool.retiring if w.pid and not w.ended]
    if not workers:
        return False
    rng.choice(workers).signal(signal.SIGKILL)
    return True


def run_scenario(scenario: Scenario, tally: Tally, seed: int = 0) -> None:
    """Run one scenario and check what the consumer got; raise on a hang or a wrong result."""
    rng = random.Random(seed)
    hold = tempfile.NamedTemporaryFile(prefix="stress-helpers-", delete=False)
    hold.close()
    steps = [dataclasses.replace(s, hold_path=hold.name) for s in scenario.steps]
    scenario = dataclasses.replace(scenario, steps=steps)
    pipeline = scenario.build()
    burner = Burner()
    tally.runs += 1
    received: list[int] = []
    consumer = None
    try:
        bounded("start", APPLY_BOUND_S, pipeline.start)
        consumer = Consumer(pipeline)
        for operation in scenario.operations:
            tally.operations += 1
            kind = operation[0]
            if kind == "apply":
                allocation = _in_layout(pipeline, operation[1])
                _, took = bounded("apply", APPLY_BOUND_S, pipeline.apply, allocation)
                tally.longest_apply_s = max(tally.longest_apply_s, took)
            elif kind == "relayout":
                before = pipeline.layout
                try:
                    _, took = bounded(
                        "relayout", RELAYOUT_BOUND_S, pipeline.relayout, *operation[1:]
                    )
                    tally.relayouts += 1
                    assert pipeline.layout == [g.split("+") for g in operation[1]]
                except LayoutBusy:
                    tally.relayouts_busy += 1
                    took = RELAYOUT_TIMEOUT_S
                    assert pipeline.layout == before, "a refused layout change changed the layout"
                tally.longest_relayout_s = max(tally.longest_relayout_s, took)
            elif kind == "burn":
                burner.set(operation[1])
            elif kind == "consume":
                consumer.take(operation[1], received)
            elif kind == "kill":
                tally.kills += _kill_a_worker(pipeline, operation[1], rng)
            elif kind == "kill_launcher" and pipeline._zygote is not None:
                try:
                    os.kill(pipeline._zygote.pid, signal.SIGKILL)
                    tally.kills += 1
                except ProcessLookupError:
                    pass  # killed by the operation before, and already replaced
        stop_early = rng.random() < 0.3
        if not stop_early:
            consumer.take(scenario.items + 1, received)
            bounded("the consumer's end", ITEM_BOUND_S, consumer.done.wait, ITEM_BOUND_S)
    except Hang:
        tally.hangs += 1
        raise
    finally:
        burner.set(False)
        if consumer is not None:
            consumer.done.set()
        try:
            _, took = bounded("stop", STOP_BOUND_S, pipeline.stop)
        finally:
            os.unlink(hold.name)  # the "fork" steps' helpers leave
        tally.longest_stop_s = max(tally.longest_stop_s, took)
    leftovers = [f for f in os.listdir(shm.SHM_DIR) if f.startswith(pipeline._prefix)]
    assert not leftovers, f"shared-memory files left behind: {leftovers}"
    if stop_early:
        _check_prefix(scenario, received)
        return
    _check_complete(scenario, received, consumer.error)


def _expected(scenario: Scenario) -> list[int]:
    stop = scenario.raises_at
    return list(range(scenario.items if stop is None else stop))


def _check_prefix(scenario: Scenario, received: list[int]) -> None:
    assert len(received) == len(set(received)), "an item arrived twice"
    if all(scenario.ordered):
        assert received == list(range(len(received))), "items out of order"


def _check_complete(scenario: Scenario, received: list[int], error: BaseException | None):
    if scenario.raises_at is None:
        assert error is None, f"unexpected error: {error!r}"
        if all(scenario.ordered):
            assert received == _expected(scenario)
        else:
            assert sorted(received) == _expected(scenario)
        return
    assert isinstance(error, StageFailed), f"expected the stage's error, got {error!r}"
    # The worker's traceback, down to the line that raised.
    assert "refuses item" in str(error) and "raise ValueError" in error.traceback_text
    raising = {s.name for s in scenario.steps if s.behaviour == "raise"}
    assert raising & set(error.stage.split("+")), error.stage  # a fused group names its stages
    assert len(received) == len(set(received)), "an item arrived twice"
    if all(scenario.ordered):
        assert received == _expected(scenario)
