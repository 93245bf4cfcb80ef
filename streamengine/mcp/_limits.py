"""What one MCP server may send: the size of an answer, and how many tools of what size it may list.

A server is code you did not write, reached over a pipe or the network.
These bounds hold whatever it sends; past each, a warning or an error
result says which setting to raise, and nothing grows without bound.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, List, Set

from .._validation import count, short_repr
from ..tools._schema import _NAME_RE

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


def bounded_listing(listed: List[Any], limits: McpLimits, server: str, warn: Warnings) -> List[Any]:
    """The first ``max_tools`` tools, descriptions cut to size, tools with an oversized schema left out."""
    kept: List[Any] = []
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


def _cut_texts(listed_tool: Any, chars: int, server: str, warn: Warnings) -> Any:
    update = {}
    for field in ("description", "title"):
        text = getattr(listed_tool, field, None)
        if isinstance(text, str) and len(text) > chars:
            update[field] = text[:chars] + " [...]"
            warn(f"MCP server {server!r}: the {field} of tool {short_repr(listed_tool.name)} is {len(text)} "
                 f"characters; cut to McpLimits.max_description_chars={chars}")
    return listed_tool.model_copy(update=update) if update else listed_tool
