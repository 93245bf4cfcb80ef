"""Where a server is: a command to start (stdio) or a URL (streamable HTTP), and how to describe its faults."""
from __future__ import annotations

import contextlib
import shlex
from typing import Any, AsyncIterator, Dict, List, Optional

import anyio

from ._stdio import ProcessState, stdio_transport


class Endpoint:
    """The transport factory for one server, and the words its error messages use."""

    label = "MCP server"
    #: The SDK's ``Client(mode=...)``: "auto", "legacy" (the initialize handshake) or a version.
    protocol = "auto"
    #: Seconds a closing session gets before its runner task is cancelled outright.
    close_timeout = 8.0

    def transport(self) -> Any:
        raise NotImplementedError

    def describe_exit(self) -> str:
        return ""

    async def wait_exit(self, seconds: float) -> None:
        return None


class StdioEndpoint(Endpoint):
    def __init__(self, name: str, command: str, args: List[str], env: Optional[Dict[str, str]],
                 cwd: Optional[str]) -> None:
        self.name, self.command, self.args, self.env, self.cwd = name, command, args, env, cwd
        self.state = ProcessState()
        self.label = f"MCP server {name!r} ({shlex.join([command, *args])})"

    def transport(self) -> Any:
        self.state = ProcessState()  # a restart starts a new process with a fresh stderr tail
        return stdio_transport(self.command, self.args, self.env, self.cwd, self.state)

    def describe_exit(self) -> str:
        state = self.state
        if state.pid is None:
            return "the process did not start"
        return f"pid {state.pid}, {state.exit_text()}; last stderr: {state.stderr_tail()}"

    async def wait_exit(self, seconds: float) -> None:
        process = self.state.process
        if process is None:
            return
        with anyio.move_on_after(seconds):
            while process.returncode is None:
                await anyio.sleep(0.01)


class HttpEndpoint(Endpoint):
    def __init__(self, name: str, url: str, headers: Optional[Dict[str, str]]) -> None:
        self.name, self.url, self.headers = name, url, dict(headers or {})
        self.label = f"MCP server {name!r} at {url}"

    def transport(self) -> Any:
        return _http_transport(self.url, self.headers)

    def describe_exit(self) -> str:
        return f"check that the server at {self.url} is running and reachable"


@contextlib.asynccontextmanager
async def _http_transport(url: str, headers: Dict[str, str]) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    # The SDK's own defaults: a response stream may stay open for minutes; the engine's
    # per-tool timeout, not this read timeout, is what bounds a call.
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams
