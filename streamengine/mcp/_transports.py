"""Where an MCP server is and how it is reached (stdio child, streamable HTTP), and what it may send.

What one MCP server may send: the size of an answer, and how many tools of what size it may list.

A server is code you did not write, reached over a pipe or the network.
These bounds hold whatever it sends; past each, a warning or an error
result says which setting to raise, and nothing grows without bound.

The streamable-HTTP transport, with every answer bounded by ``McpLimits.max_result_bytes``.

The SDK reads a JSON response body whole (``response.aread()``): a server
answering ``tools/call`` with 600 MB took 3.5 GB.  A response hook (it sees
every response, through any proxy the environment sets, before its body is
read) wraps the body so that reading past the cap raises an
``httpx2.StreamError``, which the SDK turns into an error for that one
request; SSE bodies are bounded per event by the SDK's own
``max_sse_event_size``, set to the same cap.  Compressed answers are not
asked for (``Accept-Encoding: identity``) and refused if sent anyway, so the
cap counts the bytes that are decoded.

The stdio transport: an MCP server as a child process, with what it said on stderr kept.

The SDK's ``stdio_client`` hides the process, so a server that crashes
mid-call shows only as "Connection closed".  This transport owns the
process itself: it keeps the last lines of stderr and the exit status, so a
failed call can name both.  Messages are newline-delimited JSON-RPC, as in
the SDK; shutdown follows the spec's order (close stdin, wait, SIGTERM the
process group, SIGKILL), every wait bounded, so a server that ignores EOF
and SIGTERM still ends within :data:`MAX_STOP_S`.

A line over ``McpLimits.max_result_bytes`` is not kept: when its start names
the request it answers (``{"jsonrpc": "2.0", "id": 7, ...``, as SDKs write
it) that request gets an error and the rest of the line is skipped;
otherwise the connection is closed (the call still ends at once, with an
error that says why).

Where a server is: a command to start (stdio) or a URL (streamable HTTP), and how to describe its faults.

Everything an endpoint says (its label, its faults, the server's stderr) is
shown, logged, raised or sent to the model, so it goes through
:attr:`Endpoint.redact` first: URLs lose their userinfo and query values,
and the credentials given to the server (a token in the URL, ``Authorization``
and other credential headers, ``--token VALUE`` arguments, credential-named
environment variables) are masked wherever they appear.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import urllib.parse
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import anyio
import httpx2
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from .._clients.http.options import credentials_in
from .._logs import CREDENTIAL_PARAM, Redactor, redact_credentials
from .._validation import count, short_repr
from ..tools._schema import _NAME_RE

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream, Process
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    #: What the stdio transport yields to the session: the stream it reads and the one it writes.
    StdioStreams = Tuple[MemoryObjectReceiveStream["Incoming"], MemoryObjectSendStream[SessionMessage]]

#: What the session reads from a transport: a message, or the error a line that could not be parsed gave.
Incoming = Union[SessionMessage, Exception]

#: The default cap on one message from a server (a ``tools/call`` result, a ``tools/list`` page...).
DEFAULT_MAX_RESULT_BYTES = 16 * 1024 * 1024
#: Warnings a server's listing may cause, each said once per server (a flood repeats the same ones).
_MAX_WARNINGS_KEPT = 1000


@dataclass(frozen=True)
class McpLimits:
    """Bounds on what one server sends; ``McpServer.stdio/http(..., limits=McpLimits(...))``.

    * ``max_result_bytes``: one JSON-RPC message (a result, a listing page),
      on every transport: a stdio line, an HTTP JSON body, one SSE event.
      A result past it is an error result; it is not read further.
    * ``max_tools``: tools taken from the server's list (the first ones; a
      warning names how many were left out).
    * ``max_description_chars``: a tool's description (and title), cut
      there with a warning: it is text the model reads on every request.
    * ``max_schema_bytes``: a tool's input schema as JSON; a tool past it is
      left out with a warning (a schema cannot be cut).
    """

    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_tools: int = 128
    max_description_chars: int = 4096
    max_schema_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for field in ("max_result_bytes", "max_tools", "max_description_chars", "max_schema_bytes"):
            count(getattr(self, field), f"McpLimits.{field}", minimum=1)


def checked_limits(limits: Any) -> McpLimits:
    if limits is None:
        return McpLimits()
    if not isinstance(limits, McpLimits):
        from .._errors import ConfigError

        raise ConfigError(f"limits must be McpLimits(...) (from streamengine.mcp), got {limits!r}")
    return limits


def too_large(limit: int) -> str:
    """The words for an answer past ``max_result_bytes``; every transport says the same."""
    return f"the server's answer is over {limit} bytes (McpLimits.max_result_bytes) and was not read"


def bad_name(server: str, shown: str) -> str:
    return (f"MCP server {server!r}: tool {short_repr(shown)} left out: model providers refuse its name "
            "(1-64 characters from A-Z, a-z, 0-9, '_', '.', '-')")


class Warnings:
    """Says each listing problem of one server once, not once per refresh."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._said: Set[str] = set()

    def __call__(self, text: str) -> None:
        if text in self._said:
            return
        if len(self._said) < _MAX_WARNINGS_KEPT:
            self._said.add(text)
        self._warn(text)


def bounded_listing(listed: Sequence[types.Tool], limits: McpLimits, server: str, warn: Warnings) -> List[types.Tool]:
    """The first ``max_tools`` tools, descriptions cut to size, tools with an oversized schema left out."""
    kept: List[types.Tool] = []
    for listed_tool in listed:
        if len(kept) >= limits.max_tools:
            warn(f"MCP server {server!r} lists {len(listed)} tools; only the first {limits.max_tools} are used "
                 "(McpLimits.max_tools)")
            break
        if not _NAME_RE.fullmatch(listed_tool.name):
            warn(bad_name(server, listed_tool.name))
            continue
        size = len(json.dumps(listed_tool.input_schema, ensure_ascii=False))
        if size > limits.max_schema_bytes:
            warn(f"MCP server {server!r}: tool {short_repr(listed_tool.name)} left out: its input schema is "
                 f"{size} bytes, over McpLimits.max_schema_bytes={limits.max_schema_bytes}")
            continue
        kept.append(_cut_texts(listed_tool, limits.max_description_chars, server, warn))
    return kept


def _cut_texts(listed_tool: types.Tool, chars: int, server: str, warn: Warnings) -> types.Tool:
    update: Dict[str, str] = {}
    for field in ("description", "title"):
        text = getattr(listed_tool, field, None)
        if isinstance(text, str) and len(text) > chars:
            update[field] = text[:chars] + " [...]"
            warn(f"MCP server {server!r}: the {field} of tool {short_repr(listed_tool.name)} is {len(text)} "
                 f"characters; cut to McpLimits.max_description_chars={chars}")
    return listed_tool.model_copy(update=update) if update else listed_tool


_SSE = "text/event-stream"


class AnswerTooLarge(httpx2.StreamError):
    """A body past the cap (or compressed against our asking): the SDK fails the one request it answers."""


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, limit: int, refusal: str = "") -> None:
        self._inner, self._limit, self._refusal = inner, limit, refusal

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refusal:
            raise AnswerTooLarge(self._refusal)
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise AnswerTooLarge(too_large(self._limit))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _capping(limit: int) -> Any:
    async def hook(response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        refusal = "" if encoding in ("", "identity") else \
            f"the server sent a {encoding!r}-compressed answer though none was asked for; not read"
        if refusal or not response.headers.get("content-type", "").lower().startswith(_SSE):
            response.stream = _CappedBody(response.stream, limit, refusal)

    return hook


@contextlib.asynccontextmanager
async def http_transport(url: str, headers: Dict[str, str], limit: int) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own defaults: a response stream may stay open for minutes; the engine's
    # per-tool timeout, not this read timeout, is what bounds a call.
    headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
    async with httpx2.AsyncClient(headers={**headers, "Accept-Encoding": "identity"},
                                  timeout=httpx2.Timeout(30.0, read=300.0),
                                  event_hooks={"response": [_capping(limit)]}) as http, \
            streamable_http_client(url, http_client=http, max_sse_event_size=limit) as streams:
        yield streams


#: Lines of stderr kept for error messages, and the characters kept of each.
STDERR_LINES = 20
_STDERR_LINE_CHARS = 300
#: Seconds a server gets to exit after its stdin closes, then after SIGTERM, then after SIGKILL.
_EXIT_GRACE_S = 2.0
#: The longest a stop may take, whatever the server does.
MAX_STOP_S = 3 * _EXIT_GRACE_S
#: Bytes of an oversized line looked at for the id of the request it answers.
_HEAD_BYTES = 4096
_LEADING_ID = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,256}")\s*,')


class ProcessState:
    """What the caller may read about the child: its pid, exit status and stderr tail."""

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.stderr: Deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.process: Optional[Process] = None
        self.fault = ""  # why this side closed the connection, if it did

    def exit_text(self) -> str:
        code = self.returncode if self.process is None else self.process.returncode
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"

    def stderr_tail(self, lines: int = 5) -> str:
        kept = list(self.stderr)[-lines:]
        return " | ".join(kept) if kept else "(nothing on stderr)"


@contextlib.asynccontextmanager
async def stdio_transport(command: str, args: List[str], env: Optional[Dict[str, str]], cwd: Optional[str],
                          state: ProcessState, limit: int) -> AsyncIterator[StdioStreams]:
    """Start ``command args`` and yield the (read, write) streams the MCP session drives."""
    process = await anyio.open_process([command, *args], env={**get_default_environment(), **(env or {})},
                                       cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
    state.process, state.pid = process, process.pid
    read_in, read_out = anyio.create_memory_object_stream[Incoming](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with anyio.create_task_group() as tasks:
            stdin, stdout, stderr = _pipes(process)
            tasks.start_soon(_read_stdout, stdout, read_in, limit, state)
            tasks.start_soon(_write_stdin, stdin, write_out, read_in)
            tasks.start_soon(_keep_stderr, stderr, state)
            try:
                yield read_out, write_in
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, write_in, read_out)
                    state.returncode = process.returncode
                tasks.cancel_scope.cancel()
    finally:  # its pipes and asyncio transport closed on this loop, not at garbage collection after it closed
        with anyio.CancelScope(shield=True), anyio.move_on_after(_EXIT_GRACE_S):
            await process.aclose()


def _pipes(process: Process) -> Tuple[ByteSendStream, ByteReceiveStream, ByteReceiveStream]:
    """The child's stdin, stdout and stderr (it was started with a pipe for each)."""
    if process.stdin is None or process.stdout is None or process.stderr is None:  # pragma: no cover - a bug here
        raise RuntimeError("the MCP server's process was started without its three pipes")
    return process.stdin, process.stdout, process.stderr


async def _read_stdout(stdout: ByteReceiveStream, sink: MemoryObjectSendStream[Incoming], limit: int,
                       state: ProcessState) -> None:
    """Each line to the session, parsed; a line over ``limit`` is never held (see the module's docstring)."""
    parts: List[bytes] = []
    size = 0
    skipping = False  # inside a line already answered as too large: drop until its newline
    async with sink:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 OSError):
            async for chunk in stdout:
                start = 0
                while True:
                    end = chunk.find(b"\n", start)
                    if skipping:
                        if end < 0:
                            break
                        skipping, start = False, end + 1
                        continue
                    piece = chunk[start:] if end < 0 else chunk[start:end]
                    parts.append(piece)
                    size += len(piece)
                    if size > limit:
                        if not await _answer_oversized(b"".join(parts)[:_HEAD_BYTES], sink, limit, state):
                            return
                        parts, size, skipping = [], 0, end < 0
                    elif end >= 0:
                        line = b"".join(parts)
                        parts, size = [], 0
                        if line.strip():
                            await sink.send(_parse(line))
                    if end < 0:
                        break
                    start = end + 1


async def _answer_oversized(head: bytes, sink: MemoryObjectSendStream[Incoming], limit: int,
                            state: ProcessState) -> bool:
    """Fail the request an oversized line answers; False (close the connection) when its id is not at its start."""
    match = _LEADING_ID.match(head)
    if match is None:
        state.fault = f"it sent a message over {limit} bytes (McpLimits.max_result_bytes) that names no request " \
                      "at its start, so the connection was closed"
        await sink.send(ValueError(state.fault))
        return False
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=too_large(limit))
    await sink.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=json.loads(match.group(1)), error=error)))
    return True


def _parse(line: bytes) -> Incoming:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _write_stdin(stdin: ByteSendStream, source: MemoryObjectReceiveStream[SessionMessage],
                       reader_sink: MemoryObjectSendStream[Incoming]) -> None:
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await stdin.send(data.encode("utf-8"))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await reader_sink.aclose()  # the server is gone: pending requests end instead of hanging


async def _keep_stderr(stderr: ByteReceiveStream, state: ProcessState) -> None:
    buffer = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        async for chunk in stderr:
            buffer = (buffer + chunk)[-64 * 1024:]
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace").strip()
                if text:
                    state.stderr.append(text[:_STDERR_LINE_CHARS])


async def _stop(process: Process, write_in: MemoryObjectSendStream[SessionMessage],
                read_out: MemoryObjectReceiveStream[Incoming]) -> None:
    await write_in.aclose()
    read_out.close()
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    if await _exited_within(process, _EXIT_GRACE_S):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        if await _exited_within(process, _EXIT_GRACE_S):
            return


async def _exited_within(process: Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


#: ``--token VALUE`` / ``--token=VALUE``: an argument named like a credential, and its value.
_SECRET_FLAG = re.compile(r"^--?[\w-]*(?:auth|key|token|secret|password)[\w-]*(?:=(.*))?$", re.I)


class Endpoint:
    """The transport factory for one server, and the words its error messages use."""

    name = "MCP server"
    label = "MCP server"
    #: The SDK's ``Client(mode=...)``: "auto", "legacy" (the initialize handshake) or a version.
    protocol = "auto"
    #: Seconds a closing session gets before its runner task is cancelled outright.
    close_timeout = 8.0
    #: Seconds the transport's own shielded shutdown may still take after that (a process's stop).
    stop_timeout = 0.0
    limits = McpLimits()
    redact = Redactor()

    def transport(self) -> Any:
        raise NotImplementedError

    def describe_exit(self) -> str:
        return ""

    async def wait_exit(self, seconds: float) -> None:
        return None


class StdioEndpoint(Endpoint):
    stop_timeout = MAX_STOP_S

    def __init__(self, name: str, command: str, args: List[str], env: Optional[Dict[str, str]],
                 cwd: Optional[str], limits: McpLimits) -> None:
        self.name, self.command, self.args, self.env, self.cwd = name, command, args, env, cwd
        self.limits = limits
        self.state = ProcessState()
        secrets = credentials_in(None, env or {}) + _argument_secrets(args)
        self.redact = Redactor(secrets)
        self.label = self.redact(f"MCP server {name!r} ({shlex.join([command, *args])})")

    def transport(self) -> Any:
        self.state = ProcessState()  # a restart starts a new process with a fresh stderr tail
        return stdio_transport(self.command, self.args, self.env, self.cwd, self.state, self.limits.max_result_bytes)

    def describe_exit(self) -> str:
        state = self.state
        if state.pid is None:
            return "the process did not start"
        fault = f"{state.fault}; " if state.fault else ""
        return f"{fault}pid {state.pid}, {state.exit_text()}; last stderr: {self.redact(state.stderr_tail())}"

    async def wait_exit(self, seconds: float) -> None:
        process = self.state.process
        if process is None:
            return
        with anyio.move_on_after(seconds):
            while process.returncode is None:
                await anyio.sleep(0.01)


class HttpEndpoint(Endpoint):
    def __init__(self, name: str, url: str, headers: Optional[Dict[str, str]], limits: McpLimits) -> None:
        self.name, self._url, self.headers, self.limits = name, url, dict(headers or {}), limits
        self.url = redact_credentials(url)  # what may be shown: the user still reads its other parameters
        self.redact = Redactor(_url_secrets(url) + credentials_in(None, self.headers), shown=[self.url])
        self.label = f"MCP server {name!r} at {self.url}"

    def transport(self) -> Any:
        return http_transport(self._url, self.headers, self.limits.max_result_bytes)

    def describe_exit(self) -> str:
        return f"check that the server at {self.url} is running and reachable"


def shown_host(url: str) -> str:
    """``host:port`` of ``url`` without its userinfo: the default name of an HTTP server."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.netloc.rpartition("@")[2]


def _url_secrets(url: str) -> List[str]:
    """The credentials a URL carries (userinfo, credential-named query values): masked by value too,
    wherever they appear."""
    parsed = urllib.parse.urlsplit(url)
    values = [value for name, value in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
              if CREDENTIAL_PARAM.search(name)]
    return values + [v for v in (parsed.username, parsed.password) if v]


def _argument_secrets(args: Iterable[str]) -> List[str]:
    secrets: List[str] = []
    after_flag = False
    for arg in args:
        if after_flag and not arg.startswith("-"):
            secrets.append(arg)
        match = _SECRET_FLAG.match(arg)
        after_flag = match is not None and match.group(1) is None
        if match and match.group(1):
            secrets.append(match.group(1))
    return secrets
