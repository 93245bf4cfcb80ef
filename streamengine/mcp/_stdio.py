"""The stdio transport: an MCP server as a child process, with what it said on stderr kept.

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
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
from typing import Any, AsyncIterator, Deque, Dict, List, Optional

import anyio
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from ._limits import too_large

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
        self.process: Any = None
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
                          state: ProcessState, limit: int) -> AsyncIterator[Any]:
    """Start ``command args`` and yield the (read, write) streams the MCP session drives."""
    process = await anyio.open_process([command, *args], env={**get_default_environment(), **(env or {})},
                                       cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
    state.process, state.pid = process, process.pid
    read_in, read_out = anyio.create_memory_object_stream(0)
    write_in, write_out = anyio.create_memory_object_stream(0)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_stdout, process, read_in, limit, state)
            tasks.start_soon(_write_stdin, process, write_out, read_in)
            tasks.start_soon(_keep_stderr, process, state)
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


async def _read_stdout(process: Any, sink: Any, limit: int, state: ProcessState) -> None:
    """Each line to the session, parsed; a line over ``limit`` is never held (see the module's docstring)."""
    parts: List[bytes] = []
    size = 0
    skipping = False  # inside a line already answered as too large: drop until its newline
    async with sink:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 OSError):
            async for chunk in process.stdout:
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


async def _answer_oversized(head: bytes, sink: Any, limit: int, state: ProcessState) -> bool:
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


def _parse(line: bytes) -> Any:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _write_stdin(process: Any, source: Any, reader_sink: Any) -> None:
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await process.stdin.send(data.encode("utf-8"))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await reader_sink.aclose()  # the server is gone: pending requests end instead of hanging


async def _keep_stderr(process: Any, state: ProcessState) -> None:
    buffer = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        async for chunk in process.stderr:
            buffer = (buffer + chunk)[-64 * 1024:]
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace").strip()
                if text:
                    state.stderr.append(text[:_STDERR_LINE_CHARS])


async def _stop(process: Any, write_in: Any, read_out: Any) -> None:
    await write_in.aclose()
    read_out.close()
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if await _exited_within(process, _EXIT_GRACE_S):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        if await _exited_within(process, _EXIT_GRACE_S):
            return


async def _exited_within(process: Any, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
