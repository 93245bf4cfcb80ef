"""MCP sessions on the one shared event-loop thread: start, list, call, restart, close, with bounded server requests.

The one event-loop thread per process that serves every MCP session.

The MCP SDK is async only; the engine is threads.  One asyncio loop on one
daemon thread carries every session of every :class:`McpServer` in the
process: a call from a tool is a coroutine submitted here and answered by a
``concurrent.futures.Future``, so no thread waits per call.  The loop starts
with the first server and ends with the last (a reference count), so after
the last ``close()`` no MCP thread remains.

Requests from a server to us, bounded: what one server can make the shared loop hold.

The SDK starts one task per request a server sends (``ping``, ``roots/list``,
``sampling/createMessage``...), and each holds on until its answer is
written.  A server that sends requests in a loop and stops reading its
stdin grew the loop by 16,000 tasks and 150 MB in 5 s.  The gate sits
between the transport and the session: at most :data:`MAX_SERVER_REQUESTS`
of a server's requests are open at once; past it, further requests are
dropped unanswered (the server is not reading its answers anyway) and a
warning says so once.  A request stays open until the session has written
its answer or settled it unanswered (the SDK's ``on_request_unanswered``
hook, after a cancel took effect): a ``notifications/cancelled`` alone frees
nothing, since the answer may already be stuck in the write.  A request
reusing the id of one still open is dropped (JSON-RPC ids are unique among
open requests), so one answer always frees exactly one request.
Notifications need no gate: the session handles each at once, and a
changed tool list is re-read one list at a time (``_session``).

One MCP connection on the shared loop: start, list, call, restart once after a crash, close.

Everything here runs on the loop thread (``_LoopThread`` above).  The SDK's
``Client`` is an async context whose task groups must be entered and left in
one task, so each connection is held open by a *runner* task; calls are
other tasks on the same loop, any number at once.  Cancelling a call's task
is how a call is stopped: the SDK then cancels the request the way the
negotiated protocol version does it (``notifications/cancelled`` on stdio
and handshake-era versions; closing the request's response stream over
streamable HTTP at 2026-07-28), so the server's handler is cancelled too.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import re
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Coroutine,
    Dict,
    List,
    Mapping,
    Optional,
    Set,
    TypeVar,
    cast,
)

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from ._tools import McpToolError
from ._transports import Endpoint, Incoming

if TYPE_CHECKING:
    from mcp.shared.dispatcher import ProgressFnT

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


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the loop; cancelling the returned future cancels the coroutine's task."""
    loop = _current.loop if _current is not None else None
    if loop is None:
        close = getattr(coro, "close", None)
        if close is not None:
            close()  # never awaited: say nothing about it at garbage collection
        raise RuntimeError("the MCP event loop is not running: the server was closed")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def run(coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
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


def alive() -> Optional[threading.Thread]:
    """The loop's thread while it runs (for tests: none remains after the last close)."""
    current = _current
    return current.thread if current is not None else None


#: A server's own requests open at once; well above what a well-behaved server has in flight.
MAX_SERVER_REQUESTS = 32


class RequestGate:
    """The open requests of one server, by id; what `_Receive` lets through and `_Send` sees answered."""

    def __init__(self, limit: int, warn: Callable[[str], None]) -> None:
        self.limit, self._warn = limit, warn
        self.open: Set[str] = set()
        self._told: Set[str] = set()

    def admit(self, item: Incoming) -> Optional[Incoming]:
        """``item`` as it goes on to the session, or None: a request dropped (reused id, or past the limit)."""
        if isinstance(item, Exception) or not isinstance(item.message, types.JSONRPCRequest):
            return item
        key = str(item.message.id)
        if key in self.open:
            self._warn_once("reused", f"it reuses request id {key!r} while a request with it is still open; "
                                      "such requests are dropped unanswered")
            return None
        if len(self.open) >= self.limit:
            self._warn_once("full", f"it has {self.limit} requests to this client open and sends more without "
                                    "reading the answers; further requests are dropped unanswered")
            return None
        self.open.add(key)
        return self._told_when_unanswered(item, key)

    def answered(self, item: SessionMessage) -> None:
        message = getattr(item, "message", None)
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self.open.discard(str(message.id))

    def _told_when_unanswered(self, item: SessionMessage, key: str) -> SessionMessage:
        """``item`` with a hook the session runs when it settles the request with no answer written."""
        metadata = item.metadata if isinstance(item.metadata, ServerMessageMetadata) else ServerMessageMetadata()
        earlier = metadata.on_request_unanswered

        async def unanswered() -> None:
            self.open.discard(key)
            if earlier is not None:
                await earlier()

        return dataclasses.replace(item, metadata=dataclasses.replace(metadata, on_request_unanswered=unanswered))

    def _warn_once(self, kind: str, text: str) -> None:
        if kind not in self._told:
            self._told.add(kind)
            self._warn(text)


class _Receive:
    """The transport's read stream, minus requests past the gate (the interface the SDK's dispatcher uses)."""

    def __init__(self, inner: Any, gate: RequestGate) -> None:
        self._inner, self._gate = inner, gate

    @property
    def last_context(self) -> Any:  # the sender's contextvars, where the transport keeps them
        return getattr(self._inner, "last_context", None)

    async def __aenter__(self) -> _Receive:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __aiter__(self) -> _Receive:
        return self

    async def __anext__(self) -> Any:
        while True:
            admitted = self._gate.admit(await self._inner.__anext__())
            if admitted is not None:
                return admitted

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Send:
    def __init__(self, inner: Any, gate: RequestGate) -> None:
        self._inner, self._gate = inner, gate

    async def __aenter__(self) -> _Send:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    async def send(self, item: Any) -> None:
        await self._inner.send(item)
        self._gate.answered(item)

    async def aclose(self) -> None:
        await self._inner.aclose()


@contextlib.asynccontextmanager
async def gated(transport: Any, warn: Callable[[str], None], limit: int = MAX_SERVER_REQUESTS) -> AsyncIterator[Any]:
    """``transport``'s (read, write) streams with the server's open requests bounded."""
    async with transport as (read, write):
        gate = RequestGate(limit, warn)
        yield _Receive(read, gate), _Send(write, gate)


#: Seconds to wait for a crashed server's exit status before describing it without one.
_EXIT_WAIT_S = 1.0
#: Restarts after a crash before calls fail for good ("once, then errors").
MAX_RESTARTS = 1
#: Seconds calls still in flight get to end (their requests cancelled) when the server is closed.
_CALLS_GRACE_S = 2.0
#: Seconds between two reads of a changed tool list: a server that says "changed" in a loop gets
#: one ``tools/list`` in flight at a time, at most one every this often.
REFRESH_GAP_S = 0.5
#: How the SDK words an SSE event past ``max_sse_event_size`` (an answer past the cap, over HTTP).
_SSE_TOO_LARGE = re.compile(r"Server-sent event exceeded the \d+ byte limit")


class McpUnavailable(McpToolError):
    """The server cannot answer: it never started, crashed, or is unreachable."""


class Connection:
    """The live session to one server; every ``tools/list`` it reads goes to ``on_tools``, warnings to ``warn``."""

    def __init__(self, endpoint: Endpoint, startup_timeout: float, on_tools: Callable[[List[types.Tool]], None],
                 warn: Callable[[str], None]) -> None:
        self.endpoint = endpoint
        self.startup_timeout = startup_timeout
        self._on_tools = on_tools
        self._warn = warn
        self._client: Optional[Client] = None
        self._runner: Optional[asyncio.Task[None]] = None
        self._stop: Optional[asyncio.Event] = None
        self._ready: Optional[asyncio.Future[Client]] = None
        self._lock: Optional[asyncio.Lock] = None
        self._broken: Optional[str] = None  # why the live session is unusable
        self._calls: Set[asyncio.Task[Any]] = set()  # in flight: cancelled by close()
        self._closing = False
        self._refresh: Optional[asyncio.Task[None]] = None  # the one tools/list re-read in flight
        self._refresh_again = False  # the list changed again while it was being read
        self.restarts = 0

    @property
    def close_deadline(self) -> float:
        """Seconds :meth:`close` may take at most: calls' grace, the session's close, the process's stop."""
        return _CALLS_GRACE_S + self.endpoint.close_timeout + self.endpoint.stop_timeout + 1.0

    def _unavailable(self, text: str) -> McpUnavailable:
        return McpUnavailable(self.endpoint.redact(text))

    # -- lifecycle

    @property
    def _guard(self) -> asyncio.Lock:
        """Made on first use, on the loop thread: starts, restarts and closes happen one at a time."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def ensure(self) -> Client:
        """The live client, started (or restarted once after a crash) if needed."""
        async with self._guard:
            if self._client is not None and self._broken is None:
                return self._client
            if self._broken is not None:
                if self.restarts >= MAX_RESTARTS:
                    raise self._unavailable(f"{self._broken}; it was restarted {self.restarts} time(s) already and "
                                            "is not started again: fix the server, then open a new McpServer")
                await self._shutdown()
                self.restarts += 1
                self._broken = None
            return await self._start()

    async def _start(self) -> Client:
        self._stop = asyncio.Event()
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._ready = ready
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())  # read even if we gave up
        self._runner = asyncio.create_task(self._hold(ready, self._stop))
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.startup_timeout)
        except asyncio.TimeoutError as exc:
            await self._shutdown()
            raise self._unavailable(f"{self.endpoint.label} did not answer initialize within "
                                    f"{self.startup_timeout:g}s (startup_timeout); {self.endpoint.describe_exit()}"
                                    ) from exc
        except Exception as exc:
            await self._shutdown()
            raise self._unavailable(f"{self.endpoint.label} could not be started: {_reason(exc)}; "
                                    f"{self.endpoint.describe_exit()}") from exc
        self._client = client
        try:
            await self._refresh_tools(client)
        except Exception as exc:
            await self._shutdown()
            raise self._unavailable(f"{self.endpoint.label} started, but its tools/list failed: {_reason(exc)}; "
                                    f"{self._too_large_hint(exc)}{self.endpoint.describe_exit()}") from exc
        return client

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """The runner: keep the client's context open until ``stop`` (enter and exit in this one task)."""
        try:
            transport = gated(self.endpoint.transport(), lambda text: self._warn(f"{self.endpoint.label}: {text}"))
            async with Client(transport, message_handler=self._on_message,
                              mode=self.endpoint.protocol) as client:
                if not ready.done():
                    ready.set_result(client)
                async with self._listening(client):
                    await stop.wait()
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, Exception):
                    ready.set_exception(exc)
                else:
                    ready.cancel()
            elif self._broken is None and not stop.is_set():
                self._broken = f"{self.endpoint.label} disconnected: {_reason(exc)}"
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _shutdown(self) -> None:
        runner, self._runner, self._client = self._runner, None, None
        refresh, self._refresh = self._refresh, None
        if refresh is not None:
            refresh.cancel()
        if runner is None:
            return
        assert self._stop is not None
        self._stop.set()
        if self._ready is not None and self._ready.done():  # a live session: let it close in order
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(runner), self.endpoint.close_timeout)
        if not runner.done():  # still in its handshake, or slow to close: cancel it (the transport's
            runner.cancel()  # own shutdown is shielded and bounded, so the process still ends)
            with contextlib.suppress(BaseException):
                await runner

    async def close(self) -> None:
        """End the session; calls still in flight end with an error saying so (their requests cancelled)."""
        self._closing = True
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.wait(calls, timeout=_CALLS_GRACE_S)
        async with self._guard:
            await self._shutdown()

    # -- tools

    async def list_tools(self) -> List[types.Tool]:
        client = await self.ensure()
        return await self._refresh_tools(client)

    async def _refresh_tools(self, client: Client) -> List[types.Tool]:
        tools: List[types.Tool] = []
        cursor: Optional[str] = None
        for _ in range(100):  # a paginator that never ends cannot hang the start
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or len(tools) > self.endpoint.limits.max_tools:  # more are never used
                break
        self._on_tools(tools)
        return tools

    async def call(self, name: str, arguments: Dict[str, Any], on_progress: Optional[ProgressFnT] = None,
                   meta: Optional[Mapping[str, str]] = None) -> types.CallToolResult:
        """``tools/call``; a crash or lost connection becomes :class:`McpUnavailable` naming what happened."""
        if self._closing:
            raise self._unavailable(f"{self.endpoint.label} is closed; the call to {name!r} was not sent")
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await self._call(name, arguments, on_progress, meta)
        except asyncio.CancelledError:
            if self._closing:  # close(), not the caller: say so instead of "cancelled"
                raise self._unavailable(f"{self.endpoint.label} was closed during the call to {name!r}") from None
            raise
        finally:
            self._calls.discard(task)

    async def _call(self, name: str, arguments: Dict[str, Any], on_progress: Optional[ProgressFnT],
                    meta: Optional[Mapping[str, str]] = None) -> types.CallToolResult:
        client = await self.ensure()
        try:
            if meta:  # W3C trace context for the server (params._meta.traceparent)
                # An open TypedDict: the W3C keys (traceparent, tracestate) are its extra items.
                return await client.call_tool(name, arguments, progress_callback=on_progress,
                                              meta=cast("types.RequestParamsMeta", meta))
            return await client.call_tool(name, arguments, progress_callback=on_progress)
        except MCPError as exc:
            if _too_large(exc.error.message):
                raise McpToolError(self.endpoint.redact(
                    f"{self.endpoint.label}: the answer to {name!r} {self._too_large_hint(exc).rstrip()}")) from exc
            if exc.error.code != types.CONNECTION_CLOSED:
                raise McpToolError(self.endpoint.redact(
                    f"{self.endpoint.label} refused the call to {name!r}: {exc.error.message}")) from exc
            raise await self._lost(name, exc) from exc
        except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise await self._lost(name, exc) from exc

    async def _lost(self, name: str, exc: BaseException) -> McpUnavailable:
        await self.endpoint.wait_exit(_EXIT_WAIT_S)
        self._broken = f"{self.endpoint.label} failed during the call to {name!r}: {self.endpoint.describe_exit()}"
        return self._unavailable(f"{self._broken} ({_reason(exc)}); the next call restarts it"
                                 if self.restarts < MAX_RESTARTS else self._broken)

    def _too_large_hint(self, exc: BaseException) -> str:
        """For an answer past the cap: what was refused and which setting to raise; else ``""``."""
        if not (isinstance(exc, MCPError) and _too_large(exc.error.message)):
            return ""
        limit = self.endpoint.limits.max_result_bytes
        return (f"is over {limit} bytes (McpLimits.max_result_bytes) and was not read; if such answers are "
                "expected, raise it: McpServer.stdio/http(..., limits=McpLimits(max_result_bytes=...)). ")

    # -- notifications

    async def _on_message(self, message: Any) -> None:
        """Handshake-era servers announce a changed tool list with a plain notification."""
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            self._changed()

    def _changed(self) -> None:
        """Re-read the list: one ``tools/list`` in flight per server, however often the server says so."""
        client = self._client
        if client is None or self._closing:
            return
        if self._refresh is not None and not self._refresh.done():
            self._refresh_again = True
            return
        self._refresh_again = False
        self._refresh = asyncio.get_running_loop().create_task(self._refresh_while_changed(client))

    async def _refresh_while_changed(self, client: Client) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self._refresh_tools(client)
            if not self._refresh_again:
                return
            self._refresh_again = False
            await asyncio.sleep(REFRESH_GAP_S)

    @contextlib.asynccontextmanager
    async def _listening(self, client: Client) -> AsyncIterator[None]:
        """At 2026-07-28 a changed tool list arrives only on a ``subscriptions/listen`` stream: open one."""
        capability = getattr(client.server_capabilities, "tools", None)
        if not getattr(capability, "list_changed", False):
            yield
            return
        task = asyncio.get_running_loop().create_task(self._follow_changes(client))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _follow_changes(self, client: Client) -> None:
        with contextlib.suppress(Exception):
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._changed()


def _too_large(message: str) -> bool:
    """Whether an error says an answer was past the cap (ours on stdio and HTTP JSON, the SDK's on SSE)."""
    return "McpLimits.max_result_bytes" in message or _SSE_TOO_LARGE.search(message) is not None


def _reason(exc: BaseException) -> str:
    """One line for an error, looking inside the exception groups anyio's task groups raise."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return _reason(inner[0])
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
