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
from ..tools._tool import ToolRegistry
from ._server import McpServer
from ._tools import McpTool


def open_servers(commands: Sequence[str], urls: Sequence[str], headers: Dict[str, str]) -> List[McpServer]:
    """Start every ``--mcp COMMAND`` and ``--mcp-url URL`` server; all closed again if one fails.

    ``headers`` (``--mcp-header``) go to the URL servers only; the provider's
    ``--header`` and API key never reach an MCP server.
    """
    if headers and not urls:
        raise ConfigError("--mcp-header applies to --mcp-url servers; pass --mcp-url URL too")
    servers = [stdio_from_flag(text) for text in commands] + [McpServer.http(url, headers=headers) for url in urls]
    try:
        for server in servers:
            server.start()
        _check_names([t for s in servers for t in s.tools()])
    except BaseException:
        close_all(servers)
        raise
    return servers


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
    """Print a server's tools: name, whether it starts mid-stream, description, JSON schema."""
    server = _server_from(args)
    with server:
        listed = server.list_tools()
        tools = server.tools()
    if args.json:
        out.write(json.dumps(listed, indent=2, ensure_ascii=False) + "\n")
        return 0
    out.write(f"{server.name}: {len(tools)} tool(s)\n")
    for tool, raw in zip(tools, listed):
        when = "side effects: runs after the stream, then approve" if tool.side_effects \
            else "read-only: starts mid-stream"
        out.write(f"\n{tool.name}  ({when})\n")
        if tool.description:
            out.write(f"  {tool.description}\n")
        out.write(f"  schema: {json.dumps(raw.get('inputSchema', {}), ensure_ascii=False)}\n")
    return 0


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
