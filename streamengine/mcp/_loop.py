"""The one event-loop thread per process that serves every MCP session.

The MCP SDK is async only; the engine is threads.  One asyncio loop on one
daemon thread carries every session of every :class:`McpServer` in the
process: a call from a tool is a coroutine submitted here and answered by a
``concurrent.futures.Future``, so no thread waits per call.  The loop starts
with the first server and ends with the last (a reference count), so after
the last ``close()`` no MCP thread remains.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Awaitable, Optional, TypeVar

T = TypeVar("T")

#: Seconds ``release`` waits for the loop's thread to end once the last user is gone.
_JOIN_S = 10.0


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), name="streamengine-mcp-loop",
                                       daemon=True)
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:  # whatever a session left behind is cancelled, not destroyed while pending
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            if left:
                self.loop.run_until_complete(asyncio.wait(left, timeout=_JOIN_S / 2))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_JOIN_S)


_lock = threading.Lock()
_current: Optional[_LoopThread] = None
_users = 0


def acquire() -> None:
    """Count one more user of the loop, starting its thread for the first."""
    global _current, _users
    with _lock:
        if _current is None:
            _current = _LoopThread()
        _users += 1


def release() -> None:
    """Count one user less; the last one stops the loop and joins its thread."""
    global _current, _users
    with _lock:
        _users -= 1
        if _users > 0 or _current is None:
            return
        ending, _current = _current, None
    ending.stop()


def submit(coro: Awaitable[T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the loop; cancelling the returned future cancels the coroutine's task."""
    loop = _current.loop if _current is not None else None
    if loop is None:
        close = getattr(coro, "close", None)
        if close is not None:
            close()  # never awaited: say nothing about it at garbage collection
        raise RuntimeError("the MCP event loop is not running: the server was closed")
    return asyncio.run_coroutine_threadsafe(coro, loop)  # type: ignore[arg-type]


def run(coro: Awaitable[T], timeout: Optional[float] = None) -> T:
    """Run ``coro`` on the loop and wait for its value (cancelled if ``timeout`` passes first)."""
    future = submit(coro)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


def in_loop_thread() -> bool:
    """True on the loop's own thread, where waiting on the loop would deadlock."""
    current = _current
    return current is not None and threading.current_thread() is current.thread


def alive() -> Any:
    """The loop's thread while it runs (for tests: none remains after the last close)."""
    current = _current
    return current.thread if current is not None else None
