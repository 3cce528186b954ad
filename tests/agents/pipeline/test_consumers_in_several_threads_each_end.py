"""Threads that iterate one pipeline side by side share its items, each exactly once, and
every one of them ends at the source's end. Before, the thread that took the end returned
and the others waited for ever (2 threads, 5,000 items: one still waiting after 60 s)."""

import threading

import pytest

from agents.pipeline import Pipeline, Stage


def inc(x: int) -> int:
    return x + 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("consumers", [2, 4])
def test_every_consumer_thread_ends_and_the_items_are_shared_once(consumers):
    taken: list[list[int]] = [[] for _ in range(consumers)]
    with Pipeline(range(2000), [Stage("inc", inc, workers=2)], queue_size=4) as pipeline:

        def consume(mine: list[int]) -> None:
            for item in pipeline:
                mine.append(item)

        threads = [threading.Thread(target=consume, args=(t,), daemon=True) for t in taken]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        assert not any(thread.is_alive() for thread in threads)
        assert list(pipeline) == []  # a later loop ends at once too
    assert sorted(x for mine in taken for x in mine) == list(range(1, 2001))
