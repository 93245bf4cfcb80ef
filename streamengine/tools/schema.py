"""Tool signatures -> JSON schema, and argument validation against that schema.

What the model is told and what is checked come from one place, the
function's signature, so the two can never drift apart.
"""
from __future__ import annotations

import collections.abc
import inspect
import json
import math
import re
import types
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from ..errors import ToolError
from ..messages import ToolContext
from ..text import json_type as _json_type

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NONE_TYPE = type(None)
_UNION_TYPE = getattr(types, "UnionType", None)  # ``int | None`` on Python 3.10+
_SUPPORTED_TYPES = (
    "str, int, float, bool, list / List[X], dict / Dict[str, X], Optional[X], "
    "Union[...], Literal[...] or Any"
)
_SIMPLE_TYPES = ((str, "string"), (bool, "boolean"), (int, "integer"), (float, "number"))
_SEQUENCE_ORIGINS = (list, collections.abc.Sequence, collections.abc.MutableSequence)
_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


# --------------------------------------------------------------------------- schema from hints


def _schema_for(hint: Any, where: str) -> Dict[str, Any]:
    """JSON schema for one type hint; unsupported hints fail at definition time."""
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    for py_type, json_type in _SIMPLE_TYPES:
        if hint is py_type:
            return {"type": json_type}
    if hint is _NONE_TYPE or hint is None:
        return {"type": "null"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin in _SEQUENCE_ORIGINS and origin is not None:
        return _array_schema(args, where)
    if hint is dict or origin in _MAPPING_ORIGINS and origin is not None:
        return _object_schema(args, where)
    if origin is typing.Literal:
        return _literal_schema(args, where)
    if origin is typing.Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        return _union_schema(args, where)
    raise ToolError(
        f"{where} has type {_type_name(hint)}, which cannot be described to the model as JSON; "
        f"use {_SUPPORTED_TYPES}"
    )


def _array_schema(args: Tuple[Any, ...], where: str) -> Dict[str, Any]:
    schema: Dict[str, Any] = {"type": "array"}
    if args and args[0] is not Any:
        schema["items"] = _schema_for(args[0], f"{where} (list items)")
    return schema


def _object_schema(args: Tuple[Any, ...], where: str) -> Dict[str, Any]:
    schema: Dict[str, Any] = {"type": "object"}
    if args:
        if args[0] is not str and args[0] is not Any:
            raise ToolError(f"{where} is a dict with {_type_name(args[0])} keys; JSON object keys are strings, "
                            "use Dict[str, X]")
        if args[1] is not Any:
            schema["additionalProperties"] = _schema_for(args[1], f"{where} (dict values)")
    return schema


def _literal_schema(args: Tuple[Any, ...], where: str) -> Dict[str, Any]:
    for value in args:
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ToolError(f"{where} is a Literal with the value {value!r}; only str, int, float, bool "
                            "and None literals can be sent as JSON")
    schema: Dict[str, Any] = {"enum": list(args)}
    kinds = {_json_type(v) for v in args}
    if len(kinds) == 1:
        schema["type"] = kinds.pop()
    return schema


def _union_schema(args: Tuple[Any, ...], where: str) -> Dict[str, Any]:
    members = [a for a in args if a is not _NONE_TYPE]
    schemas = [_schema_for(a, where) for a in members]
    base = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return _nullable(base) if len(members) < len(args) else base


def _nullable(schema: Dict[str, Any]) -> Dict[str, Any]:
    if not schema:
        return {}
    if "enum" in schema:
        out = dict(schema, enum=list(schema["enum"]) + [None])
        out.pop("type", None)
        return out
    if isinstance(schema.get("type"), str):
        return dict(schema, type=[schema["type"], "null"])
    if "anyOf" in schema:
        return {"anyOf": list(schema["anyOf"]) + [{"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint)



# --------------------------------------------------------------------------- docstrings

_SECTION_RE = re.compile(r"^(\s*)(?:Args|Arguments|Parameters|Params)\s*:\s*$")
_ENTRY_RE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """First paragraph as the description, plus ``Args:`` / ``:param x:`` entries."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: List[str] = []
    for line in lines:
        if not line.strip() or _SECTION_RE.match(line) or _SPHINX_RE.match(line):
            break
        summary.append(line.strip())
    return " ".join(summary), _parse_param_docs(lines)


def _parse_param_docs(lines: List[str]) -> Dict[str, str]:
    params: Dict[str, str] = {}
    section_indent: Optional[int] = None
    entry_indent: Optional[int] = None
    current: Optional[str] = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        sphinx = _SPHINX_RE.match(line)
        if sphinx:
            current, section_indent = sphinx.group(1), None
            params[current] = sphinx.group(2).strip()
            entry_indent = indent
            continue
        header = _SECTION_RE.match(line)
        if header:
            section_indent, entry_indent, current = len(header.group(1)), None, None
            continue
        if not line.strip():
            continue
        if section_indent is None and current is None:
            continue
        if section_indent is not None and indent <= section_indent:
            section_indent, current = None, None  # the next section began
            continue
        entry = _ENTRY_RE.match(line) if section_indent is not None else None
        if entry and (entry_indent is None or indent <= entry_indent):
            entry_indent, current = indent, entry.group(2)
            params[current] = entry.group(3).strip()
        elif current is not None and entry_indent is not None and indent > entry_indent:
            params[current] = (params[current] + " " + line.strip()).strip()
        else:
            current = None
    return params


# --------------------------------------------------------------------------- validation


class _Invalid(Exception):
    """One argument problem; ``str()`` is the sentence the model reads."""


def _conform(value: Any, schema: Mapping[str, Any], path: str) -> Any:
    """Check ``value`` against our schema subset; returns it (ints coerced from 3.0)."""
    if not schema:
        return value
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _conform(value, option, path)
            except _Invalid:
                continue
        raise _Invalid(f"argument {path!r} must be {_describe(schema)}, got {_describe_value(value)}")
    if "type" in schema:
        value = _conform_type(value, schema, path)
    if "enum" in schema and not any(_same(value, choice) for choice in schema["enum"]):
        raise _Invalid(f"argument {path!r} must be {_describe(schema)}, got {_describe_value(value)}")
    if isinstance(value, list) and "items" in schema:
        value = [_conform(item, schema["items"], f"{path}[{i}]") for i, item in enumerate(value)]
    extra = schema.get("additionalProperties")
    if isinstance(value, dict) and isinstance(extra, Mapping):
        value = {key: _conform(item, extra, f"{path}[{key!r}]") for key, item in value.items()}
    return value


def _conform_type(value: Any, schema: Mapping[str, Any], path: str) -> Any:
    wanted = schema["type"]
    for json_type in ([wanted] if isinstance(wanted, str) else wanted):
        ok, converted = _matches(value, json_type)
        if ok:
            return converted
    raise _Invalid(f"argument {path!r} must be {_describe(schema)}, got {_describe_value(value)}")


def _matches(value: Any, json_type: str) -> Tuple[bool, Any]:
    # bool is an int in Python but not in JSON; an integral float (3.0) is an integer in JSON.
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if json_type == "string":
        return isinstance(value, str), value
    if json_type == "boolean":
        return isinstance(value, bool), value
    if json_type == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return is_number and isinstance(value, int), value
    if json_type == "number":
        return is_number and math.isfinite(value), value
    if json_type == "array":
        return isinstance(value, (list, tuple)), list(value) if isinstance(value, (list, tuple)) else value
    if json_type == "object":
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    if json_type == "null":
        return value is None, value
    return False, value


def _same(value: Any, choice: Any) -> bool:
    # 1 == True in Python; a JSON enum keeps them apart.
    return isinstance(value, bool) == isinstance(choice, bool) and value == choice


def _describe(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(c, ensure_ascii=False) for c in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_describe(option) for option in schema["anyOf"])
    wanted = schema.get("type")
    names = [wanted] if isinstance(wanted, str) else list(wanted or ["any value"])
    described = []
    for name in names:
        if name == "array" and isinstance(schema.get("items"), Mapping) and schema["items"]:
            described.append(f"array of {_describe(schema['items'])}")
        else:
            described.append(name)
    return " or ".join(described)


def _describe_value(value: Any) -> str:
    kind = _json_type(value)
    if value is None:
        return kind
    try:
        shown = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} {shown}"


# --------------------------------------------------------------------------- Tool


def _is_context_hint(hint: Any) -> bool:
    if isinstance(hint, type) and issubclass(hint, ToolContext):
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        members = [a for a in typing.get_args(hint) if a is not _NONE_TYPE]
        return len(members) == 1 and _is_context_hint(members[0])
    return False


def _resolve_hints(fn: Callable[..., Any], label: str) -> Dict[str, Any]:
    try:
        return typing.get_type_hints(fn, localns={"ToolContext": ToolContext}, include_extras=True)
    except Exception as exc:  # NameError, TypeError from ``list[int]`` on 3.9, ...
        raise ToolError(
            f"cannot read the type hints of {label}: {type(exc).__name__}: {exc}; every name in an "
            "annotation must be importable from the function's module (on Python 3.9 write "
            "Optional[int] / Union[int, str], not int | None)"
        ) from exc


def _split_annotated(hint: Any) -> Tuple[Any, Optional[str]]:
    """``Annotated[int, "how many"]`` -> (int, "how many")."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        notes = [e for e in extras if isinstance(e, str)]
        return base, (notes[0] if notes else None)
    return hint, None


def _json_default(value: Any) -> Tuple[bool, Any]:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, value


class _Signature:
    """What ``Tool`` learns from a function: schema, required names, context parameter."""

    def __init__(self, fn: Callable[..., Any], name: str, param_docs: Dict[str, str]) -> None:
        label = f"tool {name!r}"
        hints = _resolve_hints(fn, label)
        self.properties: Dict[str, Dict[str, Any]] = {}
        self.required: List[str] = []
        self.optional: Set[str] = set()
        self.context_param: Optional[str] = None
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name in ("self", "cls"):
            raise ToolError(
                f"{label}: the first parameter is {params[0].name!r}; decorate a plain function, or wrap "
                "a bound method with Tool.from_function(obj.method)"
            )
        for param in params:
            self._add(param, hints, label, param_docs)

    def _add(self, param: inspect.Parameter, hints: Dict[str, Any], label: str, docs: Dict[str, str]) -> None:
        where = f"parameter {param.name!r} of {label}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ToolError(f"{where}: {star}{param.name} cannot be described to the model; declare each "
                            "argument as a named parameter")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolError(f"{where} is positional-only; tools are called with keyword arguments, "
                            "remove the '/' from the signature")
        hint, note = _split_annotated(hints.get(param.name, inspect.Parameter.empty))
        if _is_context_hint(hint):
            if self.context_param is not None:
                raise ToolError(f"{label} declares two ToolContext parameters ({self.context_param!r} and "
                                f"{param.name!r}); keep one")
            self.context_param = param.name
            return
        if hint is inspect.Parameter.empty and param.default is not inspect.Parameter.empty \
                and param.default is not None:
            hint = type(param.default)  # ``limit=5`` says "integer" even without a hint
            if not any(hint is t for t, _ in _SIMPLE_TYPES):
                hint = Any
        schema = _schema_for(hint, where)
        description = note or docs.get(param.name)
        if description:
            schema = dict(schema, description=description)
        if param.default is inspect.Parameter.empty:
            self.required.append(param.name)
        else:
            self.optional.add(param.name)
            ok, default = _json_default(param.default)
            if ok:
                schema = dict(schema, default=default)
        self.properties[param.name] = schema

    def schema(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": "object", "properties": self.properties, "additionalProperties": False}
        if self.required:
            out["required"] = list(self.required)
        return out


