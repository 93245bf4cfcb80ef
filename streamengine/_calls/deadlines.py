"""One watcher thread per process that fires the timeouts of calls whose client blocks in its reads.

The clients streamengine ships pass their waits up (``_clients.base.Wait``)
and their calls keep their own deadlines in the run's one selector; this
watcher is only for a ``StreamingLlmClient`` of your own whose ``stream()``
blocks (``yields_waits`` False).  A thread blocked in ``recv`` cannot time
itself out, and a socket read timeout would be reset by every keep-alive, so
such a call's two limits (idle: no *meaningful* chunk for N s; cap: the
whole stream) live here:

* :func:`watch` registers a call's deadlines with the shared
  :class:`DeadlineWatcher`, a daemon thread started lazily by this module
  and ended by it as soon as no call is watched.
* The driving thread moves its idle deadline on each meaningful chunk by
  storing a float (:attr:`Watch.idle_deadline`): no lock, no wake-up.  The
  watcher re-checks the current value when it wakes and re-arms instead of
  firing if the deadline moved.
* When a deadline passes, the watcher records which (:attr:`Watch.fired`)
  and sets the call's :class:`CancelToken`: the client shuts its socket down,
  the blocked read raises at once, and the call turns that into the timeout.
* While the driving thread waits for its consumer, the model is not the one
  being slow: :func:`held` stops the idle clock meanwhile and re-arms it with
  the time spent added.  The cap keeps running.

The watcher runs cancel callbacks (a socket shutdown: microseconds); a
callback that blocks would delay the other calls' timeouts, so keep them short.
"""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

from .._cancel import CancelToken

IDLE, CAP = "idle", "cap"
_NEVER = float("inf")
_THREAD_NAME = "streamengine-deadlines"
_current = threading.local()  # the Watch of the call the calling thread is streaming, if any


class Watch:
    """One call's deadlines, as seen by the driving thread and the watcher.

    ``idle_deadline`` is written by the driving thread only (``inf`` while held);
    ``fired`` is written by the watcher only, before it sets the token, so a
    run that sees its token set can tell a timeout from a caller's cancel.
    """

    __slots__ = ("_generation", "cap_deadline", "done", "fired", "fired_at", "idle_deadline", "idle_s", "token")

    def __init__(self, token: CancelToken, idle_s: float, started: float, cap_s: float) -> None:
        self.token = token
        self.idle_s = idle_s
        self.idle_deadline = started + idle_s
        self.cap_deadline = started + cap_s
        self.fired: Optional[str] = None
        self.fired_at = 0.0
        self.done = False
        self._generation = 0  # heap entries of older generations are stale and dropped

    def due(self) -> float:
        idle = self.idle_deadline
        return idle if idle < self.cap_deadline else self.cap_deadline


_Entry = Tuple[float, int, int, Watch]  # (when, tie-breaker, generation, watch)


class DeadlineWatcher:
    """A heap of watched calls and the one daemon thread that fires their deadlines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: List[_Entry] = []
        self._order = itertools.count()
        #: Watched calls not yet finished (any thread): 0 means no thread has a clock for :func:`held` to stop.
        self.active = 0
        self._thread: Optional[threading.Thread] = None

    # --- the driving thread's side -----------------------------------------------------------
    def add(self, item: Watch) -> None:
        with self._lock:
            self.active += 1
            self._push(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=_THREAD_NAME, daemon=True)
                try:
                    self._thread.start()
                except BaseException:  # e.g. no thread left: the call fails now instead of never timing out
                    self._thread = None
                    self.active -= 1
                    item.done = True
                    raise

    def rearm(self, item: Watch) -> None:
        """The deadline may have moved earlier (only after a hold): schedule it again."""
        with self._lock:
            if not item.done:
                item._generation += 1
                self._push(item)

    def finish(self, item: Watch) -> None:
        """The call ended: its deadlines never fire (entries are dropped lazily)."""
        with self._lock:
            if item.done:
                return
            item.done = True
            self.active -= 1
            if self.active == 0 or len(self._heap) > 64 + 4 * self.active:
                self._heap[:] = [entry for entry in self._heap if not entry[3].done]  # in place: the thread holds it
                heapq.heapify(self._heap)
                self._wake.notify()  # nothing left: the thread may end now

    @property
    def alive(self) -> bool:
        """Whether the thread runs (for tests: it ends once no call is watched)."""
        with self._lock:
            return self._thread is not None

    def _forget_after_fork(self) -> None:
        """A forked child has no watcher thread, whatever the parent had."""
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap, self.active, self._thread = [], 0, None

    def _push(self, item: Watch) -> None:
        when = item.due()  # while held, the cap (finite): the end of the hold re-arms it
        heapq.heappush(self._heap, (when, next(self._order), item._generation, item))
        if self._heap[0][3] is item:  # earlier than what the thread sleeps towards
            self._wake.notify()

    # --- the watcher thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                expired = self._next_expired()
                if expired is None:
                    self._thread = None
                    return
            _fire(expired)

    def _next_expired(self) -> Optional[Watch]:
        """Wait (lock held) for the next watch whose deadline passed; None once nothing is watched."""
        heap = self._heap
        while self.active:
            if not heap:
                self._wake.wait()
                continue
            when, _, generation, item = heap[0]
            now = time.monotonic()
            if when > now:
                self._wake.wait(when - now)
                continue
            heapq.heappop(heap)
            if item.done or generation != item._generation or item.token.is_set():
                continue  # ended, re-armed since, or already cancelled by its caller
            due = item.due()
            if due > now:  # it moved (a meaningful chunk came) or it is held: re-arm, do not fire
                self._push(item)
                continue
            item.fired = CAP if now >= item.cap_deadline else IDLE
            item.fired_at = now
            return item
        heap.clear()
        return None


def _fire(item: Watch) -> None:
    item.token.set()  # outside the lock: the client's abort shuts the socket down


_watcher = DeadlineWatcher()
if hasattr(os, "register_at_fork"):  # a pre-forking server (gunicorn --preload) forks after a call
    os.register_at_fork(after_in_child=_watcher._forget_after_fork)


def watcher() -> DeadlineWatcher:
    """The process's watcher (tests look at :attr:`DeadlineWatcher.alive`)."""
    return _watcher


@contextmanager
def watch(token: CancelToken, idle_s: float, cap_s: float, started: Optional[float] = None) -> Iterator[Watch]:
    """Watch one call while the block runs in this thread: on a deadline, ``token`` is set."""
    item = Watch(token, idle_s, time.monotonic() if started is None else started, cap_s)
    previous = getattr(_current, "watch", None)
    _watcher.add(item)
    _current.watch = item
    try:
        yield item
    finally:
        _current.watch = previous
        _watcher.finish(item)


def watched_here() -> bool:
    """Whether the calling thread streams a call the watcher keeps (so :func:`held` has a clock to stop)."""
    return getattr(_current, "watch", None) is not None


@contextmanager
def held() -> Iterator[None]:
    """The calling thread waits for its consumer: stop its call's idle clock meanwhile.

    Free when the thread streams no call.  On leaving, the idle deadline is
    restored plus the time held, and re-armed (it may be earlier than what the
    watcher scheduled while the clock stood still).
    """
    item: Optional[Watch] = getattr(_current, "watch", None)
    if item is None or item.idle_deadline == _NEVER:
        yield
        return
    saved = item.idle_deadline
    started = time.monotonic()
    item.idle_deadline = _NEVER
    try:
        yield
    finally:
        item.idle_deadline = saved + (time.monotonic() - started)
        _watcher.rearm(item)
