"""The tools a run gets besides the registry's, and what lets a side-effect tool run.

With a store (``rag=``) the engine registers its own ``rag_search`` template
and hands each run a copy bound to the run's scope.  The application's own
Python ``rag_search`` wins, as documented; one an MCP server offers is a
clash refused at construction, like any other name clash: it would silently
replace the scoped search.  A side-effect tool runs only when an ``approve``
hook returns True; an engine that has such tools and no hook says so once,
when it is built.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from .._errors import ConfigError
from ..tools import Tool, ToolRegistry
from .tool_calls import Approve


def checked_approve(approve: Any, where: str) -> Optional[Approve]:
    """``approve`` if it is a callable or None; anything else is a :class:`ConfigError` naming ``where``."""
    if approve is not None and not callable(approve):
        raise ConfigError(f"{where}: approve must be a callable taking a ToolCall and returning True to run it, "
                          f"got {type(approve).__name__}")
    return approve


def warn_unapproved(registry: ToolRegistry, log: Any) -> None:
    """Side-effect tools and nothing to approve them: said once, at construction, not per refused call."""
    unapproved = [t.name for t in registry if t.side_effects]
    if unapproved:
        log.warning("tools with side effects will not run, nothing approves them: {}; pass approve= to "
                    "StreamingEngine or run() to let them run", ", ".join(map(repr, unapproved)))


def register_rag_search(registry: ToolRegistry, rag: Any) -> Optional[Tool]:
    """Our ``rag_search`` template (its spec is what the model sees), or None if the application has its own."""
    from ..rag._search_tool import make_rag_search_tool
    if "rag_search" in registry:
        server = _mcp_server_of(registry.get("rag_search"))
        if server is not None:
            raise ConfigError(
                f"MCP server {server!r} offers a tool named 'rag_search', which would replace the engine's own "
                f"search of rag=; rename the server's tools with McpServer.tools(prefix='...') (e.g. "
                f"prefix='mcp_') or leave it out with McpServer.tools(include=[...]) naming the others")
        return None
    template = make_rag_search_tool(rag, scope=None)  # each run calls a copy bound to its scope
    registry.register(template)
    return template


def scoped_tools(registry: ToolRegistry, template: Optional[Tool], rag: Any, scope: str) -> Dict[str, Tool]:
    """The run's ``rag_search``, bound to its scope; none when the application's own is registered."""
    from ..rag._search_tool import bound_to_scope
    if template is None or registry.get("rag_search") is not template:
        return {}  # the application's own rag_search (registered before or after the engine) runs as is
    return {"rag_search": bound_to_scope(template, rag, scope)}


def _mcp_server_of(tool: Any) -> Optional[str]:
    """The name of the MCP server ``tool`` came from, or None for any other tool."""
    if "streamengine.mcp" not in sys.modules:  # no MCP tool exists before that package is imported
        return None
    from ..mcp import McpTool
    return tool.server.name if isinstance(tool, McpTool) else None
