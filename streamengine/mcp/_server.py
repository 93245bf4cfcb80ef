"""``McpServer``: an MCP server's tools for the engine, synchronous from the outside.

A server is a command started over stdio or a streamable-HTTP URL.  It is
started on ``__enter__`` or first use (``tools()``), shares the process's
one MCP loop thread with every other server, and ``close()`` ends its
session and its process; the last close ends the loop thread.  A server
still open when the interpreter exits is closed then (an ``atexit`` hook),
so a child that ignores EOF does not outlive a program that forgot it.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import os
import shutil
import sys
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Set

import mcp_types as types

from .._errors import ConfigError
from .._logs import component_logger, redact_url
from .._validation import name as check_name
from .._validation import seconds as check_seconds
from . import _session
from ._session import Connection
from ._tools import Eager, McpTool, McpToolError, build_tools, result_text
from ._transports import (
    Endpoint,
    HttpEndpoint,
    McpLimits,
    StdioEndpoint,
    Warnings,
    bounded_listing,
    checked_limits,
    shown_host,
)

if TYPE_CHECKING:
    from loguru import Logger
    from mcp.shared.dispatcher import ProgressFnT

    from .._otel.tracing import HandOver

#: Default seconds a server gets to answer ``initialize`` (a first ``uvx`` download may take a while).
DEFAULT_STARTUP_TIMEOUT = 30.0

#: Servers started and not closed: the interpreter's exit closes them (``_close_left_open``).
_OPEN: Set[McpServer] = set()
_OPEN_LOCK = threading.Lock()


class McpServer:
    """One MCP server.  Build with :meth:`stdio` or :meth:`http`; use as a context manager.

    ``tools()`` gives :class:`~streamengine.tools.Tool` s for
    ``StreamingEngine(tools=...)``, beside Python tools and other servers'.
    """

    def __init__(self, endpoint: Endpoint, startup_timeout: float, logger: Optional[Logger] = None,
                 protocol: str = "auto") -> None:
        self.name = endpoint.name
        self.startup_timeout = check_seconds(startup_timeout, "startup_timeout")
        endpoint.protocol = _check_protocol(protocol)
        self._endpoint = endpoint
        self._log = component_logger("streamengine.mcp", logger)
        self._warn = Warnings(lambda text: self._log.warning("{}", endpoint.redact(text)))
        self._listed: List[types.Tool] = []
        self._connection = Connection(endpoint, self.startup_timeout, self._note_tools, self._warn)
        self._lock = threading.Lock()
        self._state = "new"  # new -> open -> closed

    # -- construction

    @classmethod
    def stdio(cls, command: str, *args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
              name: Optional[str] = None, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
              logger: Optional[Logger] = None, protocol: str = "auto", limits: Optional[McpLimits] = None) -> McpServer:
        """A server started as ``command args...``, speaking MCP on its stdin/stdout.

        ``env`` is added to a minimal inherited environment (PATH, HOME, ...),
        as the SDK does: a server does not see the caller's API keys unless given them.
        ``limits`` (both constructors) bounds what the server may send (:class:`McpLimits`).
        """
        command = check_name(command, "McpServer.stdio command")
        bad = [a for a in args if not isinstance(a, str)]
        if bad:
            raise ConfigError(f"McpServer.stdio arguments must be strings, got {bad!r}; e.g. "
                              "McpServer.stdio('mcp-server-time', '--local-timezone', 'UTC')")
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ConfigError("McpServer.stdio env must map names to string values, e.g. env={'TZ': 'UTC'}")
        label = check_name(name, "McpServer name") if name is not None else os.path.basename(command)
        return cls(StdioEndpoint(label, _find_command(command), list(args), env, cwd, checked_limits(limits)),
                   startup_timeout, logger, protocol)

    @classmethod
    def http(cls, url: str, headers: Optional[Dict[str, str]] = None, name: Optional[str] = None,
             startup_timeout: float = DEFAULT_STARTUP_TIMEOUT, logger: Optional[Logger] = None,
             protocol: str = "auto", limits: Optional[McpLimits] = None) -> McpServer:
        """A server at a streamable-HTTP endpoint (``http://host:port/mcp``); ``headers`` go with every request.

        ``protocol`` (both constructors): ``"auto"`` asks the server (2026-07-28 when it speaks it, else the
        initialize handshake); ``"legacy"`` forces the handshake, for servers that mishandle the probe.
        """
        parsed = urllib.parse.urlsplit(url if isinstance(url, str) else "")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError("McpServer.http needs an http(s) URL such as http://127.0.0.1:8931/mcp, got "
                              f"{redact_url(url) if isinstance(url, str) else repr(url)!r}")
        if headers is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise ConfigError("McpServer.http headers must map names to string values, "
                              "e.g. headers={'Authorization': 'Bearer ...'}")
        label = check_name(name, "McpServer name") if name is not None else shown_host(url)
        return cls(HttpEndpoint(label, url, headers, checked_limits(limits)), startup_timeout, logger, protocol)

    # -- lifecycle

    def start(self) -> McpServer:
        """Start the server and its session (done by ``__enter__`` and ``tools()``); idempotent."""
        with self._lock:
            if self._state == "closed":
                raise ConfigError(f"MCP server {self.name!r} is closed; open a new McpServer")
            if self._state == "open":
                return self
            if _session.in_loop_thread():
                raise ConfigError("McpServer.start() cannot run on the MCP loop thread itself")
            _session.acquire()
            try:
                _session.run(self._connection.ensure(), self.startup_timeout + self._endpoint.close_timeout)
            except BaseException:
                self._await_close(self._submit_close(), time.monotonic() + self._connection.close_deadline)
                raise
            self._state = "open"
            with _OPEN_LOCK:
                _OPEN.add(self)
            return self

    def close(self) -> None:
        """End the session and the server process; the last server closed ends the MCP loop thread.

        Bounded whatever the server does: a stdio server that ignores EOF is
        sent SIGTERM, then SIGKILL (its process group), a couple of seconds apart.
        """
        McpServer.close_all([self])

    @staticmethod
    def close_all(servers: Iterable[McpServer]) -> None:
        """Close several servers side by side: N servers slow to stop take the time of one, not N."""
        closing = [server for server in servers if server._mark_closed()]
        until = time.monotonic() + max((s._connection.close_deadline for s in closing), default=0.0)
        futures = [server._submit_close() for server in closing]
        for server, future in zip(closing, futures):
            server._await_close(future, until)

    def _mark_closed(self) -> bool:
        """Closed from now on; True if it was open (so its session is to be ended)."""
        with self._lock:
            was_open, self._state = self._state == "open", "closed"
        with _OPEN_LOCK:
            _OPEN.discard(self)
        return was_open

    def _submit_close(self) -> Optional[concurrent.futures.Future[None]]:
        try:
            return _session.submit(self._connection.close())
        except RuntimeError as exc:  # the loop is gone (interpreter shutdown): nothing left to end there
            self._log.warning("closing MCP server {!r} failed: {}", self.name, exc)
            return None

    def _await_close(self, future: Optional[concurrent.futures.Future[None]], until: float) -> None:
        try:
            if future is not None:
                future.result(max(0.0, until - time.monotonic()))
        except Exception as exc:  # never let a failing close leave the loop counted
            if future is not None:
                future.cancel()
            self._log.warning("closing MCP server {!r} failed: {}", self.name,
                              self._endpoint.redact(f"{type(exc).__name__}: {exc}"))
        finally:
            _session.release()

    def __enter__(self) -> McpServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"McpServer({self._endpoint.label}, {self._state})"

    # -- tools

    def tools(self, prefix: Optional[str] = None, include: Optional[Collection[str]] = None,
              eager: Eager = None, timeout: Optional[float] = None,
              trust_annotations: bool = False) -> List[McpTool]:
        """The server's tools as engine tools, named ``prefix + name``.

        ``include`` keeps only those names.  Which tools start mid-stream:
        by default none (``trust_annotations=False``: a server's annotations
        are hints from code you did not write); ``eager`` (``True`` or a set
        of names) is your yes for those tools; ``trust_annotations=True``
        lets ``readOnlyHint: true`` decide (``destructiveHint: true`` wins
        over it).  ``include`` and ``eager`` take the names after ``prefix``.
        ``timeout`` (seconds) replaces the engine's ``tool_timeout`` for these tools.
        """
        self.start()
        timeout = check_seconds(timeout, "McpServer.tools timeout", allow_none=True)
        return build_tools(self, list(self._listed), prefix, include, eager, timeout, trust_annotations)

    def list_tools(self) -> List[Dict[str, Any]]:
        """The server's ``tools/list`` as JSON objects (name, description, inputSchema, annotations...).

        Bounded by :class:`McpLimits` as :meth:`tools` is: the first
        ``max_tools``, descriptions cut, tools with a bad name or an
        oversized schema left out.
        """
        self.start()
        return [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in self._listed]

    def _note_tools(self, listed: List[types.Tool]) -> None:
        # Replaced whole: readers on other threads see one list or the other.
        self._listed = bounded_listing(listed, self._endpoint.limits, self.name, self._warn)

    def _start_call(self, tool: McpTool, arguments: Dict[str, Any]) -> concurrent.futures.Future[str]:
        """Submit one ``tools/call`` to the loop; the future's cancel cancels the request on the server."""
        traced = _tool_span()  # taken first, so a call refused here leaves nothing behind on this thread
        if self._state != "open":
            future: concurrent.futures.Future[str] = concurrent.futures.Future()
            future.set_exception(McpToolError(f"tool '{tool.name}' not run: MCP server {self.name!r} is "
                                              f"{'closed' if self._state == 'closed' else 'not started'}"))
            return future
        return _session.submit(self._call(tool, arguments, traced))

    async def _call(self, tool: McpTool, arguments: Dict[str, Any], traced: Optional[HandOver] = None) -> str:
        if traced is None:
            return await self._answer(tool, arguments, None)
        from .._otel.tracing import end_mcp_client_span, mcp_client_span
        transport = "pipe" if isinstance(self._endpoint, StdioEndpoint) else "tcp"
        span, meta = mcp_client_span(traced, tool.remote_name, transport)
        error: Optional[BaseException] = None
        try:
            return await self._answer(tool, arguments, meta)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end_mcp_client_span(span, error)

    async def _answer(self, tool: McpTool, arguments: Dict[str, Any], meta: Optional[Mapping[str, str]]) -> str:
        """The call's text; every failure an :class:`McpToolError` whose text hides the server's credentials."""
        def progress(done: float, total: Optional[float], message: Optional[str]) -> None:
            self._log.debug("tool {!r}: progress {}/{} {}", tool.name, done, total,
                            self._endpoint.redact((message or "")[:300]))

        try:
            result = await self._connection.call(tool.remote_name, arguments, _async(progress), meta=meta)
            return result_text(result, tool.name, self._endpoint.redact)
        except McpToolError:
            raise
        except Exception as exc:
            raise McpToolError(self._endpoint.redact(f"{self._endpoint.label}: the call to {tool.remote_name!r} "
                                                     f"failed: {type(exc).__name__}: {exc}")) from exc


def _tool_span() -> Optional[HandOver]:
    """The engine's tool span for this call, when the run is traced (OpenTelemetry loaded and on)."""
    tracing = sys.modules.get("streamengine._otel.tracing")
    if tracing is None:
        return None
    hand_over: Optional[HandOver] = tracing.take_hand_over()
    return hand_over


def _check_protocol(protocol: object) -> str:
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    allowed = ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS)
    if protocol not in allowed:
        raise ConfigError(f"protocol must be one of {', '.join(map(repr, allowed))}, got {protocol!r}")
    return str(protocol)


def _find_command(command: str) -> str:
    """On PATH, else beside this Python: a server installed in an environment that is not activated
    (``.venv/bin/python app.py``) is found as ``mcp-server-time`` all the same."""
    if os.sep in command:
        return command
    return shutil.which(command) or shutil.which(command, path=os.path.dirname(sys.executable)) or command


def _async(fn: Callable[[float, Optional[float], Optional[str]], None]) -> ProgressFnT:
    """``fn`` as the SDK's progress callback (a coroutine function; ``fn`` itself only logs)."""
    async def call(progress: float, total: Optional[float], message: Optional[str]) -> None:
        fn(progress, total, message)

    return call


def _forget_the_parents() -> None:
    """In a forked child: the parent's servers, sessions and loop thread are the parent's, not to close here."""
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()  # another thread may have held it at the fork
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_the_parents)


@atexit.register
def _close_left_open() -> None:
    """At exit, close what the program left open: a stdio child that ignores EOF would outlive it."""
    with _OPEN_LOCK:
        left = list(_OPEN)
    if left:
        McpServer.close_all(left)
