"""Where a server is: a command to start (stdio) or a URL (streamable HTTP), and how to describe its faults.

Everything an endpoint says (its label, its faults, the server's stderr) is
shown, logged, raised or sent to the model, so it goes through
:attr:`Endpoint.redact` first: URLs lose their userinfo and query values,
and the credentials given to the server (a token in the URL, ``Authorization``
and other credential headers, ``--token VALUE`` arguments, credential-named
environment variables) are masked wherever they appear.
"""
from __future__ import annotations

import re
import shlex
import urllib.parse
from typing import Any, Dict, Iterable, List, Optional

import anyio

from .._clients.http.credentials import SENSITIVE_HEADER
from .._redact import Redactor, redact_url
from ._http import http_transport
from ._limits import McpLimits
from ._stdio import MAX_STOP_S, ProcessState, stdio_transport

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
        secrets = [v for k, v in (env or {}).items() if SENSITIVE_HEADER.search(k)] + _argument_secrets(args)
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
        self.url = redact_url(url)  # what may be shown
        self.redact = Redactor(_url_secrets(url) + _header_secrets(self.headers))
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
    """The credentials a URL carries (userinfo, query values): masked by value too, wherever they appear."""
    parsed = urllib.parse.urlsplit(url)
    values = [value for _, value in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)]
    return values + [v for v in (parsed.username, parsed.password) if v]


def _header_secrets(headers: Dict[str, str]) -> List[str]:
    """Credential headers' values, whole and word by word (``Bearer TOKEN`` may be shown as ``TOKEN``)."""
    values = [v for k, v in headers.items() if SENSITIVE_HEADER.search(k)]
    return values + [word for value in values for word in value.split()]


def _argument_secrets(args: Iterable[str]) -> List[str]:
    secrets: List[str] = []
    after_flag = False
    for arg in args:
        if after_flag and not arg.startswith("-"):
            secrets.append(arg)
        match = _SECRET_FLAG.match(arg)
        after_flag = bool(match) and match.group(1) is None
        if match and match.group(1):
            secrets.append(match.group(1))
    return secrets
