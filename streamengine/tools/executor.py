"""The pool that runs tools: own daemon threads, deadlines, abandonment.

Tools run on the executor's own daemon threads rather than a
``concurrent.futures.ThreadPoolExecutor``.  A hung tool cannot be killed in
Python; the stdlib pool joins its workers at interpreter exit (bpo-39812), so
one stuck tool would hang the host's shutdown.  Here a tool past its deadline
is abandoned with its cancel flag set, its slot stays counted until the
function really returns, and when every slot is stuck a new call gets an
immediate error instead of waiting in a queue forever.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from ..cancel import CancelToken, on_cancel
from ..errors import ConfigError, ToolError
from ..logs import component_logger
from ..messages import ToolCall, ToolContext, ToolResult
from .tool import Tool
from .tool import _check_timeout

# --------------------------------------------------------------------------- executor

_QUEUED, _RUNNING, _FINISHED, _DROPPED = "queued", "running", "finished", "dropped"


def _effective_timeout(tool: Tool, timeout: Optional[float]) -> float:
    chosen = tool.timeout if tool.timeout is not None else timeout
    if chosen is None:
        raise ConfigError(f"no timeout for tool {tool.name!r}: pass timeout= to submit() or to @tool")
    try:
        checked = _check_timeout(chosen, f"the call to tool {tool.name!r}")
    except ToolError as exc:
        raise ConfigError(str(exc)) from exc
    assert checked is not None
    return checked


def _fallback_log() -> Any:
    return component_logger("streamengine.tools.ToolHandle")


def _seconds(value: float) -> str:
    return f"{round(value, 3):g}"


class ToolHandle:
    """One submitted call: wait for its :class:`ToolResult`, or cancel it.

    The result is fixed once: by the function returning before its deadline,
    or by the deadline (a later real result is discarded), or by a cancel
    before it started.  ``result()`` never raises.
    """

    def __init__(self, executor: Optional["ToolExecutor"], tool: Optional[Tool], call: ToolCall,
                 args: Dict[str, Any], timeout: float, on_start: Optional[Callable[["ToolHandle"], None]]) -> None:
        self.call = call
        self.tool = tool
        self.timeout = timeout
        self.submitted_at = time.monotonic()
        self.deadline = self.submitted_at + timeout
        self.started_at: Optional[float] = None  # monotonic, the instant the function is entered
        self.cancel_event = CancelToken()
        self._executor = executor
        self._args = args
        self._on_start = on_start
        self._state = _QUEUED
        self._abandoned = False  # the deadline passed while the function ran
        # When the cancel flag went up (monotonic): a running tool that has not
        # returned a grace period later is ignoring it, and its slot is stuck.
        self.cancelled_at: Optional[float] = None
        self.cancel_event.add_callback(self._note_cancel)
        self._result: Optional[ToolResult] = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._unlink: Callable[[], None] = lambda: None
        self._external: Optional[threading.Event] = None  # the caller's cancel event
        self._callbacks: List[Callable[["ToolHandle"], None]] = []

    @classmethod
    def _settled(cls, tool: Optional[Tool], call: ToolCall, result: ToolResult) -> "ToolHandle":
        handle = cls(None, tool, call, {}, 0.0, None)
        handle._state = _DROPPED
        handle._settle(result)
        return handle

    # -- public

    def result(self, timeout: Optional[float] = None) -> ToolResult:
        """Wait for the result, at most until the deadline (or ``timeout`` seconds, if sooner).

        When the wait ends first, the call is given up: the result is the
        error ``tool 'NAME' timed out after Ns``, the tool's cancel flag is
        set, and whatever it returns later is discarded.  Use :meth:`wait` to
        poll without giving up.
        """
        now = time.monotonic()
        limit = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        if not self._done.wait(min(max(0.0, limit - now), threading.TIMEOUT_MAX)):
            self._expire(max(time.monotonic(), limit))  # a wait may wake a hair early
        assert self._result is not None
        return self._result

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (never past the deadline) without giving up early; True when done.

        Unlike :meth:`result`, a ``timeout`` that ends before the deadline
        leaves the call running: use it to poll, e.g. to send heartbeats.
        """
        now = time.monotonic()
        limit = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        if self._done.wait(min(max(0.0, limit - now), threading.TIMEOUT_MAX)):
            return True
        return self.done()

    def done(self) -> bool:
        """True once the result is fixed (a passed deadline fixes it as a timeout)."""
        if self._done.is_set():
            return True
        if time.monotonic() >= self.deadline:
            self._expire(time.monotonic())
            return True
        return False

    def add_done_callback(self, fn: Callable[["ToolHandle"], None]) -> None:
        """Call ``fn(handle)`` once the result is fixed (at once if it already is).

        It runs in the thread that fixed the result: the worker when the tool
        returned, the waiting thread for a timeout or cancel.  Keep it short;
        an exception in it is logged, never raised.
        """
        with self._lock:
            if self._result is None:
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def running(self) -> bool:
        return self._state == _RUNNING and not self._done.is_set()

    def cancel(self) -> bool:
        """Cancel: a queued call never runs (True); a running one gets its cancel flag (False)."""
        self.cancel_event.set()
        executor = self._executor
        return executor._dequeue(self) if executor is not None else False

    def __repr__(self) -> str:
        return f"ToolHandle({self.call.name!r}, id={self.call.id!r}, state={self._state})"

    # -- internal, called by the executor

    def _cancel_callback(self) -> None:
        """:meth:`cancel` as a cancel callback, which returns nothing."""
        self.cancel()

    def _note_cancel(self) -> None:
        self.cancelled_at = time.monotonic()

    def _given_up(self, now: float, grace: float, flagged_before: Optional[float] = None) -> bool:
        """Past its deadline, or flagged ``grace`` seconds ago (before ``flagged_before``) and still running."""
        if self._abandoned or now >= self.deadline:
            return True
        flagged = self.cancelled_at
        return (flagged is not None and now >= flagged + grace
                and (flagged_before is None or flagged < flagged_before))

    def _settle(self, result: ToolResult) -> bool:
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            self._done.set()
            unlink, callbacks, self._callbacks = self._unlink, self._callbacks, []
        unlink()
        for fn in callbacks:
            self._run_callback(fn)
        return True

    def _run_callback(self, fn: Callable[["ToolHandle"], None]) -> None:
        try:
            fn(self)
        except Exception as exc:
            log = self._executor._log if self._executor is not None else _fallback_log()
            log.opt(exception=exc).warning("done callback of tool {!r} (call {}) failed: {}",
                                           self.call.name, self.call.id, exc)

    def _link(self, stop: Callable[[], None]) -> None:
        with self._lock:
            if self._result is None:
                self._unlink = stop
                return
        stop()

    def _claim(self) -> bool:
        """Queued -> running, unless settled, cancelled or past the deadline (caller holds the pool lock)."""
        now = time.monotonic()
        cancelled = self.cancel_event.is_set() or (self._external is not None and self._external.is_set())
        with self._lock:
            if self._result is not None or self._state != _QUEUED:
                return False
            if now < self.deadline and not cancelled:
                self._state = _RUNNING
                return True
            self._state = _DROPPED
        if cancelled:  # a plain Event's watcher may not have fired yet: never start a cancelled call
            self._settle(ToolResult.error_result(self.call, f"tool '{self.call.name}' cancelled before it started"))
        else:
            self._expire(now)  # waited in the queue past its deadline: it never runs
        return False

    def _expire(self, now: float) -> None:
        waited = now - self.submitted_at
        seconds = self.timeout if now >= self.deadline else waited
        name = self.tool.name if self.tool is not None else self.call.name
        started = self.started_at or 0.0
        result = ToolResult.error_result(
            self.call, f"tool '{name}' timed out after {_seconds(seconds)}s",
            duration_s=(now - started) if started else 0.0, started_at=started, ended_at=now, timed_out=True,
        )
        if self._settle(result):
            self._abandoned = self._state == _RUNNING
            self.cancel_event.set()
            if self._executor is not None:
                self._executor._log_timeout(self, seconds)

    def _complete(self, result: ToolResult) -> None:
        """The function returned: keep its result only if it came before the deadline."""
        if result.ended_at > self.deadline and not self._done.is_set():
            self._expire(result.ended_at)
        if not self._settle(result) and self._executor is not None:
            self._executor._log.info("tool {!r} (call {}) returned after it was given up; result discarded",
                                     self.call.name, self.call.id)


class _Worker:
    __slots__ = ("thread", "wakeup", "task", "current", "exit")

    def __init__(self, lock: threading.Lock) -> None:
        self.thread: Optional[threading.Thread] = None
        self.wakeup = threading.Condition(lock)
        self.task: Optional[ToolHandle] = None  # handed over, not yet claimed
        self.current: Optional[ToolHandle] = None  # running now
        self.exit = False


class ToolExecutor:
    """Runs tool calls on up to ``max_workers`` daemon threads, each with a deadline.

    Threads start lazily and exit after ``idle_exit_s`` without work.  A
    submit with an idle worker hands the call over with one condition
    notify.  Workers stuck in timed-out tools keep their slot until the
    function returns; when all are stuck, ``submit`` answers at once with an
    error result rather than queueing a call that could never start.

    A tool that was *cancelled* (its run was cancelled, e.g. the browser went
    away) but is still running ``cancel_grace_s`` seconds later is ignoring
    its flag: its slot counts as stuck from then on, not only from its
    deadline.  Otherwise a few abandoned runs whose tools hang would make
    every later call wait in the queue for up to its whole deadline.
    """

    _ids = itertools.count(1)

    #: Seconds a cancelled, still running tool gets to notice its flag before its slot counts as stuck.
    cancel_grace_s: float = 1.0

    def __init__(self, max_workers: int = 8, idle_exit_s: float = 5.0, logger: Any = None) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"max_workers must be a positive integer, got {max_workers!r}")
        if not isinstance(idle_exit_s, (int, float)) or not idle_exit_s > 0:
            raise ConfigError(f"idle_exit_s must be a positive number of seconds, got {idle_exit_s!r}")
        self.max_workers = max_workers
        self.idle_exit_s = float(idle_exit_s)
        self._log = component_logger("streamengine.tools.ToolExecutor", logger)
        self._lock = threading.Lock()
        self._queue: Deque[ToolHandle] = deque()
        self._idle: List[_Worker] = []  # LIFO: the warmest thread gets the work, the others can retire
        self._workers: Set[_Worker] = set()
        self._threads: List[threading.Thread] = []
        self._shutdown = False
        self._pool_id = next(self._ids)
        self._thread_ids = itertools.count(1)

    # -- public

    def submit(
        self,
        tool: Tool,
        call: ToolCall,
        timeout: Optional[float] = None,
        cancel: Optional[threading.Event] = None,
        *,
        on_start: Optional[Callable[[ToolHandle], None]] = None,
    ) -> ToolHandle:
        """Start ``call`` on ``tool``; never raises for the call's own faults.

        ``timeout`` is the deadline for tools that declare none (a tool's own
        ``timeout`` wins), counted from now.  Invalid arguments, a cancel
        already set, a shut-down or exhausted pool give an already-done handle
        with an error result; the function never runs.  ``on_start(handle)``
        runs on the worker just before the function is entered.
        """
        tool = Tool.from_function(tool)
        effective = _effective_timeout(tool, timeout)
        try:
            args = tool.validate(call.args())
        except ToolError as exc:
            return ToolHandle._settled(tool, call, ToolResult.error_result(call, str(exc)))
        if cancel is not None and cancel.is_set():
            return ToolHandle._settled(
                tool, call, ToolResult.error_result(call, f"tool '{tool.name}' cancelled before it started"))
        handle = ToolHandle(self, tool, call, args, effective, on_start)
        handle._external = cancel
        refusal, spawn = self._place(handle)
        if refusal is not None:
            handle._state = _DROPPED
            handle._settle(ToolResult.error_result(call, refusal))
            return handle
        if spawn is not None:
            self._start(spawn, handle)
        if cancel is not None:
            handle._link(on_cancel(cancel, handle._cancel_callback))
        return handle

    def shutdown(self, wait: bool = True, timeout: float = 5.0) -> None:
        """Refuse new calls, cancel queued ones, flag running ones, let idle threads go.

        With ``wait``, join the threads of running, not-stuck tools for up to
        ``timeout`` seconds in all; threads stuck in timed-out tools are never
        waited for (they are daemons and end when their function returns).
        """
        with self._lock:
            self._shutdown = True
            queued = list(self._queue) + [w.task for w in self._workers if w.task is not None]
            self._queue.clear()
            for handle in queued:
                handle._state = _DROPPED
            for worker in self._idle:
                worker.exit = True
                worker.wakeup.notify()
            self._idle.clear()
            running = [w.current for w in self._workers if w.current is not None]
            workers = list(self._workers)
        for handle in queued:
            handle._settle(ToolResult.error_result(
                handle.call, f"tool '{handle.call.name}' cancelled: the tool executor shut down before it started"))
        began = time.monotonic()
        for handle in running:
            handle.cancel_event.set()
        if wait:
            self._join(workers, began + max(0.0, timeout), began)

    def threads_alive(self) -> int:
        """Worker threads still alive (stuck ones included); for tests and health checks."""
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            return len(self._threads)

    def stuck_workers(self) -> int:
        """Workers running a tool whose deadline has passed, or that ignores its cancel flag."""
        with self._lock:
            return len(self._stuck(time.monotonic()))

    def __enter__(self) -> "ToolExecutor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(wait=True)

    # -- placement

    def _place(self, handle: ToolHandle) -> Tuple[Optional[str], Optional[_Worker]]:
        """Hand to an idle worker, or reserve a new one, or queue; else say why not."""
        expired: List[ToolHandle] = []
        try:
            with self._lock:
                if self._shutdown:
                    return (f"tool '{handle.call.name}' not started: the tool executor is shut down; "
                            "create a new one"), None
                if self._idle:
                    worker = self._idle.pop()
                    worker.task = handle
                    worker.wakeup.notify()
                    return None, None
                if len(self._workers) < self.max_workers:
                    worker = _Worker(self._lock)
                    worker.task = handle
                    self._workers.add(worker)
                    return None, worker
                now = time.monotonic()
                stuck = self._stuck(now)
                # Only those past their deadline get a timeout result now; a
                # cancelled one keeps waiting for its function (or deadline).
                expired = [h for h in stuck if now >= h.deadline]
                if len(stuck) >= self.max_workers:
                    return (f"tool pool exhausted: all {self.max_workers} workers are stuck in tools that "
                            "timed out or ignored a cancel; try again later"), None
                self._queue.append(handle)
                return None, None
        finally:
            for late in expired:  # fix their results and raise their flags outside the lock
                late._expire(time.monotonic())
                late.cancel_event.set()

    def _stuck(self, now: float) -> List[ToolHandle]:
        grace = self.cancel_grace_s
        return [w.current for w in self._workers
                if w.current is not None and w.current._given_up(now, grace)]

    def _start(self, worker: _Worker, first: ToolHandle) -> None:
        thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                  name=f"streamengine-tool-{self._pool_id}-{next(self._thread_ids)}")
        worker.thread = thread
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": the host is out of threads
            with self._lock:
                self._workers.discard(worker)
            first._state = _DROPPED
            first._settle(ToolResult.error_result(first.call, f"tool '{first.call.name}' not started: could not "
                                                  f"start a worker thread ({exc}); try again later"))
            return
        with self._lock:
            # Pruned here, not only in threads_alive(): idle threads retire and new
            # ones start all day in a server, and a list of every thread ever
            # started is a slow leak.
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    def _dequeue(self, handle: ToolHandle) -> bool:
        with self._lock:
            if handle._state != _QUEUED or handle._done.is_set():
                return False
            handle._state = _DROPPED
            try:
                self._queue.remove(handle)
            except ValueError:
                pass  # handed to a worker that has not claimed it: the claim will fail
        return handle._settle(ToolResult.error_result(handle.call, f"tool '{handle.call.name}' cancelled before it "
                                                      "started"))

    # -- worker side

    def _work(self, worker: _Worker) -> None:
        try:
            with self._lock:
                task = self._claim(worker, worker.task)
            while True:
                if task is not None:
                    self._run(task)
                task = self._next(worker)
                if worker.exit:
                    return
        finally:
            with self._lock:
                self._workers.discard(worker)
                if worker in self._idle:
                    self._idle.remove(worker)

    def _claim(self, worker: _Worker, task: Optional[ToolHandle]) -> Optional[ToolHandle]:
        worker.task = None
        if task is not None and task._claim():
            worker.current = task
            return task
        return None

    def _next(self, worker: _Worker) -> Optional[ToolHandle]:
        """Finish the bookkeeping of the last task and wait for the next (None: idle round or exit)."""
        with self._lock:
            if worker.current is not None:
                worker.current._state = _FINISHED
                worker.current = None
            while self._queue:
                task = self._claim(worker, self._queue.popleft())
                if task is not None:
                    return task
            if self._shutdown:
                worker.exit = True
                return None
            self._idle.append(worker)
            retire_at = time.monotonic() + self.idle_exit_s
            while worker.task is None and not worker.exit:
                left = retire_at - time.monotonic()
                if left <= 0:
                    self._idle.remove(worker)
                    worker.exit = True
                    return None
                worker.wakeup.wait(left)
            return self._claim(worker, worker.task)

    def _run(self, handle: ToolHandle) -> None:
        tool = handle.tool
        assert tool is not None
        context = ToolContext(handle.cancel_event, handle.deadline)
        handle.started_at = started = time.monotonic()
        if handle._on_start is not None:
            self._safely_call(handle._on_start, handle)
        try:
            text = tool._invoke(handle._args, context)
        except BaseException as exc:  # a worker must outlive any tool; SystemExit included
            ended = time.monotonic()
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._log.opt(exception=exc).warning("tool {!r} (call {}) raised {}", tool.name, handle.call.id, message)
            result = ToolResult.error_result(handle.call, f"tool '{tool.name}' failed: {message}",
                                             duration_s=ended - started, started_at=started, ended_at=ended)
        else:
            ended = time.monotonic()
            result = ToolResult(handle.call.id, handle.call.name, True, text, None, ended - started, started, ended)
        handle._complete(result)

    def _safely_call(self, hook: Callable[[ToolHandle], None], handle: ToolHandle) -> None:
        try:
            hook(handle)
        except Exception as exc:
            self._log.opt(exception=exc).warning("on_start hook of tool {!r} failed: {}", handle.call.name, exc)

    def _join(self, workers: List[_Worker], until: float, began: float) -> None:
        """Join each worker until ``until``, but stop waiting for one the moment its tool is stuck.

        A tool flagged by this shutdown gets the whole ``until``; one that was
        cancelled before it and ignored that for ``cancel_grace_s`` is stuck.
        """
        me = threading.current_thread()
        grace = self.cancel_grace_s
        for worker in workers:
            thread = worker.thread
            if thread is None or thread is me:
                continue
            while thread.is_alive():
                now, current = time.monotonic(), worker.current
                if now >= until or (current is not None and current._given_up(now, grace, began)):
                    break
                stop = until
                if current is not None:
                    stop = min(stop, current.deadline)
                    flagged = current.cancelled_at
                    if flagged is not None and flagged < began:
                        stop = min(stop, flagged + grace)
                thread.join(max(0.0, stop - now))

    def _log_timeout(self, handle: ToolHandle, seconds: float) -> None:
        where = "while running; its thread is abandoned with its cancel flag set" if handle._abandoned \
            else "before it started"
        self._log.warning("tool {!r} (call {}) timed out after {}s {}", handle.call.name, handle.call.id,
                          _seconds(seconds), where)

