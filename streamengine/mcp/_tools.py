"""An MCP server's tools as engine tools: their schema, eagerness, and results as the text the model reads.

An MCP ``CallToolResult`` as the text the model reads.

Text blocks are joined; ``structuredContent`` is the result as JSON when
the server sent no text (the spec has servers repeat structured content as
text, and that text is what the server chose to show, e.g. the SDK's
``{"result": ...}`` wrapper around a plain string is left out); images, audio and resources become a
short line naming what came back (and the resource's URI), since the model
cannot read base64.  ``isError`` makes the server's text the error result.

An MCP server's tools as engine :class:`Tool` s: the server's schema, eager only where it is safe.

A tool may start while the model is still talking only when it cannot
write.  The MCP spec calls annotations *hints* from servers that may not be
trusted, so by default they decide nothing: every tool of a server is a
side-effect tool (held until the stream finished normally, then
``approve``) unless the caller names it in ``eager=`` (or passes
``eager=True``).  With ``trust_annotations=True`` a tool that says
``readOnlyHint: true`` is eager, unless it also says ``destructiveHint:
true``: a tool that claims both is taken at its more dangerous word.
Each tool says why it is what it is (:attr:`McpTool.side_effects_reason`).
"""
from __future__ import annotations

import concurrent.futures
import json
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Tuple, Union

from .._errors import ConfigError, ToolError
from .._logs import redact as redact_urls
from .._messages import ToolContext
from .._validation import short_repr
from ..tools._schema import _NAME_RE
from ..tools._tool import Tool, ToolFailure
from ._transports import bad_name


class McpToolError(ToolFailure):
    """An MCP call that failed: the message (the server's own text, or what went wrong) is the result."""


def result_text(result: Any, tool_name: str, redact: Callable[[str], str] = redact_urls) -> str:
    """The text of ``result``; raises :class:`McpToolError` with the server's text when ``isError``.

    ``redact`` hides the server's credentials in that error (a server may
    quote the URL it was called at); a result that is not an error is the
    server's content and is left as it is.
    """
    described = [_describe(block) for block in result.content if getattr(block, "type", "") != "text"]
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    if result.is_error:
        detail = "\n".join(texts + described).strip() or "the server gave no reason"
        raise McpToolError(redact(f"tool '{tool_name}' failed: {detail}"))
    parts: List[str] = []
    if texts:
        parts.extend(texts)
    elif result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    parts.extend(described)
    return "\n".join(parts)


def _describe(block: Any) -> str:
    kind = getattr(block, "type", "?")
    if kind in ("image", "audio"):
        size = len(getattr(block, "data", "") or "") * 3 // 4
        return f"[{kind} returned: {block.mime_type}, about {size} bytes; not shown to the model]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}" + (f" ({block.name})" if getattr(block, "name", None) else "") + "]"
    if kind == "resource":
        resource = block.resource
        mime = getattr(resource, "mime_type", None) or "unknown type"
        text = getattr(resource, "text", None)
        if text is not None:
            return f"[resource {resource.uri} ({mime})]\n{text}"
        return f"[resource returned: {resource.uri} ({mime}, binary); not shown to the model]"
    return f"[{kind} content returned; not shown to the model]"


Eager = Union[None, bool, Collection[str]]


class McpTool(Tool):
    """One tool of one MCP server; the executor starts it on the MCP loop, no worker thread held."""

    starts_itself = True
    rename_hint = "McpServer.tools(prefix='...') (e.g. prefix='crm_')"

    def __init__(self, server: Any, remote_name: str, name: str, description: str, schema: Dict[str, Any],
                 side_effects: bool, annotations: Optional[Dict[str, Any]], timeout: Optional[float] = None,
                 side_effects_reason: str = "", annotations_trusted: bool = False) -> None:
        super().__init__(self._call_blocking, name=name, description=description, side_effects=side_effects,
                         parameters=schema, timeout=timeout)
        # Declared here, not in the class body, for the reason Tool.__init__ gives.
        self.server: Any
        self.remote_name: str
        self.annotations: Dict[str, Any]
        self.annotations_trusted: bool
        self.side_effects_reason: str
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "remote_name", remote_name)
        #: The server's annotations as it sent them (hints, trusted or not).
        object.__setattr__(self, "annotations", dict(annotations or {}))
        #: Whether ``annotations`` decided ``side_effects`` (``McpServer.tools(trust_annotations=True)``).
        object.__setattr__(self, "annotations_trusted", annotations_trusted)
        #: Why the tool is eager or not, in words (``streamengine mcp list`` shows it).
        object.__setattr__(self, "side_effects_reason", side_effects_reason)

    def start(self, checked: Dict[str, Any], context: ToolContext) -> concurrent.futures.Future[str]:
        future: concurrent.futures.Future[str] = self.server._start_call(self, checked)
        return future

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
        return (f"McpTool(name={self.name!r}, server={self.server.name!r}, side_effects={self.side_effects!r}: "
                f"{self.side_effects_reason or '-'})")


def build_tools(server: Any, listed: List[Any], prefix: Optional[str], include: Optional[Collection[str]],
                eager: Eager, timeout: Optional[float] = None, trust_annotations: bool = False) -> List[McpTool]:
    """The server's listed tools, named ``prefix + name``, filtered by ``include`` (names after prefix)."""
    prefix = _check_prefix(prefix)
    if not isinstance(trust_annotations, bool):
        raise ConfigError(f"trust_annotations must be True or False, got {trust_annotations!r}")
    names = _unique_names(listed, prefix, server.name)
    wanted = _check_names(include, "include", names, server.name)
    eager_names = _eager_names(eager, names, server.name)
    made: List[McpTool] = []
    for shown, listed_tool in names.items():
        if wanted is not None and shown not in wanted:
            continue
        if not _NAME_RE.fullmatch(shown):
            server._warn(bad_name(server.name, shown))
            continue
        annotations = _annotations(listed_tool)
        side_effects, reason = _side_effects(annotations, shown in eager_names, trust_annotations)
        made.append(McpTool(server, listed_tool.name, shown, listed_tool.description or listed_tool.title or "",
                            listed_tool.input_schema, side_effects, annotations, timeout, reason, trust_annotations))
    return made


def _side_effects(annotations: Dict[str, Any], named_eager: bool, trusted: bool) -> Tuple[bool, str]:
    """Whether a tool waits for the stream's end and ``approve``, and why (the words ``mcp list`` shows)."""
    if named_eager:
        return False, "named in eager="
    if not trusted:
        return True, "server annotations not trusted (trust_annotations=False)"
    if annotations.get("destructiveHint") is True:
        return True, "server annotations trusted: destructiveHint: true"
    if annotations.get("readOnlyHint") is True:  # the spec's default: false
        return False, "server annotations trusted: readOnlyHint: true"
    return True, "server annotations trusted: not marked readOnlyHint: true"


def _unique_names(listed: List[Any], prefix: str, server: str) -> Dict[str, Any]:
    names: Dict[str, Any] = {}
    for listed_tool in listed:
        shown = prefix + listed_tool.name
        if shown in names:
            raise ConfigError(f"MCP server {server!r} lists two tools named {short_repr(listed_tool.name)}; "
                              "a server's tool names must be unique: fix the server (neither is used until then)")
        names[shown] = listed_tool
    return names


def _annotations(listed_tool: Any) -> Dict[str, Any]:
    annotations = getattr(listed_tool, "annotations", None)
    if annotations is None:
        return {}
    dumped: Dict[str, Any] = annotations.model_dump(by_alias=True, exclude_none=True)
    return dumped


def _check_prefix(prefix: Any) -> str:
    if prefix is None:
        return ""
    if not isinstance(prefix, str) or not _NAME_RE.fullmatch(prefix):
        raise ConfigError(f"prefix must be a short name of A-Z, a-z, 0-9, '_', '.', '-' (e.g. 'crm_'), "
                          f"got {prefix!r}")
    return prefix


def _check_names(given: Any, what: str, names: Dict[str, Any], server: str) -> Optional[Set[str]]:
    if given is None:
        return None
    if isinstance(given, str) or not isinstance(given, Collection):
        raise ConfigError(f"{what}= takes a collection of tool names (e.g. {what}={{'get_time'}}), got {given!r}")
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{what}= names tools MCP server {server!r} does not offer: {unknown}; it offers "
                          f"{sorted(names)} (names as the model sees them, after prefix=)")
    return set(given)


def _eager_names(eager: Eager, names: Dict[str, Any], server: str) -> Set[str]:
    if eager is None or eager is False:
        return set()
    if eager is True:
        return set(names)
    checked = _check_names(eager, "eager", names, server)
    return checked or set()
