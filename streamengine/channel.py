"""A one-consumer event channel between a run's worker thread and its caller.

Cheaper than :class:`queue.Queue` on the per-token path: a deque append is
atomic under the GIL, and the producer only takes the lock to wake a consumer
that is actually waiting.  The consumer drains everything that arrived
together in one go, so a burst of tokens costs one wake-up, not one each.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Deque, List, Optional


class EventChannel:
    def __init__(self) -> None:
        self._items: Deque[Any] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = False
        self._closed = False

    def put(self, item: Any) -> None:
        self._items.append(item)
        if self._waiting:
            with self._cond:
                self._cond.notify()

    def close(self) -> None:
        """No more items will come; wakes the consumer."""
        self._closed = True
        with self._cond:
            self._cond.notify()

    @property
    def closed(self) -> bool:
        return self._closed and not self._items

    def drain(self, timeout: Optional[float]) -> List[Any]:
        """Everything queued now; waits up to ``timeout`` for the first item.

        Returns ``[]`` on timeout or when the channel is closed and empty.
        """
        items = self._take_all()
        if items or self._closed:
            return items
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiting = True
            try:
                while not self._items and not self._closed:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                self._waiting = False
        return self._take_all()

    def _take_all(self) -> List[Any]:
        items = []
        popleft = self._items.popleft
        try:
            while True:
                items.append(popleft())
        except IndexError:
            return items
