"""An MCP ``CallToolResult`` as the text the model reads.

Text blocks are joined; ``structuredContent`` is the result as JSON when
the server sent no text (the spec has servers repeat structured content as
text, and that text is what the server chose to show, e.g. the SDK's
``{"result": ...}`` wrapper around a plain string is left out); images, audio and resources become a
short line naming what came back (and the resource's URI), since the model
cannot read base64.  ``isError`` makes the server's text the error result.
"""
from __future__ import annotations

import json
from typing import Any, Callable, List

from .._redact import redact as redact_urls
from ..tools._results import ToolFailure


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
