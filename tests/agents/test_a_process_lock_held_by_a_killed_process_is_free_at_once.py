"""agents.process_lock.ProcessLock: the lock the loader's and the raw reader's processes share.

A multiprocessing lock whose holder is SIGKILLed stays taken for ever; this one is dropped by
the kernel when its holder dies, keeps processes and threads apart, and bounds every wait."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.process_lock import ProcessLock, SharedCount

_fork = multiprocessing.get_context("fork")


def _hold_for_ever(lock: ProcessLock, held) -> None:
    lock.acquire()
    held.set()
    time.sleep(600)


def _add(lock: ProcessLock, total, threads: int, times: int) -> None:
    def work() -> None:
        for _ in range(times):
            with lock:
                value = total.value
                time.sleep(0)  # a switch here loses an increment unless the lock holds
                total.value = value + 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(processes=st.integers(1, 4), threads=st.integers(1, 3), times=st.integers(1, 60))
def test_processes_and_their_threads_never_hold_it_together(processes, threads, times):
    lock = ProcessLock("the test's lock")
    total = _fork.RawValue("q", 0)
    # The parent's threads take part too (a process and the processes forked from it).
    children = [
        _fork.Process(target=_add, args=(lock, total, threads, times)) for _ in range(processes)
    ]
    for c in children:
        c.start()
    _add(lock, total, threads, times)
    for c in children:
        c.join(timeout=60)
        assert c.exitcode == 0
    assert total.value == (processes + 1) * threads * times


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM])
def test_a_holder_that_dies_leaves_it_free_at_once(how):
    lock = ProcessLock("the test's lock")
    held = _fork.Event()
    holder = _fork.Process(target=_hold_for_ever, args=(lock, held))
    holder.start()
    try:
        assert held.wait(timeout=30)
        assert not lock.acquire(timeout=0.2)  # taken while its holder lives
        os.kill(holder.pid, how)
        holder.join(timeout=30)
        start = time.monotonic()
        assert lock.acquire(timeout=10)
        assert time.monotonic() - start < 1.0
        lock.release()
    finally:
        holder.kill()
        holder.join(timeout=30)


def test_a_stopped_holder_makes_the_others_raise_naming_the_lock_instead_of_waiting():
    lock = ProcessLock("the readers' table", timeout=0.3)
    held = _fork.Event()
    holder = _fork.Process(target=_hold_for_ever, args=(lock, held))
    holder.start()
    try:
        assert held.wait(timeout=30)
        os.kill(holder.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="the readers' table was not free within 0.3 s"):
            with lock:
                pass
        assert time.monotonic() - start < 5
        # The thread lock was let go with the failed attempt: the next one waits for the
        # process, not for this thread.
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=30)
        with lock:
            pass
    finally:
        holder.kill()
        holder.join(timeout=30)


def test_a_child_forked_while_a_thread_of_its_parent_held_it_can_take_it():
    lock = ProcessLock("the test's lock")
    took = _fork.Event()

    def child() -> None:
        if lock.acquire(timeout=10):
            took.set()
            lock.release()

    with lock:  # this thread holds it across the fork
        process = _fork.Process(target=child)
        process.start()
        time.sleep(0.3)
        # The parent still holds it: the child must wait for the parent, not for ever.
        assert not took.is_set()
    process.join(timeout=30)
    assert took.is_set()


def test_it_cannot_be_pickled_for_it_would_not_be_the_same_lock():
    with pytest.raises(TypeError, match="inheritance only"):
        pickle.dumps(ProcessLock("the test's lock"))


def _take_ids(count: SharedCount, times: int, ids) -> None:
    for _ in range(times):
        ids.put(count.add(1))


def test_a_shared_count_gives_every_process_its_own_number():
    count = SharedCount("the test's count", start=5)
    ids = _fork.SimpleQueue()
    children = [_fork.Process(target=_take_ids, args=(count, 20, ids)) for _ in range(3)]
    for c in children:
        c.start()
    for c in children:
        c.join(timeout=60)
        assert c.exitcode == 0
    taken = sorted(ids.get() for _ in range(60))
    assert taken == list(range(5, 65))  # each number once: none taken twice, none skipped
    assert count.value == 65
