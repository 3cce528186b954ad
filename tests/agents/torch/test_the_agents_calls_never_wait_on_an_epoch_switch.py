"""The agent's calls on a DataLoader (metrics() every sample, apply() for an allocation) never
wait on an epoch switch: stopping the last epoch's workers and starting the next epoch's take
seconds on a loaded host, and the agent's sampling thread must not stall meanwhile."""

import threading
import time

import pytest
import torch
import torch.utils.data as tud

from agents.pipeline import Pipeline
from agents.torch import DataLoader

# What one call may take: a metrics() of a started pipeline reads its pools (a few ms, tens
# at load 10); the switch below takes over a second (a worker killed after its 1 s grace).
CALL_BOUND_S = 0.2


class SlowAfterFirst(tud.Dataset):
    """Item 0 at once, every other item after 3 s: the epoch left after its first batch has
    its workers inside __getitem__, so stopping them takes their 1 s grace and a kill."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i:
            time.sleep(3.0)
        return torch.tensor([float(i)])


def test_metrics_and_apply_return_at_once_during_an_epoch_switch_and_the_allocation_holds():
    loader = DataLoader(SlowAfterFirst(), batch_size=1, num_workers=2, timeout=30)
    (stage,) = loader.stage_names  # fetch+collate, fused
    calls = []  # (what, started, seconds, result)
    switching = threading.Event()
    done = threading.Event()
    applied = threading.Event()

    def agent():
        # As the agent's sampling thread: metrics() in a loop; one allocation sent once the
        # switch is under way.
        while not done.is_set():
            started = time.monotonic()
            rows = loader.metrics()
            calls.append(("metrics", started, time.monotonic() - started, rows))
            if switching.is_set() and not applied.is_set() and started > switch_at[0] + 0.3:
                started = time.monotonic()
                loader.apply({stage: 3})
                calls.append(("apply", started, time.monotonic() - started, None))
                applied.set()
            time.sleep(0.01)

    switch_at = [0.0]
    try:
        first = iter(loader)
        assert next(first).tolist() == [[0.0]]
        sampler = threading.Thread(target=agent, daemon=True)
        sampler.start()
        time.sleep(0.2)
        switch_at[0] = time.monotonic()
        switching.set()
        # The switch: the first epoch ends (its workers inside __getitem__: their grace, a
        # kill), as a loop's end or close() ends it, and the next starts. A new iter() alone
        # no longer ends it: each iterator has its own pipeline, as torch's its own workers.
        first.close()
        second = iter(loader)
        switch_s = time.monotonic() - switch_at[0]
        time.sleep(0.2)  # samples after the switch too
        done.set()
        sampler.join(timeout=10)
        assert not sampler.is_alive(), "the sampling thread is stuck"
        assert switch_s > 0.8, f"the switch took {switch_s:.2f} s: too fast to show anything"
        assert applied.is_set(), "no allocation was sent during the switch"

        slow = [(what, round(s, 3)) for what, _, s, _ in calls if s > CALL_BOUND_S]
        assert not slow, f"calls waited on the {switch_s:.2f} s epoch switch: {slow}"
        during = [c for c in calls if switch_at[0] <= c[1] <= switch_at[0] + switch_s]
        assert len(during) >= 5, f"only {len(during)} calls during a {switch_s:.2f} s switch"
        assert any(c[0] == "apply" for c in during), "the allocation came after the switch"

        # Every sample is a row per stage: of the epoch in force, or between epochs idle
        # rows at the allocation the next epoch starts at.
        apply_at = next(c[1] + c[2] for c in calls if c[0] == "apply")
        for what, started, _, rows in calls:
            if what != "metrics":
                continue
            assert [r["name"] for r in rows] == [stage]
            if started > apply_at:
                assert rows[0]["workers"] == 3, rows  # the allocation, once applied, holds

        # The allocation sent during the switch is the new epoch's, applied once: 3 workers.
        assert loader.allocation == {stage: 3}
        assert loader.pipeline.allocation == {stage: 3}
        assert loader.pipeline is second.receiver.pipeline
        assert [r["workers"] for r in loader.metrics()] == [3]
        assert next(second).tolist() == [[0.0]]  # the new epoch runs
    finally:
        done.set()
        loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_an_allocation_sent_while_the_next_epochs_workers_start_is_applied_to_them_once(
    monkeypatch, persistent
):
    # The start is slowed by a wrapper (worker launches take seconds only on a loaded host,
    # which a test cannot order): the allocation then comes in the middle of the start.
    real_start = Pipeline.start
    starting = threading.Event()

    def slow_start(pipeline):
        starting.set()
        time.sleep(1.0)
        return real_start(pipeline)

    monkeypatch.setattr(Pipeline, "start", slow_start)
    loader = DataLoader(tud.TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=2,
                        persistent_workers=persistent, timeout=30)  # fmt: skip
    (stage,) = loader.stage_names
    calls = []  # (what, seconds)
    epoch = []

    def consumer():
        epoch.append(iter(loader))

    try:
        switch = threading.Thread(target=consumer, daemon=True)
        switch.start()
        assert starting.wait(10), "the epoch never started its pipeline"
        time.sleep(0.2)
        for _ in range(5):
            started = time.monotonic()
            rows = loader.metrics()
            calls.append(("metrics", time.monotonic() - started))
            assert [(r["name"], r["items_per_s"]) for r in rows] == [(stage, 0.0)]  # idle
        started = time.monotonic()
        loader.apply({stage: 3})
        calls.append(("apply", time.monotonic() - started))
        started = time.monotonic()
        rows = loader.metrics()
        calls.append(("metrics", time.monotonic() - started))
        assert [r["workers"] for r in rows] == [3]  # the next epoch's, as recorded
        switch.join(timeout=30)
        assert not switch.is_alive(), "the epoch's start is stuck"
        slow = [(what, round(s, 3)) for what, s in calls if s > CALL_BOUND_S]
        assert not slow, f"calls waited on the epoch's start: {slow}"

        (batches,) = epoch
        assert loader.pipeline is batches.receiver.pipeline
        assert loader.allocation == {stage: 3} == loader.pipeline.allocation
        assert [r["workers"] for r in loader.metrics()] == [3]
        # Applied once, after the start, from 2 to 3: its one resize started one worker.
        assert loader.pipeline.last_resize()["workers_started"] == 1
        assert [b.tolist() for (b,) in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    finally:
        loader.close()


@pytest.mark.parametrize("persistent", [False, True])
def test_metrics_and_apply_return_at_once_while_close_stops_busy_workers(persistent):
    loader = DataLoader(SlowAfterFirst(), batch_size=1, num_workers=2,
                        persistent_workers=persistent, timeout=30)  # fmt: skip
    (stage,) = loader.stage_names
    calls = []  # (what, seconds)
    try:
        batches = iter(loader)
        assert next(batches).tolist() == [[0.0]]
        closing = threading.Thread(target=loader.close, daemon=True)
        started_close = time.monotonic()
        closing.start()
        time.sleep(0.2)
        while closing.is_alive() and time.monotonic() - started_close < 10:
            started = time.monotonic()
            rows = loader.metrics()
            calls.append(("metrics", time.monotonic() - started))
            assert [(r["name"], r["items_per_s"]) for r in rows] == [(stage, 0.0)]  # none runs
            if len(calls) == 5:
                started = time.monotonic()
                loader.apply({stage: 3})
                calls.append(("apply", time.monotonic() - started))
            time.sleep(0.01)
        close_s = time.monotonic() - started_close
        closing.join(timeout=10)
        assert not closing.is_alive(), "close() is stuck"
        assert close_s > 0.8, f"close() took {close_s:.2f} s: too fast to show anything"
        slow = [(what, round(s, 3)) for what, s in calls if s > CALL_BOUND_S]
        assert not slow, f"calls waited on the {close_s:.2f} s close(): {slow}"
        assert any(what == "apply" for what, _ in calls), "no allocation was sent during close()"

        # The next epoch starts at the allocation sent during close().
        batches = iter(loader)
        assert next(batches).tolist() == [[0.0]]
        assert loader.pipeline.allocation == {stage: 3}
    finally:
        loader.close()
