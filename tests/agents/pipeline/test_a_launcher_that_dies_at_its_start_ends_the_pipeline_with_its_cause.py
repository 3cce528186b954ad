"""A worker launcher that dies before it starts a worker (an exception in its first steps) is
tried again after a growing wait, ``LAUNCHER_STARTS`` times in all; then the consumer gets
``LauncherFailed`` naming how the last one ended and what it raised. Before, the pipeline
started another launcher every 0.1 s for ever, and the consumer waited for ever."""

from __future__ import annotations

import threading

import pytest

from agents.pipeline import LauncherFailed, Pipeline, Stage, zygote
from agents.pipeline.pipeline import LAUNCHER_STARTS
from agents.torch import DataLoader
from tests.agents.pipeline import stress
from tests.agents.torch.loader_cases import GONE_BOUND_S, assert_nothing_left, children

BOUND_S = 30.0  # LAUNCHER_STARTS tries with their waits take about 3 s; a busy host more


def double(x):
    return 2 * x


def _no_room(*args, **kwargs):
    raise RuntimeError("no room for a launcher (test)")


@pytest.fixture
def launchers_die(monkeypatch):
    """Every launcher forked from now on raises in its first step."""
    monkeypatch.setattr(zygote, "_launcher", _no_room)


def _fails_with_the_cause(error: BaseException) -> None:
    assert isinstance(error, LauncherFailed), repr(error)
    message = str(error)
    assert f"{LAUNCHER_STARTS} times in a row" in message, message
    assert "exited with code 1: RuntimeError: no room for a launcher (test)" in message, message
    assert "--- traceback in the launcher ---" in message, message


def _raised(fn) -> BaseException:
    try:
        stress.bounded("the epoch", BOUND_S, fn)
    except stress.Hang:
        raise
    except BaseException as exc:  # noqa: BLE001 - what the consumer got
        return exc
    raise AssertionError("the epoch ended without an error")


def test_a_pipeline_whose_launchers_die_at_start_raises_launcher_failed(launchers_die):
    before, threads = children(), set(threading.enumerate())
    with Pipeline(range(10), [Stage("double", double, workers=2)], name="nolauncher") as p:
        _fails_with_the_cause(_raised(lambda: list(p)))
    assert_nothing_left("pipeline", "after stop()", threads, before)


@pytest.mark.parametrize("timeout", [0, 20])
def test_a_loader_whose_launchers_die_at_start_ends_its_epoch_with_launcher_failed(
    launchers_die, timeout
):
    before, threads = children(), set(threading.enumerate())
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, timeout=timeout)
    try:
        _fails_with_the_cause(_raised(lambda: list(loader)))
    finally:
        stress.bounded("close()", GONE_BOUND_S, loader.close)
    assert_nothing_left(f"timeout={timeout}", "after close()", threads, before)


def test_a_launcher_that_dies_at_start_twice_then_works_gives_every_item(monkeypatch, tmp_path):
    tries = tmp_path / "tries"
    tries.write_text("")
    real = zygote._launcher

    def twice_then_real(*args, **kwargs):
        # A fresh fork each time: the count lives in a file, not in memory.
        with open(tries, "a") as out:
            out.write("x")
        if len(tries.read_text()) <= 2:
            raise RuntimeError("not yet (test)")
        return real(*args, **kwargs)

    monkeypatch.setattr(zygote, "_launcher", twice_then_real)
    with Pipeline(range(20), [Stage("double", double, workers=2)], name="flaky") as p:
        items, _ = stress.bounded("the items", BOUND_S, lambda: list(p))
    assert items == [2 * x for x in range(20)]
    assert len(tries.read_text()) == 3
