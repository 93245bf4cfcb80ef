"""The command line's MCP part: ``--mcp``/``--mcp-url`` servers for an engine, and ``streamengine mcp list``.

Imported only when one of those flags is used, so the rest of the command
line works without the ``mcp`` extra (and on Python 3.9).
"""
from __future__ import annotations

import argparse
import json
import shlex
from typing import Dict, List, Sequence, TextIO

from .._errors import ConfigError
from .._logs import for_terminal, is_terminal
from ..tools._tool import ToolRegistry
from ._server import McpServer
from ._tools import McpTool


def open_servers(commands: Sequence[str], urls: Sequence[str], headers: Dict[str, str],
                 trust: bool = False) -> List[McpServer]:
    """Start every ``--mcp COMMAND`` and ``--mcp-url URL`` server; all closed again if one fails.

    ``headers`` (``--mcp-header``) go to the URL servers only; the provider's
    ``--header`` and API key never reach an MCP server.  ``trust``
    (``--mcp-trust``): see :func:`server_tools`.
    """
    if headers and not urls:
        raise ConfigError("--mcp-header applies to --mcp-url servers; pass --mcp-url URL too")
    servers = [stdio_from_flag(text) for text in commands] + [McpServer.http(url, headers=headers) for url in urls]
    try:
        for server in servers:
            server.start()
        _check_names(server_tools(servers, trust))
    except BaseException:
        close_all(servers)
        raise
    return servers


def server_tools(servers: Sequence[McpServer], trust: bool) -> List[McpTool]:
    """Every server's tools; their annotations trusted only with ``trust`` (``--mcp-trust``).

    Untrusted (the default), every tool counts as one with side effects, so
    it runs only when approved; trusted, a tool the server marks read-only
    (and not destructive) starts mid-stream.
    """
    return [t for s in servers for t in (s.tools(trust_annotations=True) if trust else s.tools())]


def stdio_from_flag(text: str) -> McpServer:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"--mcp {text!r}: {exc}; quote it as one argument: --mcp \"COMMAND ARGS...\"") from exc
    if not words:
        raise ConfigError("--mcp needs a command, e.g. --mcp \"mcp-server-time --local-timezone UTC\"")
    return McpServer.stdio(words[0], *words[1:])


def close_all(servers: Sequence[McpServer]) -> None:
    for server in servers:
        server.close()


def _check_names(tools: List[McpTool]) -> None:
    try:
        ToolRegistry(tools)
    except Exception as exc:
        raise ConfigError(f"{exc}; on the command line two servers cannot share a tool name: load one of them "
                          "from Python with McpServer.tools(prefix=...)") from exc


# --------------------------------------------------------------------------- streamengine mcp list

def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    """Print a server's tools: name, what happens when the model calls it, description, JSON schema.

    At a terminal, what the server wrote is shown with its control characters
    visible (a description is the server's text, as hostile as a model's).
    """
    trust = getattr(args, "mcp_trust", False)
    server = _server_from(args)
    with server:
        listed = server.list_tools()
        tools = server_tools([server], trust)
    if args.json:
        out.write(json.dumps(listed, indent=2, ensure_ascii=not is_terminal(out)) + "\n")  # escapes, at a terminal
        return 0
    shown = for_terminal if is_terminal(out) else (lambda text: text)
    out.write(shown(f"{server.name}: {len(tools)} tool(s); {_TRUSTED if trust else _UNTRUSTED}\n"))
    for tool, raw in zip(tools, listed):
        out.write(shown(f"\n{tool.name}  ({_what_happens(tool, trust)})\n"))
        if tool.description:
            out.write(shown(f"  {tool.description}\n"))
        out.write(shown(f"  schema: {json.dumps(raw.get('inputSchema', {}), ensure_ascii=False)}\n"))
    return 0


_TRUSTED = "annotations trusted (--mcp-trust): a tool marked read-only starts mid-stream, unasked"
_UNTRUSTED = "annotations not trusted: every tool counts as one with side effects (--mcp-trust trusts them)"


def _what_happens(tool: McpTool, trust: bool) -> str:
    """What the command line does when the model calls ``tool``: said as it happens, not as the server hopes."""
    if not tool.side_effects:
        return "read-only: starts mid-stream, without approval"
    said = "side effects: chat at a terminal asks before it runs; otherwise refused unless approved (--yes, " \
           "serve --approve all)"
    if not trust and tool.annotations.get("readOnlyHint") is True:
        said += "; the server calls it read-only, not trusted without --mcp-trust"
    return said


def _server_from(args: argparse.Namespace) -> McpServer:
    words = [w for w in args.server if w != "--"]
    if bool(words) == bool(args.mcp_url):
        raise ConfigError("streamengine mcp list needs one server: a COMMAND with its arguments, or --mcp-url URL")
    headers = dict(args.mcp_header)
    if args.mcp_url:
        return McpServer.http(args.mcp_url[0], headers=headers)
    if headers:
        raise ConfigError("--mcp-header applies to --mcp-url servers")
    return McpServer.stdio(words[0], *words[1:])
