"""Group commit: the writes of many runs' producers in this process share one round trip to the store.

A served chat streams ~30 tokens a second, so a run's own coalescing window
(web._producer) rarely joins two of its tokens, and every token becomes its
own round trip.  Round trips, not bytes, are what a log's client spends its
CPU on (bench section 16: ~100 us per Redis script call, whatever it
carries).  Here the first writer to arrive leads: while the store is busy
(another write began within ``busy_s``) it waits ``delay_s`` for others to
join, then writes everyone's requests in one round trip and hands each
its outcome.  A quiet store is written at once.  No thread of its own: the
leader is a producer that had to wait for its own write anyway.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Generic, List, Optional, TypeVar, Union

Request = TypeVar("Request")
Outcome = TypeVar("Outcome")

#: What :class:`GroupCommit`'s ``write_all`` returns per request: the outcome, or the error to raise for it.
Result = Union[Outcome, BaseException]


class _Slot(Generic[Request, Outcome]):
    """One waiting request: its lock is released when its result is in."""

    __slots__ = ("ready", "request", "result")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.result: Optional[Result[Outcome]] = None
        self.ready = threading.Lock()
        self.ready.acquire()


class GroupCommit(Generic[Request, Outcome]):
    """Requests from many threads written ``write_all(requests) -> results`` (same order) in one call.

    ``write_all`` returns an exception in a request's place to have that
    request's caller raise it (make one per request: each is raised in its
    own thread).  ``wait_s`` bounds a follower's wait for a leader stuck past
    the store's own timeouts.
    """

    def __init__(self, write_all: Callable[[List[Request]], List[Result[Outcome]]], *, delay_s: float,
                 busy_s: float, wait_s: float) -> None:
        self._write_all = write_all
        self._delay_s = delay_s
        self._busy_s = busy_s
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._queue: List[_Slot[Request, Outcome]] = []
        self._leading = False
        self._last_write = -1e9

    def submit(self, request: Request) -> Outcome:
        """Write ``request`` with whatever others join it; its outcome (or its error, raised)."""
        slot: _Slot[Request, Outcome] = _Slot(request)
        with self._lock:
            self._queue.append(slot)
            lead = not self._leading
            self._leading = True
            busy = time.monotonic() - self._last_write < self._busy_s
        if lead:
            self._lead(busy)
        elif not slot.ready.acquire(timeout=self._wait_s):
            raise TimeoutError(f"a grouped write waited {self._wait_s:g} s for the one writing it")
        result = slot.result
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]

    def _lead(self, busy: bool) -> None:
        """Wait for others to join while the store is busy, then write the whole queue and hand out results."""
        if busy:
            time.sleep(self._delay_s)
        with self._lock:
            slots, self._queue = self._queue, []
            self._leading = False  # the next arrival leads the next group while this one is written
            self._last_write = time.monotonic()
        interrupted: Optional[BaseException] = None
        try:
            results = self._write_all([slot.request for slot in slots])
            if len(results) != len(slots):
                raise RuntimeError(f"write_all returned {len(results)} results for {len(slots)} requests")
        except BaseException as exc:  # every caller of the group gets the failure, chained
            results = [_failed(exc) for _ in slots]
            interrupted = None if isinstance(exc, Exception) else exc
        for slot, result in zip(slots, results):
            slot.result = result
            slot.ready.release()
        if interrupted is not None:  # KeyboardInterrupt, SystemExit: the others are answered, this thread stops
            raise interrupted


def _failed(cause: BaseException) -> BaseException:
    error = RuntimeError(f"a grouped write failed: {type(cause).__name__}: {cause}")
    error.__cause__ = cause
    return error
