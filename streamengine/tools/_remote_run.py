"""A tool call that runs off the executor's threads: on a remote executor, or started by the tool itself.

The remote executor is any ``concurrent.futures.Executor``.

The call "starts" when it is handed over (``tool_start`` then), its deadline
counts from there, and a deadline or cancel abandons it (``Future.cancel``).
The future's callback runs on a thread that is not ours (a pool's manager,
Dask's event loop): the result is fixed on a short-lived thread of its own,
so what the result triggers (its event, filing it in the RAG store) never
holds up other results.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Callable, Optional

from .._messages import ToolContext, ToolResult
from ._handle import ToolHandle, abandon, finish, start_running
from ._tool import RemoteCall, Tool, share_cancel_event

Failure = Callable[[ToolHandle, BaseException, float, float], ToolResult]


def hand_over(handle: ToolHandle, tool: Tool, remote: Optional[concurrent.futures.Executor], failure: Failure) -> None:
    """Start the call off the worker threads; its future settles the handle (``failure`` words an exception)."""
    if not start_running(handle):
        return
    started = handle.started_at
    assert started is not None
    try:
        future = _launch(handle, tool, remote)
    except Exception as exc:  # shut down, cannot pickle the arguments, cluster gone
        finish(handle, failure(handle, exc, started, time.monotonic()))
        return

    def give_up() -> None:  # deadline or cancel: the remote call is abandoned, its result fixed now
        future.cancel()
        abandon(handle, f"tool '{tool.name}' cancelled")

    forget_give_up = handle.cancel_event.add_callback(give_up)

    def settle(done: concurrent.futures.Future[str]) -> None:
        # A done future keeps its callbacks (this one, which holds the handle): the handle's hold on
        # the future goes, or the two are a cycle that only the garbage collector frees.
        forget_give_up()
        ended = time.monotonic()
        if done.cancelled():
            result = ToolResult.error_result(handle.call, f"tool '{tool.name}' cancelled",
                                             started_at=started, ended_at=ended, duration_s=ended - started)
        elif done.exception() is not None:
            result = failure(handle, done.exception(), started, ended)  # type: ignore[arg-type]
        else:
            result = ToolResult(handle.call.id, tool.name, True, done.result(), None, ended - started,
                                started, ended)
        threading.Thread(target=finish, args=(handle, result), name="streamengine-remote-result",
                         daemon=True).start()

    future.add_done_callback(settle)


def _launch(handle: ToolHandle, tool: Tool,
            remote: Optional[concurrent.futures.Executor]) -> concurrent.futures.Future[str]:
    if tool.starts_itself:
        return tool.start(handle.args, ToolContext(handle.cancel_event, handle.deadline))
    assert tool.remote_ref is not None and remote is not None
    module, qualname = tool.remote_ref
    return remote.submit(RemoteCall(module, qualname, tool.name, handle.args, ToolContext(deadline=handle.deadline),
                                    share_cancel_event(handle.cancel_event)))
