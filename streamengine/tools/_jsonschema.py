"""pydantic's JSON schema, trimmed to what a model needs and OpenAI strict mode accepts.

pydantic emits ``title`` on every node, ``$ref`` into ``$defs`` for every
enum, dataclass and model, and ``anyOf [X, null]`` for ``Optional[X]``.  A
model reads the schema as prompt text, so titles are noise and references
make it look things up; here non-recursive references are inlined (recursive
ones stay as ``$ref`` into a top-level ``$defs``, which strict mode accepts),
titles go, ``Optional`` becomes ``"type": [X, "null"]``, and every object with
declared properties says ``additionalProperties: false``.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Set, Tuple

from .._validation import json_type

_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames")
_NULL = {"type": "null"}


def tidy(schema: Mapping[str, Any]) -> Dict[str, Any]:
    """The schema with references inlined where possible, titles dropped, nullables compact."""
    defs = dict(schema.get("$defs", {}))
    kept: Set[str] = set()
    body = {k: v for k, v in schema.items() if k != "$defs"}
    out = _clean(_inline(body, defs, (), kept))
    pending, done = set(kept), set()
    while pending:  # a kept definition may itself keep others
        name = pending.pop()
        done.add(name)
        before = set(kept)
        defs[name] = _clean(_inline(defs[name], defs, (name,), kept))
        pending |= kept - before - done
    if kept:
        out["$defs"] = {name: defs[name] for name in sorted(kept)}
    return out


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _inline(node: Any, defs: Mapping[str, Any], stack: Tuple[str, ...], kept: Set[str]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, stack, kept) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and _ref_name(ref) in defs:
        name = _ref_name(ref)
        if name in stack:  # recursive: keep the reference
            kept.add(name)
            return {k: _inline(v, defs, stack, kept) for k, v in node.items()}
        target = _inline(defs[name], defs, stack + (name,), kept)
        siblings = {k: _inline(v, defs, stack, kept) for k, v in node.items() if k != "$ref"}
        return dict(target, **siblings)
    return {k: _inline(v, defs, stack, kept) for k, v in node.items()}


def _clean(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out: Dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _clean(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_clean(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = _clean(value)
        else:
            out[key] = value
    if out.get("items") == {}:
        del out["items"]
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    if "properties" in out:
        out["additionalProperties"] = False
    return _compact_nullable(out)


def _compact_nullable(node: Dict[str, Any]) -> Dict[str, Any]:
    """``anyOf [{type: T, ...}, {type: null}]`` -> ``{type: [T, null], ...}`` (enums stay anyOf)."""
    options = node.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or _NULL not in options:
        return node
    other = options[0] if options[1] == _NULL else options[1]
    siblings = {k: v for k, v in node.items() if k != "anyOf"}
    if other == {}:  # Optional[Any] (Python < 3.11 adds Optional for a None default): {} already admits null
        return siblings
    if not isinstance(other.get("type"), str) or "enum" in other or "const" in other:
        return node
    return dict(other, type=[other["type"], "null"], **siblings)


# --------------------------------------------------------------------------- reading a schema


def resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow a ``$ref`` into the root's ``$defs`` (the only references :func:`tidy` leaves)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = root.get("$defs", {}).get(_ref_name(ref))
        if isinstance(target, Mapping):
            return dict(target, **{k: v for k, v in node.items() if k != "$ref"})
    return node


def describe(schema: Mapping[str, Any], root: Optional[Mapping[str, Any]] = None, depth: int = 0) -> str:
    """A few words for what the schema wants: ``integer``, ``array of boolean or null``, ``one of "a", "b"``."""
    schema = resolve(schema, root or {})
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(c, ensure_ascii=False) for c in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if "anyOf" in schema:
        return " or ".join(describe(option, root, depth) for option in schema["anyOf"])
    wanted = schema.get("type")
    names = [wanted] if isinstance(wanted, str) else list(wanted or ["any value"])
    return " or ".join(_describe_type(name, schema, root, depth) for name in names)


def _describe_type(name: str, schema: Mapping[str, Any], root: Optional[Mapping[str, Any]], depth: int) -> str:
    items = schema.get("items")
    if name == "array" and isinstance(items, Mapping) and items and depth < 2:
        return f"array of {describe(items, root, depth + 1)}"
    if name == "object" and isinstance(schema.get("properties"), Mapping) and depth < 2:
        fields = ", ".join(repr(str(f)) for f in schema["properties"])
        return f"object with fields {fields}" if fields else "empty object"
    if name == "string" and isinstance(schema.get("format"), str):
        return f"string ({schema['format']})"
    return name


def describe_value(value: Any) -> str:
    """The JSON type and a short JSON rendering of a value the model sent: ``string "3"``."""
    kind = json_type(value)
    if value is None:
        return kind
    try:
        shown = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} {shown}"
