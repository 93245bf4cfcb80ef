"""Teaching the model the inline tool syntax: the system message the engine adds.

Used when ``tool_mode`` is ``inline`` or ``auto``; the scanner in
:mod:`streamengine._inline.scanner` reads back what this text asks the model to write.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Sequence

from .._messages import ToolSpec

TOOL_SYNTAX_HINT = (
    "You can call tools while you write your answer. To call a tool, write a block "
    "exactly like this anywhere in your reply:\n"
    '<tool name="NAME">{"argument": "value"}</tool>\n'
    "The body is one JSON object holding the tool's arguments (write {} if it takes "
    "none). Use double-quoted JSON, one block per call, and keep writing after it: "
    "the tool starts at once, and you will get the results afterwards and be asked "
    "for a revised answer. Every such block is executed, so never write one as an "
    "example or quotation."
)


def tool_instructions(specs: Sequence[ToolSpec]) -> str:
    """The system-message text that teaches the inline syntax and lists the tools.

    Returns ``""`` when there are no tools: nothing to teach, and a syntax
    lesson without tools only invites invented calls.
    """
    if not specs:
        return ""
    lines = [TOOL_SYNTAX_HINT, "", "Available tools:"]
    for spec in specs:
        lines.append(_tool_listing(spec))
    lines += ["", "Example:", _example_block(specs[0])]
    return "\n".join(lines)


def _tool_listing(spec: ToolSpec) -> str:
    head = f"- {spec.name}"
    description = " ".join(spec.description.split())
    if description:
        head += f": {description}"
    params = dict(spec.parameters or {})
    properties = params.get("properties") or {}
    if not properties:
        return head + "\n  arguments: none"
    required = set(params.get("required") or ())
    parts = []
    for key, schema in properties.items():
        schema = schema if isinstance(schema, dict) else {}
        kind = schema.get("type", "any")
        kind = "|".join(kind) if isinstance(kind, list) else str(kind)
        flag = "required" if key in required else "optional"
        text = f"    {key} ({kind}, {flag})"
        note = " ".join(str(schema.get("description", "")).split())
        if note:
            text += f": {note}"
        if "enum" in schema:
            text += f" one of {json.dumps(schema['enum'], ensure_ascii=False)}"
        parts.append(text)
    return head + "\n  arguments:\n" + "\n".join(parts)


_PLACEHOLDERS = {"string": "...", "integer": 1, "number": 1.0, "boolean": True,
                 "array": [], "object": {}}


def _example_block(spec: ToolSpec) -> str:
    params = dict(spec.parameters or {})
    properties = params.get("properties") or {}
    required = list(params.get("required") or ())
    keys = [k for k in required if k in properties] or list(properties)[:1]
    example: Dict[str, Any] = {}
    for key in keys:
        schema = properties.get(key)
        kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
        example[key] = _PLACEHOLDERS.get(kind if isinstance(kind, str) else "string", "...")
    return f'<tool name="{spec.name}">{json.dumps(example, ensure_ascii=False)}</tool>'
