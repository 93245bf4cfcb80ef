"""pydantic's validation errors as the one-line sentences the model reads.

A model fixes its call from the error text alone, so each problem names the
argument path (``flags[1]``, ``point.x``, ``scores['b']``), what the schema
wants in the words of the schema it was sent, and what it actually sent.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Sequence, Tuple

from ._jsonschema import describe, describe_value, resolve

_MISSING_KINDS = frozenset({"missing", "missing_argument", "missing_keyword_only_argument"})
_EXTRA_KINDS = frozenset({"extra_forbidden", "unexpected_keyword_argument"})
# Errors about the kind of value (answered with the schema's own words) rather than a constraint on it.
_KIND_ERRORS = frozenset({"int_from_float", "finite_number", "enum", "literal_error", "int_parsing",
                          "float_parsing", "bool_parsing", "is_instance_of", "union_tag_invalid",
                          "dataclass_exact_type", "model_attributes_type"})
_ABSENT = object()


def problems_from_errors(errors: Iterable[Mapping[str, Any]], schema: Mapping[str, Any],
                         args: Mapping[str, Any]) -> List[str]:
    """One sentence per distinct problem (a union reports once, not once per member)."""
    problems: List[str] = []
    for error in errors:
        text = _problem(error, schema, args)
        if text not in problems:
            problems.append(text)
    return problems


def _problem(error: Mapping[str, Any], root: Mapping[str, Any], args: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    path, node, value, rest = _locate(root, tuple(error.get("loc", ())), args)
    if kind in _MISSING_KINDS and not rest:
        return f"missing required argument {path!r} ({describe(node, root)})"
    if kind in _EXTRA_KINDS and len(rest) == 1:
        fields = ", ".join(repr(str(f)) for f in node.get("properties", {})) or "none"
        return f"unknown field {str(rest[0])!r} in argument {path!r}; allowed fields: {fields}"
    got = "nothing" if value is _ABSENT else describe_value(value)
    if rest or kind.endswith("_type") or kind in _KIND_ERRORS:
        return f"argument {path!r} must be {describe(node, root)}, got {got}"
    message = str(error.get("msg", kind))
    if message.startswith("Input should be "):
        return f"argument {path!r} must be {message[len('Input should be '):]}, got {got}"
    return f"argument {path!r}: {message} (got {got})"


def _locate(root: Mapping[str, Any], loc: Sequence[Any],
            args: Any) -> Tuple[str, Mapping[str, Any], Any, Tuple[Any, ...]]:
    """Walk the schema and the arguments along pydantic's ``loc`` as far as the schema goes.

    Returns the readable path, the schema there, the value sent there, and
    the steps not walked: a union's member tags, or a field the schema lacks.
    """
    node: Mapping[str, Any] = root
    value: Any = args
    path = ""
    for index, step in enumerate(loc):
        node = _without_null(resolve(node, root), value)
        if "anyOf" in node:
            return path, node, value, tuple(loc[index:])
        child, shown = _child(node, step, first=index == 0)
        if child is None:
            return path, node, value, tuple(loc[index:])
        node, path, value = child, path + shown, _get(value, step)
    return path, resolve(node, root), value, ()


def _without_null(node: Mapping[str, Any], value: Any) -> Mapping[str, Any]:
    """``Optional[X]`` -> ``X`` when the value is there (pydantic adds no union tag for it)."""
    options = node.get("anyOf")
    if value is not None and isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        return options[0] if options[1] == {"type": "null"} else options[1]
    return node


def _child(node: Mapping[str, Any], step: Any, first: bool) -> Tuple[Any, str]:
    properties = node.get("properties")
    if isinstance(step, str) and isinstance(properties, Mapping) and step in properties:
        return properties[step], (step if first else f".{step}")
    if isinstance(step, int):
        prefix = node.get("prefixItems")
        if isinstance(prefix, list) and 0 <= step < len(prefix):
            return prefix[step], f"[{step}]"
        if _allows(node, "array"):
            return node.get("items", {}), f"[{step}]"
    if isinstance(step, str) and _allows(node, "object") and not isinstance(properties, Mapping):
        extra = node.get("additionalProperties", {})
        return (extra if isinstance(extra, Mapping) else {}), f"[{step!r}]"
    return None, ""


def _allows(node: Mapping[str, Any], json_type: str) -> bool:
    wanted = node.get("type")
    return wanted == json_type or (isinstance(wanted, list) and json_type in wanted)


def _get(value: Any, step: Any) -> Any:
    try:
        return value[step]
    except (KeyError, IndexError, TypeError):
        return _ABSENT

