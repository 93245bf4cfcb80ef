"""One closed inline tool block -> ``(name, canonical JSON arguments)``, or why not.

The scanner (:mod:`streamengine._inline.scanner`) finds where a block starts and
ends; this module decides whether what it found is a valid call.  Each
refusal raises :class:`BlockError` with a message the engine logs and the
user can act on.  The rules:

* Attributes other than ``name`` are string arguments, merged with the JSON
  object; **a key present in both takes the JSON value** (JSON is the typed,
  documented channel; attributes are shorthand).  Attribute values are taken
  literally: no entity expansion.  Attributes must be ``key="v"`` or
  ``key='v'``, separated by whitespace; keys match ``[A-Za-z_][A-Za-z0-9_.-]*``.
* A closed block is a parse error (visible text, ``parse_errors`` + 1, no call)
  when: an attribute is duplicated, unquoted, valueless or badly named; the
  name is missing, empty or not ``[A-Za-z0-9_.-]+`` (so no CR, LF, NUL,
  whitespace); the body is not a JSON object; the JSON nests deeper than
  ``max_json_depth``, repeats a key, uses ``NaN``/``Infinity`` or a number
  that overflows to them, or holds a lone surrogate.  Raw control characters
  (a literal newline) inside JSON strings are accepted, since models write
  them.  An empty (whitespace-only) body means no JSON arguments.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Optional, Tuple

from .._messages import too_deep, unique_keys

OPEN = "<tool"
CLOSE = "</tool>"
WS = " \t\r\n"

_ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_SNIPPET = 40


class BlockError(Exception):
    """A closed block that is not a valid tool call; the message says why."""


def parse_block(text: str, tag_len: int, self_closing: bool, max_json_depth: int) -> Tuple[str, str]:
    """Turn one closed block (start tag of ``tag_len`` chars, body, end tag) into a call."""
    tag = text[len(OPEN):tag_len - (2 if self_closing else 1)]
    body = "" if self_closing else text[tag_len:-len(CLOSE)]
    attrs = _parse_attributes(tag)
    name = attrs.pop("name", None)
    _check_name(name)
    args = _parse_body(body, max_json_depth)
    merged: Dict[str, Any] = dict(attrs)
    merged.update(args)  # a key in both: the JSON value wins
    arguments = json.dumps(merged, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    try:
        arguments.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BlockError("tool arguments contain a lone surrogate (not valid UTF-8)") from exc
    return name, arguments  # type: ignore[return-value]


def block_parts(text: str, tag_len: int, self_closing: bool) -> Tuple[str, str]:
    """``(name as written, raw body)`` of a closed block that failed to parse: what to tell the model.

    The name is ``""`` when it cannot be read or is not a valid tool name.
    """
    tag = text[len(OPEN):tag_len - (2 if self_closing else 1)]
    body = "" if self_closing else text[tag_len:-len(CLOSE)]
    try:
        name = _parse_attributes(tag).get("name") or ""
        _check_name(name)
    except BlockError:
        name = ""
    return name, body


def snippet(text: str) -> str:
    """The start of ``text``, quoted, for messages."""
    return _snippet(text)


def _snippet(text: str) -> str:
    return repr(text[:_SNIPPET] + ("..." if len(text) > _SNIPPET else ""))


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in WS:
        i += 1
    return i


def _parse_attributes(tag: str) -> Dict[str, str]:
    """``key="value"`` pairs of a start tag, literally (no entities); strict."""
    attrs: Dict[str, str] = {}
    i, n = 0, len(tag)
    while True:
        j = _skip_ws(tag, i)
        if j >= n:
            return attrs
        if j == i:
            raise BlockError(f"tool attributes must be separated by whitespace near {_snippet(tag[j:])}")
        m = _ATTR_NAME.match(tag, j)
        if m is None:
            raise BlockError(f"invalid attribute name in tool block near {_snippet(tag[j:])}")
        key = m.group()
        k = _skip_ws(tag, m.end())
        if k >= n or tag[k] != "=":
            raise BlockError(f'tool attribute {key!r} has no value; write {key}="..."')
        k = _skip_ws(tag, k + 1)
        quote = tag[k] if k < n else ""
        if quote not in ('"', "'"):
            raise BlockError(f'value of tool attribute {key!r} is not quoted; write {key}="..."')
        close = tag.find(quote, k + 1)
        if close < 0:
            raise BlockError(f"value of tool attribute {key!r} has no closing quote")
        if key in attrs:
            raise BlockError(f"tool attribute {key!r} is given twice")
        attrs[key] = tag[k + 1:close]
        i = close + 1


def _check_name(name: Optional[str]) -> None:
    if name is None:
        raise BlockError('tool block has no name attribute; write <tool name="NAME">{...}</tool>')
    if not name:
        raise BlockError("tool block has an empty name")
    if _TOOL_NAME.fullmatch(name) is None:
        raise BlockError(
            f"tool name {_snippet(name)} may only contain letters, digits, '_', '.' and '-'"
        )


def _parse_body(body: str, max_depth: int) -> Dict[str, Any]:
    """The body's JSON object ({} when empty), parsed with depth and key checks."""
    text = body.strip(WS)
    if not text:
        return {}
    if too_deep(text, max_depth):
        raise BlockError(f"tool arguments nest deeper than {max_depth} levels")
    try:
        # strict=False: models often write raw newlines/tabs inside JSON strings
        # (code, multi-line text); the canonical form re-escapes them.
        value = json.loads(text, object_pairs_hook=unique_keys, parse_constant=_reject_constant,
                           parse_float=_finite_float, strict=False)
    except RecursionError as exc:
        raise BlockError(f"tool arguments nest deeper than {max_depth} levels") from exc
    except ValueError as exc:  # JSONDecodeError, duplicate keys, NaN, huge ints
        raise BlockError(f"tool arguments are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BlockError(f"tool arguments must be a JSON object, got {type(value).__name__}")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")
