"""The bounded queue in front of every stage (and of the consumer), inside the pipeline's process.

Every queue of the pipeline lives in the pipeline's own process; process workers are fed from
it, and answer into the next one, through pipes of their own (``agents.pipeline.worker``).
So no queue is ever shared between processes, and no process can die holding one's lock.

Every wait on an inbox has a bound, and ``close()`` (the pipeline stops) or ``wake()`` (a
worker was told to retire) ends every wait at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any


class Inbox:
    """A bounded FIFO of ``(seq, payload)`` messages whose waits can all be cut short."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self.closed = False

    def put(self, message: Any, timeout: float | None = None) -> bool:
        """Append ``message``, waiting for room; ``False`` if the inbox closed (or the
        ``timeout`` passed) first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._items) >= self.capacity and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._not_full.wait(left)
            if self.closed:
                return False
            self._items.append(message)
            self._not_empty.notify()
            return True

    def put_front(self, messages: Iterable[Any]) -> None:
        """Put messages back at the head, past the capacity (items a dead worker held)."""
        with self._lock:
            if self.closed:
                return
            self._items.extendleft(reversed(list(messages)))
            self._not_empty.notify_all()

    def get(self, timeout: float, leave: Callable[[], bool] | None = None) -> Any:
        """Take the oldest message.

        Raises ``queue.Empty`` when ``timeout`` passes, or when ``leave()`` turns true (it is
        looked at whenever the inbox is woken), and ``EOFError`` once the inbox is closed.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._items:
                if self.closed:
                    raise EOFError("the pipeline is stopping")
                if leave is not None and leave():
                    raise queue.Empty
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self._not_empty.wait(left)
            if self.closed:
                raise EOFError("the pipeline is stopping")
            message = self._items.popleft()
            self._not_full.notify()
            return message

    def wake(self) -> None:
        """Wake every waiting getter, so that each looks at its ``leave()`` again."""
        with self._lock:
            self._not_empty.notify_all()

    def close(self) -> list[Any]:
        """End every wait now and for good; return what was still queued."""
        with self._lock:
            self.closed = True
            left = list(self._items)
            self._items.clear()
            self._not_empty.notify_all()
            self._not_full.notify_all()
            return left

    def qsize(self) -> int:
        """Messages waiting now."""
        return len(self._items)
