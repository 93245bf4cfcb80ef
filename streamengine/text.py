"""Short renderings of values for messages a person or a model reads.

One place, so an error line, a scenario report and a tool-argument error
describe a value the same way.
"""
from __future__ import annotations

from typing import Any

__all__ = ["json_type", "one_line", "short_repr"]


def one_line(text: Any) -> str:
    """Whitespace (newlines included) folded to single spaces: error lines stay one line."""
    return " ".join(str(text).split())


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``...``."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type: what the model or a browser sent."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__
