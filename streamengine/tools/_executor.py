"""The pool that runs tools: own daemon threads, deadlines, fair sharing, abandonment.

Tools run on the executor's own daemon threads rather than a
``concurrent.futures.ThreadPoolExecutor``.  A hung tool cannot be killed in
Python; the stdlib pool joins its workers at interpreter exit (bpo-39812), so
one stuck tool would hang the host's shutdown.  Here a tool past its deadline
is abandoned with its cancel flag set, its slot stays counted until the
function really returns, and when every slot is stuck a new call gets an
immediate error instead of waiting in a queue forever.

Calls wait for a free worker in one queue per *owner* (a run): owners are
served in turn, FIFO within one, and no owner holds more than
``max_per_owner`` workers, so one run's burst or its stuck tools cannot
starve another run while slots remain.  A call waits at most
``queue_timeout`` seconds for a worker; its own deadline starts when it runs.

Tools declared ``@tool(executor="remote")`` go to the ``remote`` executor
given here (any ``concurrent.futures.Executor``); see :mod:`.remote`.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from .. import _validation as validation
from .._errors import ConfigError, ToolError
from .._logs import component_logger
from .._messages import ToolCall, ToolContext, ToolResult
from ._handle import (
    CANCELLED_FIRST,
    PENDING,
    POOL_BUSY,
    ToolHandle,
    expire,
    finish,
    follow_cancel,
    is_given_up,
    refuse,
    refused,
    start_running,
)
from ._remote_run import hand_over
from ._tool import Tool, ToolFailure


def _effective_timeout(tool: Tool, timeout: Optional[float]) -> float:
    """The tool's own timeout if it has one, else the caller's; one of them must be given."""
    chosen = tool.timeout if tool.timeout is not None else timeout
    if chosen is None:
        raise ConfigError(f"no timeout for tool {tool.name!r}: pass timeout= to submit() or to @tool")
    return validation.seconds(chosen, f"timeout of the call to tool {tool.name!r}")


class _Worker:
    __slots__ = ("current", "exit", "task", "thread", "wakeup")

    def __init__(self, lock: threading.Lock) -> None:
        self.thread: Optional[threading.Thread] = None
        self.wakeup = threading.Condition(lock)
        self.task: Optional[ToolHandle] = None  # handed over, not yet claimed
        self.current: Optional[ToolHandle] = None  # running now
        self.exit = False


class ToolExecutor:
    """Runs tool calls on up to ``max_workers`` daemon threads (started lazily), each with a deadline.

    Threads exit after ``idle_exit_s`` without work.  Workers stuck in
    timed-out tools keep their slot until the function returns; when all are
    stuck, ``submit`` answers at once with an error result.  A tool that was
    *cancelled* but is still running ``cancel_grace_s`` seconds later is
    ignoring its flag: its slot counts as stuck from then on.

    ``remote`` (any ``concurrent.futures.Executor``: ``ProcessPoolExecutor``,
    ``distributed.Client(...).get_executor()``) runs the tools declared
    ``executor="remote"``; without it they run on the local threads.  The
    remote executor is the caller's: ``shutdown`` leaves it running.
    """

    _ids = itertools.count(1)

    #: Seconds a cancelled, still running tool gets to notice its flag before its slot counts as stuck.
    cancel_grace_s: float = 1.0

    def __init__(self, max_workers: int = 32, idle_exit_s: float = 5.0, logger: Any = None, *,
                 queue_timeout: float = 10.0, max_per_owner: Optional[int] = None,
                 remote: Optional[concurrent.futures.Executor] = None) -> None:
        validation.count(max_workers, "max_workers", minimum=1)
        validation.seconds(idle_exit_s, "idle_exit_s")
        validation.seconds(queue_timeout, "queue_timeout")
        if max_per_owner is not None:
            validation.count(max_per_owner, "max_per_owner", minimum=1)
        if remote is not None and not callable(getattr(remote, "submit", None)):
            raise ConfigError(f"remote must be a concurrent.futures.Executor, got {type(remote).__name__}")
        self.max_workers = max_workers
        self.idle_exit_s = float(idle_exit_s)
        self.queue_timeout = float(queue_timeout)
        self.max_per_owner = max_per_owner
        self.remote = remote
        self._log = component_logger("streamengine.tools.ToolExecutor", logger)
        self._lock = threading.Lock()
        self._queues: OrderedDict[Any, Deque[ToolHandle]] = OrderedDict()  # owner -> calls; order = turn
        self._held: Dict[Any, int] = {}  # owner -> workers it holds (running or handed over)
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
        owner: Any = None,
    ) -> ToolHandle:
        """Start ``call`` on ``tool``; never raises for the call's own faults.

        ``timeout`` is the deadline for tools that declare none (a tool's own
        ``timeout`` wins), counted from the moment the function is entered.
        Invalid arguments, a cancel already set, a shut-down or exhausted
        pool give an already-done handle with an error result; the function
        never runs.  ``on_start(handle)`` runs on the worker just before the
        function is entered (for a remote tool: when it is handed over).
        ``owner`` (a run id) is the unit of fair sharing.
        """
        tool = Tool.from_function(tool)
        effective = _effective_timeout(tool, timeout)
        try:
            args = tool.validate(call.args())
        except ToolError as exc:
            return refused(tool, call, str(exc), self._log)
        if cancel is not None and cancel.is_set():
            return refused(tool, call, f"tool '{tool.name}' cancelled before it started", self._log,
                                      CANCELLED_FIRST)
        handle = ToolHandle(tool, call, args, effective, queue_timeout=self.queue_timeout, on_start=on_start,
                            owner=owner, log=self._log)
        follow_cancel(handle, cancel)
        if tool.starts_itself or (tool.remote_ref is not None and self.remote is not None):
            self._hand_over(handle, tool)
            return handle
        refusal, spawn = self._place(handle)
        if refusal is not None:
            refuse(handle, *refusal)
        elif spawn is not None:
            self._start(spawn, handle)
        return handle

    def shutdown(self, wait: bool = True, timeout: float = 5.0) -> None:
        """Refuse new calls, cancel queued ones, flag running ones, let idle threads go.

        With ``wait``, join the threads of running, not-stuck tools for up to
        ``timeout`` seconds in all; threads stuck in timed-out tools are never
        waited for (they are daemons and end when their function returns).
        """
        with self._lock:
            self._shutdown = True
            queued = [h for q in self._queues.values() for h in q] + \
                [w.task for w in self._workers if w.task is not None]
            self._queues.clear()
            for worker in self._idle:
                worker.exit = True
                worker.wakeup.notify()
            self._idle.clear()
            running = [w.current for w in self._workers if w.current is not None]
            workers = list(self._workers)
        for handle in queued:
            refuse(handle, f"tool '{handle.call.name}' cancelled: the tool executor shut down before it started",
                          CANCELLED_FIRST)
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

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(wait=True)

    # -- placement

    def _place(self, handle: ToolHandle) -> Tuple[Optional[Tuple[str, str]], Optional[_Worker]]:
        """Hand to an idle worker, or reserve a new one, or queue; else say why not (message, skip reason)."""
        late: List[ToolHandle] = []
        try:
            with self._lock:
                if self._shutdown:
                    return (f"tool '{handle.call.name}' not started: the tool executor is shut down; "
                            "create a new one", CANCELLED_FIRST), None
                owner = handle.owner
                if self.max_per_owner is not None and self._held.get(owner, 0) >= self.max_per_owner:
                    handle.busy_reason = f"its run already held its limit of {self.max_per_owner} workers"
                    self._enqueue(handle)
                    return None, None
                if self._idle:
                    worker = self._idle.pop()
                    self._assign(worker, handle)
                    worker.wakeup.notify()
                    return None, None
                if len(self._workers) < self.max_workers:
                    worker = _Worker(self._lock)
                    self._assign(worker, handle)
                    self._workers.add(worker)
                    return None, worker
                now = time.monotonic()
                stuck = self._stuck(now)
                late = stuck  # their timeout results are fixed outside the lock
                if len(stuck) >= self.max_workers:
                    return (f"tool pool exhausted: all {self.max_workers} workers are stuck in tools that "
                            "timed out or ignored a cancel; try again later", POOL_BUSY), None
                handle.busy_reason = f"all {self.max_workers} workers were in use"
                self._enqueue(handle)
                return None, None
        finally:
            for stuck_handle in late:
                expire(stuck_handle, time.monotonic())

    def _enqueue(self, handle: ToolHandle) -> None:
        queue = self._queues.get(handle.owner)
        if queue is None:
            queue = self._queues[handle.owner] = deque()
        queue.append(handle)

    def _assign(self, worker: _Worker, handle: ToolHandle) -> None:
        worker.task = handle
        self._held[handle.owner] = self._held.get(handle.owner, 0) + 1

    def _release(self, handle: ToolHandle) -> None:
        left = self._held.get(handle.owner, 0) - 1
        if left > 0:
            self._held[handle.owner] = left
        else:
            self._held.pop(handle.owner, None)

    def _next_queued(self) -> Optional[ToolHandle]:
        """The next call by turn: round-robin over owners under their limit, FIFO within one."""
        for _ in range(len(self._queues)):
            owner, queue = next(iter(self._queues.items()))
            self._queues.move_to_end(owner)
            while queue and queue[0].state != PENDING:
                queue.popleft()  # cancelled or refused while it waited (the queue limit is checked on claim)
            if not queue:
                del self._queues[owner]
                continue
            if self.max_per_owner is not None and self._held.get(owner, 0) >= self.max_per_owner:
                continue
            handle = queue.popleft()
            if not queue:
                del self._queues[owner]
            self._held[owner] = self._held.get(owner, 0) + 1
            return handle
        return None

    def _stuck(self, now: float) -> List[ToolHandle]:
        grace = self.cancel_grace_s
        return [w.current for w in self._workers
                if w.current is not None and is_given_up(w.current, now, grace)]

    def _start(self, worker: _Worker, first: ToolHandle) -> None:
        thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                  name=f"streamengine-tool-{self._pool_id}-{next(self._thread_ids)}")
        worker.thread = thread
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": the host is out of threads
            with self._lock:
                self._workers.discard(worker)
                self._release(first)
            refuse(first, f"tool '{first.call.name}' not started: could not start a worker thread ({exc}); "
                         "try again later", POOL_BUSY)
            return
        with self._lock:
            # Pruned here, not only in threads_alive(): idle threads retire and new
            # ones start all day in a server, and a list of every thread ever
            # started is a slow leak.
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    # -- worker side

    def _work(self, worker: _Worker) -> None:
        try:
            with self._lock:
                task, worker.task = worker.task, None
            while True:
                if task is not None:
                    self._run(worker, task)
                task = self._next(worker)
                if worker.exit:
                    return
        finally:
            with self._lock:
                self._workers.discard(worker)
                if worker in self._idle:
                    self._idle.remove(worker)

    def _next(self, worker: _Worker) -> Optional[ToolHandle]:
        """Wait for the next task (None: idle round or exit)."""
        with self._lock:
            task = self._next_queued()
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
            task, worker.task = worker.task, None
            return task

    def _run(self, worker: _Worker, handle: ToolHandle) -> None:
        """Run one claimed task; the worker's slot is the owner's until the function returns."""
        try:
            if not start_running(handle):
                return
            with self._lock:
                worker.current = handle
            finish(handle, self._call(handle))
        finally:
            with self._lock:
                worker.current = None
                self._release(handle)

    def _call(self, handle: ToolHandle) -> ToolResult:
        tool, call = handle.tool, handle.call
        assert tool is not None and handle.started_at is not None
        started = handle.started_at
        try:
            text = tool._invoke(handle.args, ToolContext(handle.cancel_event, handle.deadline))
        except BaseException as exc:  # a worker must outlive any tool; SystemExit included
            return self._failure(handle, exc, started, time.monotonic())
        ended = time.monotonic()
        return ToolResult(call.id, call.name, True, text, None, ended - started, started, ended)

    def _failure(self, handle: ToolHandle, exc: BaseException, started: float, ended: float) -> ToolResult:
        name, call_id = handle.call.name, handle.call.id
        if isinstance(exc, ToolFailure):
            self._log.warning("tool {!r} (call {}) failed: {}", name, call_id, exc)
            message = str(exc)
        else:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._log.opt(exception=exc).warning("tool {!r} (call {}) raised {}", name, call_id, detail)
            message = f"tool '{name}' failed: {detail}"
        return ToolResult.error_result(handle.call, message, duration_s=ended - started, started_at=started,
                                       ended_at=ended)

    # -- remote

    def _hand_over(self, handle: ToolHandle, tool: Tool) -> None:
        """Start the call off the worker threads (a remote executor, or the tool itself); its future settles it."""
        hand_over(handle, tool, self.remote, self._failure)

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
                if now >= until or (current is not None and is_given_up(current, now, grace, began)):
                    break
                stop = until
                if current is not None:
                    stop = min(stop, current.deadline)
                    flagged = current.cancel_event.set_at
                    if flagged is not None and flagged < began:
                        stop = min(stop, flagged + grace)
                thread.join(max(0.0, stop - now))
