"""One submitted tool call: a small state machine modelled on ``concurrent.futures.Future``.

::

    PENDING --start_running()--> RUNNING --finish()--> FINISHED (the function returned or raised)
       |
       +--cancel() / queue limit / refuse() (shutdown, busy)--> CANCELLED (the function never ran)

The state says what the *function* did; the *result* is fixed separately and
once: by the function returning before its deadline, by the deadline (a later
real result is discarded), or by a refusal before it started.
:class:`ToolHandle` is what the owner of a call holds (wait, cancel, hear
the result); the executor drives the transitions with this module's
functions (``start_running``, ``finish``, ``refuse``, ``abandon``, ``expire``).

The deadline counts from the moment the function is entered (or, for a
remote executor, handed over), not from submit: time spent waiting for a free
worker is bounded separately by the executor's ``queue_timeout``.

A call whose function never ran because the pool could not take it or it was
cancelled first says so in :attr:`ToolHandle.skipped` (``"pool_busy"``,
``"cancelled"``): not a failure of the tool, and not a call that started.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .._cancel import CancelToken, no_callback, on_cancel
from .._messages import ToolCall, ToolResult
from ._tool import Tool

PENDING, RUNNING, FINISHED, CANCELLED = "pending", "running", "finished", "cancelled"

#: Why a call's function never ran (:attr:`ToolHandle.skipped`): the pool was busy, or it was cancelled first.
POOL_BUSY, CANCELLED_FIRST = "pool_busy", "cancelled"


def seconds(value: float) -> str:
    """``0.1`` / ``10`` / ``2.5``: seconds as a person writes them."""
    return f"{round(value, 3):g}"


class ToolHandle:
    """One submitted call: wait for its :class:`ToolResult`, or cancel it.  ``result()`` never raises."""

    def __init__(self, tool: Optional[Tool], call: ToolCall, args: Dict[str, Any], timeout: float, *,
                 queue_timeout: float = 0.0, on_start: Optional[Callable[[ToolHandle], None]] = None,
                 owner: Any = None, log: Any = None) -> None:
        self.call = call
        self.tool = tool
        self.args = args
        self.owner = owner
        self.timeout = timeout
        self.submitted_at = time.monotonic()
        self.queue_limit = self.submitted_at + queue_timeout  # not started by then: refused as busy
        self.started_at: Optional[float] = None  # monotonic: the function was entered (or handed over)
        self.queue_wait_s = 0.0
        self.cancel_event = CancelToken()
        self.busy_reason = "all workers were in use"
        self._on_start = on_start
        self._log = log
        self._state = PENDING
        self._result: Optional[ToolResult] = None
        #: Set with the result when the function never ran: ``"pool_busy"`` or ``"cancelled"`` (None: it ran,
        #: or its arguments were refused).  A busy call may be asked for again; it is no duplicate.
        self.skipped: Optional[str] = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        # Notified when the call starts and when its result is fixed: a waiter
        # that slept towards the queue limit wakes to wait for the real deadline.
        self._changed = threading.Condition(self._lock)
        self._unlink: Callable[[], None] = no_callback
        self._external: Optional[threading.Event] = None  # the caller's cancel event
        self._callbacks: List[Callable[[ToolHandle], None]] = []

    @property
    def state(self) -> str:
        """``pending``, ``running``, ``finished`` or ``cancelled`` (what the function did)."""
        return self._state

    @property
    def deadline(self) -> float:
        """Monotonic time the result is fixed by: start + timeout (before the start, the latest it can be)."""
        started = self.started_at
        return (started if started is not None else self.queue_limit) + self.timeout

    @property
    def next_limit(self) -> float:
        """When :meth:`done` may turn true by itself (monotonic): the queue limit while pending, else the deadline.

        A caller that polls for lapsed calls should wake at this, not at
        :attr:`deadline` (which, before the start, is only an upper bound).
        """
        return self.queue_limit if self._state == PENDING else self.deadline

    def result(self, timeout: Optional[float] = None) -> ToolResult:
        """Wait for the result, at most until the deadline (or ``timeout`` seconds, if sooner).

        When the wait ends first, the call is given up: the result is the
        error ``tool 'NAME' timed out after Ns``, the tool's cancel flag is
        set, and whatever it returns later is discarded.  Use :meth:`wait` to
        poll without giving up.
        """
        give_up_at = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self._wait_step(give_up_at):
            now = time.monotonic()
            if give_up_at is not None and now >= give_up_at:
                self._time_out(now, early=True)
        assert self._result is not None
        return self._result

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (never past the deadline) without giving up early; True when done."""
        until = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self._wait_step(until):
            if until is not None and time.monotonic() >= until:
                return self.done()
        return True

    def done(self) -> bool:
        """True once the result is fixed (a passed deadline or queue limit fixes it)."""
        if not self._done.is_set():
            expire(self, time.monotonic())
        return self._done.is_set()

    def running(self) -> bool:
        return self._state == RUNNING and not self._done.is_set()

    def add_done_callback(self, fn: Callable[[ToolHandle], None]) -> None:
        """Call ``fn(handle)`` once the result is fixed (at once if it already is).

        It runs in the thread that fixed the result: the worker when the tool
        returned, the waiting thread for a timeout or cancel.  Keep it short;
        an exception in it is logged, never raised.
        """
        with self._lock:
            if self._result is None:
                self._callbacks.append(fn)
                return
        self._safely(fn, "done callback")

    def cancel(self) -> bool:
        """Cancel: a pending call never runs (True); a running one gets its cancel flag (False)."""
        self.cancel_event.set()
        with self._lock:
            if self._state != PENDING or self._result is not None:
                return False
            self._state = CANCELLED
        self._settle(_cancelled_result(self.call), CANCELLED_FIRST)
        return True

    def __repr__(self) -> str:
        return f"ToolHandle({self.call.name!r}, id={self.call.id!r}, state={self._state})"

    # -- internal (this module's functions drive the transitions)

    def _wait_step(self, until: Optional[float]) -> bool:
        """Wait until the next limit (queue limit, deadline or ``until``), enforce it; True when done."""
        with self._lock:
            if self._result is None:
                limit = self.next_limit
                if until is not None:
                    limit = min(limit, until)
                self._changed.wait(min(max(0.0, limit - time.monotonic()), threading.TIMEOUT_MAX))
            if self._result is not None:
                return True
        expire(self, time.monotonic())
        return self._done.is_set()

    def _time_out(self, now: float, early: bool = False) -> bool:
        started = self.started_at or 0.0
        waited = now - (started or self.submitted_at)
        shown = waited if early and now < self.deadline else self.timeout
        with self._lock:
            if self._state == PENDING:
                self._state = CANCELLED  # given up while queued: it never runs
        result = ToolResult.error_result(
            self.call, f"tool '{self.call.name}' timed out after {seconds(shown)}s",
            duration_s=(now - started) if started else 0.0, started_at=started, ended_at=now, timed_out=True,
            queue_wait_s=self.queue_wait_s)
        if not self._settle(result):
            return False
        self.cancel_event.set()
        if self._log is not None:
            where = ("while running; it is abandoned with its cancel flag set" if self._state == RUNNING
                     else "before it started")
            self._log.warning("tool {!r} (call {}) timed out after {}s {}", self.call.name, self.call.id,
                              seconds(shown), where)
        return True

    def _settle(self, result: ToolResult, skipped: Optional[str] = None) -> bool:
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            self.skipped = skipped
            self._done.set()
            self._changed.notify_all()
            # ``on_start`` (the dispatcher's, which holds this handle) goes with the result; the
            # caller's cancel lets go of our ``cancel`` when unlinked (a remover is used once).
            unlink, callbacks, self._callbacks = self._unlink, self._callbacks, []
            self._on_start = None
        unlink()
        for fn in callbacks:
            self._safely(fn, "done callback")
        return True

    def _safely(self, fn: Callable[[ToolHandle], None], what: str) -> None:
        try:
            fn(self)
        except Exception as exc:
            if self._log is not None:
                self._log.opt(exception=exc).warning("{} of tool {!r} (call {}) failed: {}", what, self.call.name,
                                                     self.call.id, exc)


# --- the executor's side: the transitions -------------------------------------------------------------------

def refused(tool: Optional[Tool], call: ToolCall, message: str, log: Any = None,
            skipped: Optional[str] = None) -> ToolHandle:
    """A handle that is already done with an error: the function never runs (``skipped``: why, if not a fault)."""
    handle = ToolHandle(tool, call, {}, 0.0, log=log)
    refuse(handle, message, skipped)
    return handle


def follow_cancel(handle: ToolHandle, event: Optional[threading.Event]) -> None:
    """The call follows the caller's cancel event until its result is fixed."""
    if event is None:
        return
    handle._external = event

    def cancel() -> None:
        handle.cancel()
    stop = on_cancel(event, cancel)
    with handle._lock:
        if handle._result is None:
            handle._unlink = stop
            return
    stop()


def start_running(handle: ToolHandle) -> bool:
    """PENDING -> RUNNING and fire ``on_start``; False (and a settled result) if it must not start."""
    now = time.monotonic()
    cancelled = handle.cancel_event.is_set() or (handle._external is not None and handle._external.is_set())
    with handle._lock:
        if handle._state != PENDING or handle._result is not None:
            return False
        on_start = handle._on_start  # taken with the state: a result fixed from now on drops it
        if not cancelled and now < handle.queue_limit:
            handle._state = RUNNING
            handle.started_at = now
            handle.queue_wait_s = now - handle.submitted_at
            handle._changed.notify_all()
        else:
            handle._state = CANCELLED
    if handle._state == CANCELLED:  # a plain Event's watcher may not have fired yet: never start a cancelled call
        if cancelled:
            handle._settle(_cancelled_result(handle.call), CANCELLED_FIRST)
        else:
            handle._settle(_busy_result(handle, now), POOL_BUSY)
        return False
    if on_start is not None:
        handle._safely(on_start, "on_start hook")
    return True


def finish(handle: ToolHandle, result: ToolResult) -> None:
    """RUNNING -> FINISHED: keep the function's result only if it came before the deadline."""
    handle._state = FINISHED
    if result.ended_at > handle.deadline and not handle._done.is_set():
        handle._time_out(result.ended_at)
    result = _with_queue_wait(result, handle.queue_wait_s)
    if not handle._settle(result) and handle._log is not None:
        handle._log.info("tool {!r} (call {}) returned after it was given up; result discarded",
                         handle.call.name, handle.call.id)


def refuse(handle: ToolHandle, message: str, skipped: Optional[str] = None) -> bool:
    """PENDING -> CANCELLED with an error result (shutdown, exhausted pool); False if too late.

    ``skipped`` (:data:`POOL_BUSY`, :data:`CANCELLED_FIRST`) says the call was not at fault:
    None for arguments the tool refused.
    """
    with handle._lock:
        if handle._state != PENDING or handle._result is not None:
            return False
        handle._state = CANCELLED
    return handle._settle(ToolResult.error_result(handle.call, message), skipped)


def abandon(handle: ToolHandle, message: str) -> bool:
    """Fix an error result for a running call nobody will wait for (a remote call given up)."""
    now = time.monotonic()
    started = handle.started_at or now
    return handle._settle(ToolResult.error_result(handle.call, message, duration_s=now - started,
                                                  started_at=started, ended_at=now,
                                                  queue_wait_s=handle.queue_wait_s))


def is_given_up(handle: ToolHandle, now: float, grace: float, flagged_before: Optional[float] = None) -> bool:
    """Running past its deadline, or flagged ``grace`` seconds ago (before ``flagged_before``) and still running."""
    if handle._state == RUNNING and (now >= handle.deadline or handle._done.is_set()):
        return True
    flagged = handle.cancel_event.set_at
    return (flagged is not None and now >= flagged + grace
            and (flagged_before is None or flagged < flagged_before))


def expire(handle: ToolHandle, now: float) -> None:
    """Fix the result a passed limit gives: busy past the queue limit, timed out past the deadline."""
    if handle._state == PENDING and now >= handle.queue_limit:
        with handle._lock:
            if handle._state != PENDING or handle._result is not None:
                return
            handle._state = CANCELLED
        handle._settle(_busy_result(handle, now), POOL_BUSY)
    elif handle._state == RUNNING and now >= handle.deadline and not handle._done.is_set():
        handle._time_out(now)


def _busy_result(handle: ToolHandle, now: float) -> ToolResult:
    # The limit, not the measured wait, in the message: the model reads the rule, not scheduler jitter.
    waited = now - handle.submitted_at
    limit = handle.queue_limit - handle.submitted_at
    return ToolResult.error_result(
        handle.call, f"tool '{handle.call.name}' not started: the tool pool was busy for {seconds(limit)}s "
                     f"({handle.busy_reason}); try again later", queue_wait_s=waited)


def _cancelled_result(call: ToolCall) -> ToolResult:
    return ToolResult.error_result(call, f"tool '{call.name}' cancelled before it started")


def _with_queue_wait(result: ToolResult, queue_wait_s: float) -> ToolResult:
    if result.queue_wait_s == queue_wait_s:
        return result
    return ToolResult(result.call_id, result.name, result.ok, result.text, result.error, result.duration_s,
                      result.started_at, result.ended_at, result.timed_out, queue_wait_s)
