"""The stdio transport: an MCP server as a child process, with what it said on stderr kept.

The SDK's ``stdio_client`` hides the process, so a server that crashes
mid-call shows only as "Connection closed".  This transport owns the
process itself: it keeps the last lines of stderr and the exit status, so a
failed call can name both.  Messages are newline-delimited JSON-RPC, as in
the SDK; shutdown follows the spec's order (close stdin, wait, SIGTERM the
process group, SIGKILL), every wait bounded.
"""
from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
from typing import Any, AsyncIterator, Deque, Dict, List, Optional

import anyio
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

#: Lines of stderr kept for error messages, and the characters kept of each.
STDERR_LINES = 20
_STDERR_LINE_CHARS = 300
#: Seconds a server gets to exit after its stdin closes, then after SIGTERM.
_EXIT_GRACE_S = 2.0
#: Largest JSON-RPC line accepted from a server: a runaway server cannot fill memory.
MAX_LINE_BYTES = 16 * 1024 * 1024


class ProcessState:
    """What the caller may read about the child: its pid, exit status and stderr tail."""

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.stderr: Deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.process: Any = None

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
                          state: ProcessState) -> AsyncIterator[Any]:
    """Start ``command args`` and yield the (read, write) streams the MCP session drives."""
    process = await anyio.open_process([command, *args], env={**get_default_environment(), **(env or {})},
                                       cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
    state.process, state.pid = process, process.pid
    read_in, read_out = anyio.create_memory_object_stream(0)
    write_in, write_out = anyio.create_memory_object_stream(0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read_stdout, process, read_in)
        tasks.start_soon(_write_stdin, process, write_out, read_in)
        tasks.start_soon(_keep_stderr, process, state)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, write_in, read_out)
                state.returncode = process.returncode
            tasks.cancel_scope.cancel()


async def _read_stdout(process: Any, sink: Any) -> None:
    buffer = b""
    async with sink:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                                 OSError):
            async for chunk in process.stdout:
                buffer += chunk
                if len(buffer) > MAX_LINE_BYTES:
                    await sink.send(ValueError(f"the server sent a line over {MAX_LINE_BYTES} bytes; "
                                               "closing the connection"))
                    return
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        await sink.send(_parse(line))


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
