"""An MCP server's tools as engine :class:`Tool` s: the server's schema, eager only where it is safe.

Which tools may start while the model is still talking follows the MCP
spec's annotations and their defaults: ``readOnlyHint`` defaults to
``false``, so a tool that does not say it is read-only is treated as having
side effects (held until the stream finished normally, then ``approve``).
``destructiveHint``/``idempotentHint``/``openWorldHint`` do not change that:
they only mean something for a tool that may write.  ``eager=True`` (every
tool) or a set of names overrides the rule for servers the caller trusts.
"""
from __future__ import annotations

import concurrent.futures
from typing import Any, Collection, Dict, List, Optional, Union

from .._errors import ConfigError, ToolError
from .._tool_context import ToolContext
from ..tools._schema import _NAME_RE
from ..tools._tool import Tool

Eager = Union[None, bool, Collection[str]]


class McpTool(Tool):
    """One tool of one MCP server; the executor starts it on the MCP loop, no worker thread held."""

    starts_itself = True
    rename_hint = "McpServer.tools(prefix='...') (e.g. prefix='crm_')"

    def __init__(self, server: Any, remote_name: str, name: str, description: str, schema: Dict[str, Any],
                 side_effects: bool, annotations: Optional[Dict[str, Any]], timeout: Optional[float] = None) -> None:
        super().__init__(self._call_blocking, name=name, description=description, side_effects=side_effects,
                         parameters=schema, timeout=timeout)
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "remote_name", remote_name)
        object.__setattr__(self, "annotations", dict(annotations or {}))

    def start(self, checked: Dict[str, Any], context: ToolContext) -> "concurrent.futures.Future[str]":
        return self.server._start_call(self, checked)

    def _invoke(self, checked: Dict[str, Any], context: Optional[ToolContext]) -> str:
        """Called directly (``tool.run(...)``, not through the engine): wait here, bounded by the context."""
        context = context if context is not None else ToolContext()
        future = self.start(checked, context)
        stop = context.cancel_event.is_set
        while not future.done():
            if stop() or context.remaining() <= 0:
                future.cancel()
                raise ToolError(f"tool '{self.name}' cancelled")
            try:
                return future.result(min(0.05, context.remaining()))
            except concurrent.futures.TimeoutError:
                continue
        return future.result()

    def _call_blocking(self, **arguments: Any) -> str:
        return self._invoke(arguments, None)

    def __repr__(self) -> str:
        return f"McpTool(name={self.name!r}, server={self.server.name!r}, side_effects={self.side_effects!r})"


def build_tools(server: Any, listed: List[Any], prefix: Optional[str], include: Optional[Collection[str]],
                eager: Eager, timeout: Optional[float] = None) -> List[McpTool]:
    """The server's listed tools, named ``prefix + name``, filtered by ``include`` (names after prefix)."""
    prefix = _check_prefix(prefix)
    names = {prefix + t.name: t for t in listed}
    wanted = _check_names(include, "include", names, server.name)
    eager_names = _eager_names(eager, names, server.name)
    made: List[McpTool] = []
    for shown, listed_tool in names.items():
        if wanted is not None and shown not in wanted:
            continue
        if not _NAME_RE.fullmatch(shown):
            raise ConfigError(f"MCP server {server.name!r} offers a tool named {shown!r}, which model providers "
                              "refuse (1-64 characters from A-Z, a-z, 0-9, '_', '.', '-'); leave it out with "
                              "include=[...]")
        annotations = _annotations(listed_tool)
        read_only = annotations.get("readOnlyHint") is True  # the spec's default: false
        side_effects = not (read_only or shown in eager_names)
        made.append(McpTool(server, listed_tool.name, shown, listed_tool.description or listed_tool.title or "",
                            listed_tool.input_schema, side_effects, annotations, timeout))
    return made


def _annotations(listed_tool: Any) -> Dict[str, Any]:
    annotations = getattr(listed_tool, "annotations", None)
    if annotations is None:
        return {}
    return annotations.model_dump(by_alias=True, exclude_none=True)


def _check_prefix(prefix: Any) -> str:
    if prefix is None:
        return ""
    if not isinstance(prefix, str) or not _NAME_RE.fullmatch(prefix):
        raise ConfigError(f"prefix must be a short name of A-Z, a-z, 0-9, '_', '.', '-' (e.g. 'crm_'), "
                          f"got {prefix!r}")
    return prefix


def _check_names(given: Any, what: str, names: Dict[str, Any], server: str) -> Optional[set]:
    if given is None:
        return None
    if isinstance(given, str) or not isinstance(given, Collection):
        raise ConfigError(f"{what}= takes a collection of tool names (e.g. {what}={{'get_time'}}), got {given!r}")
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{what}= names tools MCP server {server!r} does not offer: {unknown}; it offers "
                          f"{sorted(names)} (names as the model sees them, after prefix=)")
    return set(given)


def _eager_names(eager: Eager, names: Dict[str, Any], server: str) -> set:
    if eager is None or eager is False:
        return set()
    if eager is True:
        return set(names)
    checked = _check_names(eager, "eager", names, server)
    return checked or set()

