"""Tools: plain functions the model may call, and the pool that runs them.

``@tool`` turns a function into a :class:`Tool`: its JSON schema comes from
the signature and type hints, so what the model is told and what is checked
can never drift apart.  Arguments are validated *before* the call: a model
that invents or forgets an argument gets an error result, and the function
never runs on input it did not declare.

:class:`ToolExecutor` runs tools on its own daemon threads rather than a
``concurrent.futures.ThreadPoolExecutor``.  A hung tool cannot be killed in
Python; the stdlib pool joins its workers at interpreter exit (bpo-39812), so
one stuck tool would hang the host's shutdown.  Here a tool past its deadline
is abandoned with its cancel flag set, its slot stays counted until the
function really returns, and when every slot is stuck a new call gets an
immediate error instead of waiting in a queue forever.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import itertools
import json
import math
import re
import threading
import time
import types
import typing
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

from .cancel import CancelToken, on_cancel
from .errors import ConfigError, ToolError
from .logs import component_logger
from .messages import ToolCall, ToolSpec

__all__ = [
    "Tool", "ToolContext", "ToolExecutor", "ToolHandle", "ToolRegistry", "ToolResult",
    "result_to_text", "tool",
]

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


# --------------------------------------------------------------------------- context and result


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may look at to stop early.

    Declare a parameter annotated ``ToolContext`` (any name) to receive it; it
    is injected, never shown to the model.  ``cancelled`` turns true when the
    call is cancelled *or* its deadline has passed, so a polling loop stops on
    time even before anyone has noticed the timeout.
    """

    cancel_event: threading.Event = field(default_factory=threading.Event)
    deadline: Optional[float] = None  # time.monotonic() value; None = no deadline

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative; ``inf`` without one)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise :class:`ToolError` if the tool should stop now."""
        if self.cancel_event.is_set():
            raise ToolError("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ToolError("cancelled: deadline passed")

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return False at once if cancelled or past the deadline."""
        wait_s = min(max(0.0, seconds), self.remaining())
        if self.cancel_event.wait(wait_s if wait_s != math.inf else None):
            return False
        return not self.cancelled


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call; errors (invalid, skipped, timed out, raised) have ``ok=False``.

    ``text`` is the tool's output (empty for errors); ``error`` says what went
    wrong.  ``started_at``/``ended_at`` are ``time.monotonic()`` values, 0.0
    when the function never ran.  ``timed_out`` lets telemetry count timeouts
    without parsing messages.
    """

    call_id: str
    name: str
    ok: bool
    text: str
    error: Optional[str] = None
    duration_s: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    timed_out: bool = False

    @classmethod
    def error_result(
        cls,
        call: ToolCall,
        message: str,
        *,
        duration_s: float = 0.0,
        started_at: float = 0.0,
        ended_at: float = 0.0,
        timed_out: bool = False,
    ) -> "ToolResult":
        """An error result for ``call`` (skips, refusals, failures) carrying ``message``."""
        return cls(call.id, call.name, False, "", message, duration_s, started_at, ended_at, timed_out)


def result_to_text(value: Any) -> str:
    """What the model reads: str as is, None as "", containers and numbers as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, (dict, list, tuple, int, float, bool)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):  # non-string keys of odd types, cycles
            return str(value)
    return str(value)


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


def _json_type(value: Any) -> str:
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
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


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


class Tool:
    """A function the model may call; calling the ``Tool`` itself calls the function.

    Immutable after construction: its schema is shared by the spec the model
    sees and the validator that guards the function.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        timeout: Optional[float] = None,
        side_effects: bool = False,
    ) -> None:
        if not callable(fn):
            raise ToolError(f"a tool must wrap a function, got {type(fn).__name__}")
        name = name if name is not None else getattr(fn, "__name__", "")
        _check_name(name)
        timeout = _check_timeout(timeout, f"tool {name!r}")
        summary, param_docs = _parse_docstring(inspect.getdoc(fn))
        signature = _Signature(fn, name, param_docs)
        # The attributes, declared here rather than in the class body: any annotation there
        # gives Tool a class ``__annotations__`` that instances would show in place of the
        # wrapped function's (typing.get_type_hints(tool) would then read Tool's own hints).
        self.fn: Callable[..., Any]
        self.name: str
        self.description: str
        self.timeout: Optional[float]
        self.side_effects: bool
        self._schema: Dict[str, Any]
        self._required: Tuple[str, ...]
        self._optional: FrozenSet[str]
        self._context_param: Optional[str]
        self._spec: ToolSpec
        set_ = object.__setattr__  # __setattr__ refuses assignment: Tool is immutable
        set_(self, "fn", fn)
        set_(self, "name", name)
        set_(self, "description", description if description is not None else summary)
        set_(self, "timeout", timeout)
        set_(self, "side_effects", bool(side_effects))
        set_(self, "_schema", signature.schema())
        set_(self, "_required", tuple(signature.required))
        set_(self, "_optional", frozenset(signature.optional))
        set_(self, "_context_param", signature.context_param)
        set_(self, "_spec", ToolSpec(name, self.description, json.loads(json.dumps(self._schema))))
        set_(self, "__wrapped__", fn)
        set_(self, "__doc__", getattr(fn, "__doc__", None))
        set_(self, "__name__", getattr(fn, "__name__", name))
        set_(self, "__qualname__", getattr(fn, "__qualname__", name))
        set_(self, "__module__", getattr(fn, "__module__", None))

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: Optional[str] = None,
        description: Optional[str] = None,
        timeout: Optional[float] = None,
        side_effects: bool = False,
    ) -> "Tool":
        """Wrap ``fn``; a ``Tool`` given without options is returned as is."""
        if isinstance(fn, Tool):
            if name is None and description is None and timeout is None and not side_effects:
                return fn
            fn = fn.fn
        return cls(fn, name=name, description=description, timeout=timeout, side_effects=side_effects)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Tool {self.name!r} is immutable; build a new one with tool(fn, {key}=...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, timeout={self.timeout!r}, side_effects={self.side_effects!r})"

    @property
    def spec(self) -> ToolSpec:
        """Name, description and JSON schema, as sent to the model."""
        return self._spec

    @property
    def parameters(self) -> Dict[str, Any]:
        """A copy of the JSON schema of the arguments."""
        return json.loads(json.dumps(self._schema))

    @property
    def context_param(self) -> Optional[str]:
        """The parameter that receives the :class:`ToolContext`, if any."""
        return self._context_param

    def validate(self, args: Any) -> Dict[str, Any]:
        """Return the checked arguments, or raise :class:`ToolError` naming every problem.

        A null for an argument that has a default means "use the default"
        (models often send it for options they do not want to set).
        """
        if not isinstance(args, Mapping):
            raise ToolError(f"arguments for tool {self.name!r} must be a JSON object, got {_describe_value(args)}")
        properties = self._schema["properties"]
        problems = _unknown_and_missing(self.name, args, properties, self._required)
        checked: Dict[str, Any] = {}
        for key, value in args.items():
            if key not in properties or (value is None and key in self._optional):
                continue
            try:
                checked[key] = _conform(value, properties[key], key)
            except _Invalid as exc:
                problems.append(str(exc))
        if problems:
            raise ToolError(f"invalid arguments for tool {self.name!r}: " + "; ".join(problems))
        return checked

    def run(self, args: Mapping[str, Any], context: Optional[ToolContext] = None) -> str:
        """Validate ``args``, call the function, and return its value as text."""
        return self._invoke(self.validate(args), context)

    def _invoke(self, checked: Dict[str, Any], context: Optional[ToolContext]) -> str:
        kwargs = dict(checked)
        if self._context_param is not None:
            kwargs[self._context_param] = context if context is not None else ToolContext()
        return result_to_text(self.fn(**kwargs))


def _unknown_and_missing(name: str, args: Mapping[str, Any], properties: Mapping[str, Any],
                         required: Iterable[str]) -> List[str]:
    problems = []
    unknown = [key for key in args if key not in properties]
    if unknown:
        allowed = ", ".join(repr(p) for p in properties) or "none (this tool takes no arguments)"
        noun = "argument" if len(unknown) == 1 else "arguments"
        problems.append(f"unknown {noun} {', '.join(repr(str(k)) for k in unknown)}; allowed arguments: {allowed}")
    for key in required:
        if key not in args:
            problems.append(f"missing required argument {key!r} ({_describe(properties[key])})")
    return problems


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ToolError(
            f"tool name {name!r} is invalid: use 1-64 characters from A-Z, a-z, 0-9, '_', '.', '-' "
            "(pass name='...' to @tool for lambdas and callables without a usable __name__)"
        )


def _check_timeout(timeout: Any, label: str) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not math.isfinite(timeout) or timeout <= 0:
        raise ToolError(f"timeout of {label} must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def tool(
    fn: Any = None,
    *,
    name: Optional[str] = None,
    description: Optional[str] = None,
    timeout: Optional[float] = None,
    side_effects: bool = False,
) -> Any:
    """Make a :class:`Tool`: ``@tool``, ``@tool()``, ``@tool("name")`` or ``@tool(name=..., ...)``.

    ``side_effects=True`` tells the engine not to start the tool before the
    model's stream finished normally (no half-confirmed writes).
    """
    if isinstance(fn, str):
        if name is not None:
            raise ToolError(f"tool name given twice ({fn!r} and name={name!r}); pass it once")
        name, fn = fn, None

    def make(f: Any) -> Tool:
        return Tool.from_function(f, name=name, description=description, timeout=timeout,
                                  side_effects=side_effects)

    if fn is None:
        return make
    return make(fn)


# --------------------------------------------------------------------------- registry


class ToolRegistry:
    """The tools one engine offers, by name, in registration order."""

    def __init__(self, tools: Iterable[Any] = ()) -> None:
        self._tools: Dict[str, Tool] = {}
        self._lock = threading.Lock()
        for item in tools:
            self.register(item)

    def register(self, item: Any) -> Tool:
        """Add a :class:`Tool` or plain function; a second tool with the same name is refused."""
        made = Tool.from_function(item)
        with self._lock:
            if made.name in self._tools:
                raise ToolError(f"two tools are named {made.name!r}; give one of them another name with "
                                "@tool(name='...')")
            tools = dict(self._tools)
            tools[made.name] = made
            self._tools = tools  # copy-on-write: readers need no lock
        return made

    def get(self, name: str) -> Optional[Tool]:
        return self._tools.get(name)

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(self._tools)

    def specs(self) -> List[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"


# --------------------------------------------------------------------------- executor

_QUEUED, _RUNNING, _FINISHED, _DROPPED = "queued", "running", "finished", "dropped"


def _effective_timeout(tool: Tool, timeout: Optional[float]) -> float:
    chosen = tool.timeout if tool.timeout is not None else timeout
    if chosen is None:
        raise ConfigError(f"no timeout for tool {tool.name!r}: pass timeout= to submit() or to @tool")
    try:
        checked = _check_timeout(chosen, f"the call to tool {tool.name!r}")
    except ToolError as exc:
        raise ConfigError(str(exc)) from exc
    assert checked is not None
    return checked


def _fallback_log() -> Any:
    return component_logger("streamengine.tools.ToolHandle")


def _seconds(value: float) -> str:
    return f"{round(value, 3):g}"


class ToolHandle:
    """One submitted call: wait for its :class:`ToolResult`, or cancel it.

    The result is fixed once: by the function returning before its deadline,
    or by the deadline (a later real result is discarded), or by a cancel
    before it started.  ``result()`` never raises.
    """

    def __init__(self, executor: Optional["ToolExecutor"], tool: Optional[Tool], call: ToolCall,
                 args: Dict[str, Any], timeout: float, on_start: Optional[Callable[["ToolHandle"], None]]) -> None:
        self.call = call
        self.tool = tool
        self.timeout = timeout
        self.submitted_at = time.monotonic()
        self.deadline = self.submitted_at + timeout
        self.started_at: Optional[float] = None  # monotonic, the instant the function is entered
        self.cancel_event = CancelToken()
        self._executor = executor
        self._args = args
        self._on_start = on_start
        self._state = _QUEUED
        self._abandoned = False  # the deadline passed while the function ran
        # When the cancel flag went up (monotonic): a running tool that has not
        # returned a grace period later is ignoring it, and its slot is stuck.
        self.cancelled_at: Optional[float] = None
        self.cancel_event.add_callback(self._note_cancel)
        self._result: Optional[ToolResult] = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._unlink: Callable[[], None] = lambda: None
        self._external: Optional[threading.Event] = None  # the caller's cancel event
        self._callbacks: List[Callable[["ToolHandle"], None]] = []

    @classmethod
    def _settled(cls, tool: Optional[Tool], call: ToolCall, result: ToolResult) -> "ToolHandle":
        handle = cls(None, tool, call, {}, 0.0, None)
        handle._state = _DROPPED
        handle._settle(result)
        return handle

    # -- public

    def result(self, timeout: Optional[float] = None) -> ToolResult:
        """Wait for the result, at most until the deadline (or ``timeout`` seconds, if sooner).

        When the wait ends first, the call is given up: the result is the
        error ``tool 'NAME' timed out after Ns``, the tool's cancel flag is
        set, and whatever it returns later is discarded.  Use :meth:`wait` to
        poll without giving up.
        """
        now = time.monotonic()
        limit = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        if not self._done.wait(min(max(0.0, limit - now), threading.TIMEOUT_MAX)):
            self._expire(max(time.monotonic(), limit))  # a wait may wake a hair early
        assert self._result is not None
        return self._result

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` seconds (never past the deadline) without giving up early; True when done.

        Unlike :meth:`result`, a ``timeout`` that ends before the deadline
        leaves the call running: use it to poll, e.g. to send heartbeats.
        """
        now = time.monotonic()
        limit = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        if self._done.wait(min(max(0.0, limit - now), threading.TIMEOUT_MAX)):
            return True
        return self.done()

    def done(self) -> bool:
        """True once the result is fixed (a passed deadline fixes it as a timeout)."""
        if self._done.is_set():
            return True
        if time.monotonic() >= self.deadline:
            self._expire(time.monotonic())
            return True
        return False

    def add_done_callback(self, fn: Callable[["ToolHandle"], None]) -> None:
        """Call ``fn(handle)`` once the result is fixed (at once if it already is).

        It runs in the thread that fixed the result: the worker when the tool
        returned, the waiting thread for a timeout or cancel.  Keep it short;
        an exception in it is logged, never raised.
        """
        with self._lock:
            if self._result is None:
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def running(self) -> bool:
        return self._state == _RUNNING and not self._done.is_set()

    def cancel(self) -> bool:
        """Cancel: a queued call never runs (True); a running one gets its cancel flag (False)."""
        self.cancel_event.set()
        executor = self._executor
        return executor._dequeue(self) if executor is not None else False

    def __repr__(self) -> str:
        return f"ToolHandle({self.call.name!r}, id={self.call.id!r}, state={self._state})"

    # -- internal, called by the executor

    def _cancel_callback(self) -> None:
        """:meth:`cancel` as a cancel callback, which returns nothing."""
        self.cancel()

    def _note_cancel(self) -> None:
        self.cancelled_at = time.monotonic()

    def _given_up(self, now: float, grace: float, flagged_before: Optional[float] = None) -> bool:
        """Past its deadline, or flagged ``grace`` seconds ago (before ``flagged_before``) and still running."""
        if self._abandoned or now >= self.deadline:
            return True
        flagged = self.cancelled_at
        return (flagged is not None and now >= flagged + grace
                and (flagged_before is None or flagged < flagged_before))

    def _settle(self, result: ToolResult) -> bool:
        with self._lock:
            if self._result is not None:
                return False
            self._result = result
            self._done.set()
            unlink, callbacks, self._callbacks = self._unlink, self._callbacks, []
        unlink()
        for fn in callbacks:
            self._run_callback(fn)
        return True

    def _run_callback(self, fn: Callable[["ToolHandle"], None]) -> None:
        try:
            fn(self)
        except Exception as exc:
            log = self._executor._log if self._executor is not None else _fallback_log()
            log.opt(exception=exc).warning("done callback of tool {!r} (call {}) failed: {}",
                                           self.call.name, self.call.id, exc)

    def _link(self, stop: Callable[[], None]) -> None:
        with self._lock:
            if self._result is None:
                self._unlink = stop
                return
        stop()

    def _claim(self) -> bool:
        """Queued -> running, unless settled, cancelled or past the deadline (caller holds the pool lock)."""
        now = time.monotonic()
        cancelled = self.cancel_event.is_set() or (self._external is not None and self._external.is_set())
        with self._lock:
            if self._result is not None or self._state != _QUEUED:
                return False
            if now < self.deadline and not cancelled:
                self._state = _RUNNING
                return True
            self._state = _DROPPED
        if cancelled:  # a plain Event's watcher may not have fired yet: never start a cancelled call
            self._settle(ToolResult.error_result(self.call, f"tool '{self.call.name}' cancelled before it started"))
        else:
            self._expire(now)  # waited in the queue past its deadline: it never runs
        return False

    def _expire(self, now: float) -> None:
        waited = now - self.submitted_at
        seconds = self.timeout if now >= self.deadline else waited
        name = self.tool.name if self.tool is not None else self.call.name
        started = self.started_at or 0.0
        result = ToolResult.error_result(
            self.call, f"tool '{name}' timed out after {_seconds(seconds)}s",
            duration_s=(now - started) if started else 0.0, started_at=started, ended_at=now, timed_out=True,
        )
        if self._settle(result):
            self._abandoned = self._state == _RUNNING
            self.cancel_event.set()
            if self._executor is not None:
                self._executor._log_timeout(self, seconds)

    def _complete(self, result: ToolResult) -> None:
        """The function returned: keep its result only if it came before the deadline."""
        if result.ended_at > self.deadline and not self._done.is_set():
            self._expire(result.ended_at)
        if not self._settle(result) and self._executor is not None:
            self._executor._log.info("tool {!r} (call {}) returned after it was given up; result discarded",
                                     self.call.name, self.call.id)


class _Worker:
    __slots__ = ("thread", "wakeup", "task", "current", "exit")

    def __init__(self, lock: threading.Lock) -> None:
        self.thread: Optional[threading.Thread] = None
        self.wakeup = threading.Condition(lock)
        self.task: Optional[ToolHandle] = None  # handed over, not yet claimed
        self.current: Optional[ToolHandle] = None  # running now
        self.exit = False


class ToolExecutor:
    """Runs tool calls on up to ``max_workers`` daemon threads, each with a deadline.

    Threads start lazily and exit after ``idle_exit_s`` without work.  A
    submit with an idle worker hands the call over with one condition
    notify.  Workers stuck in timed-out tools keep their slot until the
    function returns; when all are stuck, ``submit`` answers at once with an
    error result rather than queueing a call that could never start.

    A tool that was *cancelled* (its run was cancelled, e.g. the browser went
    away) but is still running ``cancel_grace_s`` seconds later is ignoring
    its flag: its slot counts as stuck from then on, not only from its
    deadline.  Otherwise a few abandoned runs whose tools hang would make
    every later call wait in the queue for up to its whole deadline.
    """

    _ids = itertools.count(1)

    #: Seconds a cancelled, still running tool gets to notice its flag before its slot counts as stuck.
    cancel_grace_s: float = 1.0

    def __init__(self, max_workers: int = 8, idle_exit_s: float = 5.0, logger: Any = None) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"max_workers must be a positive integer, got {max_workers!r}")
        if not isinstance(idle_exit_s, (int, float)) or not idle_exit_s > 0:
            raise ConfigError(f"idle_exit_s must be a positive number of seconds, got {idle_exit_s!r}")
        self.max_workers = max_workers
        self.idle_exit_s = float(idle_exit_s)
        self._log = component_logger("streamengine.tools.ToolExecutor", logger)
        self._lock = threading.Lock()
        self._queue: Deque[ToolHandle] = deque()
        self._idle: List[_Worker] = []  # LIFO: the warmest thread gets the work, the others can retire
        self._workers: Set[_Worker] = set()
        self._threads: List[threading.Thread] = []
        self._shutdown = False
        self._pool_id = next(self._ids)
        self._thread_ids = itertools.count(1)

    # -- public

    def submit(
        self,
        tool: Tool,
        call: ToolCall,
        timeout: Optional[float] = None,
        cancel: Optional[threading.Event] = None,
        *,
        on_start: Optional[Callable[[ToolHandle], None]] = None,
    ) -> ToolHandle:
        """Start ``call`` on ``tool``; never raises for the call's own faults.

        ``timeout`` is the deadline for tools that declare none (a tool's own
        ``timeout`` wins), counted from now.  Invalid arguments, a cancel
        already set, a shut-down or exhausted pool give an already-done handle
        with an error result; the function never runs.  ``on_start(handle)``
        runs on the worker just before the function is entered.
        """
        tool = Tool.from_function(tool)
        effective = _effective_timeout(tool, timeout)
        try:
            args = tool.validate(call.args())
        except ToolError as exc:
            return ToolHandle._settled(tool, call, ToolResult.error_result(call, str(exc)))
        if cancel is not None and cancel.is_set():
            return ToolHandle._settled(
                tool, call, ToolResult.error_result(call, f"tool '{tool.name}' cancelled before it started"))
        handle = ToolHandle(self, tool, call, args, effective, on_start)
        handle._external = cancel
        refusal, spawn = self._place(handle)
        if refusal is not None:
            handle._state = _DROPPED
            handle._settle(ToolResult.error_result(call, refusal))
            return handle
        if spawn is not None:
            self._start(spawn, handle)
        if cancel is not None:
            handle._link(on_cancel(cancel, handle._cancel_callback))
        return handle

    def shutdown(self, wait: bool = True, timeout: float = 5.0) -> None:
        """Refuse new calls, cancel queued ones, flag running ones, let idle threads go.

        With ``wait``, join the threads of running, not-stuck tools for up to
        ``timeout`` seconds in all; threads stuck in timed-out tools are never
        waited for (they are daemons and end when their function returns).
        """
        with self._lock:
            self._shutdown = True
            queued = list(self._queue) + [w.task for w in self._workers if w.task is not None]
            self._queue.clear()
            for handle in queued:
                handle._state = _DROPPED
            for worker in self._idle:
                worker.exit = True
                worker.wakeup.notify()
            self._idle.clear()
            running = [w.current for w in self._workers if w.current is not None]
            workers = list(self._workers)
        for handle in queued:
            handle._settle(ToolResult.error_result(
                handle.call, f"tool '{handle.call.name}' cancelled: the tool executor shut down before it started"))
        began = time.monotonic()
        for handle in running:
            handle.cancel_event.set()
        if wait:
            self._join(workers, began + max(0.0, timeout), began)

    def threads_alive(self) -> int:
        """Worker threads still alive (stuck ones included); for tests and health checks."""
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            return len(self._threads)

    def stuck_workers(self) -> int:
        """Workers running a tool whose deadline has passed, or that ignores its cancel flag."""
        with self._lock:
            return len(self._stuck(time.monotonic()))

    def __enter__(self) -> "ToolExecutor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown(wait=True)

    # -- placement

    def _place(self, handle: ToolHandle) -> Tuple[Optional[str], Optional[_Worker]]:
        """Hand to an idle worker, or reserve a new one, or queue; else say why not."""
        expired: List[ToolHandle] = []
        try:
            with self._lock:
                if self._shutdown:
                    return (f"tool '{handle.call.name}' not started: the tool executor is shut down; "
                            "create a new one"), None
                if self._idle:
                    worker = self._idle.pop()
                    worker.task = handle
                    worker.wakeup.notify()
                    return None, None
                if len(self._workers) < self.max_workers:
                    worker = _Worker(self._lock)
                    worker.task = handle
                    self._workers.add(worker)
                    return None, worker
                now = time.monotonic()
                stuck = self._stuck(now)
                # Only those past their deadline get a timeout result now; a
                # cancelled one keeps waiting for its function (or deadline).
                expired = [h for h in stuck if now >= h.deadline]
                if len(stuck) >= self.max_workers:
                    return (f"tool pool exhausted: all {self.max_workers} workers are stuck in tools that "
                            "timed out or ignored a cancel; try again later"), None
                self._queue.append(handle)
                return None, None
        finally:
            for late in expired:  # fix their results and raise their flags outside the lock
                late._expire(time.monotonic())
                late.cancel_event.set()

    def _stuck(self, now: float) -> List[ToolHandle]:
        grace = self.cancel_grace_s
        return [w.current for w in self._workers
                if w.current is not None and w.current._given_up(now, grace)]

    def _start(self, worker: _Worker, first: ToolHandle) -> None:
        thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                  name=f"streamengine-tool-{self._pool_id}-{next(self._thread_ids)}")
        worker.thread = thread
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": the host is out of threads
            with self._lock:
                self._workers.discard(worker)
            first._state = _DROPPED
            first._settle(ToolResult.error_result(first.call, f"tool '{first.call.name}' not started: could not "
                                                  f"start a worker thread ({exc}); try again later"))
            return
        with self._lock:
            # Pruned here, not only in threads_alive(): idle threads retire and new
            # ones start all day in a server, and a list of every thread ever
            # started is a slow leak.
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    def _dequeue(self, handle: ToolHandle) -> bool:
        with self._lock:
            if handle._state != _QUEUED or handle._done.is_set():
                return False
            handle._state = _DROPPED
            try:
                self._queue.remove(handle)
            except ValueError:
                pass  # handed to a worker that has not claimed it: the claim will fail
        return handle._settle(ToolResult.error_result(handle.call, f"tool '{handle.call.name}' cancelled before it "
                                                      "started"))

    # -- worker side

    def _work(self, worker: _Worker) -> None:
        try:
            with self._lock:
                task = self._claim(worker, worker.task)
            while True:
                if task is not None:
                    self._run(task)
                task = self._next(worker)
                if worker.exit:
                    return
        finally:
            with self._lock:
                self._workers.discard(worker)
                if worker in self._idle:
                    self._idle.remove(worker)

    def _claim(self, worker: _Worker, task: Optional[ToolHandle]) -> Optional[ToolHandle]:
        worker.task = None
        if task is not None and task._claim():
            worker.current = task
            return task
        return None

    def _next(self, worker: _Worker) -> Optional[ToolHandle]:
        """Finish the bookkeeping of the last task and wait for the next (None: idle round or exit)."""
        with self._lock:
            if worker.current is not None:
                worker.current._state = _FINISHED
                worker.current = None
            while self._queue:
                task = self._claim(worker, self._queue.popleft())
                if task is not None:
                    return task
            if self._shutdown:
                worker.exit = True
                return None
            self._idle.append(worker)
            retire_at = time.monotonic() + self.idle_exit_s
            while worker.task is None and not worker.exit:
                left = retire_at - time.monotonic()
                if left <= 0:
                    self._idle.remove(worker)
                    worker.exit = True
                    return None
                worker.wakeup.wait(left)
            return self._claim(worker, worker.task)

    def _run(self, handle: ToolHandle) -> None:
        tool = handle.tool
        assert tool is not None
        context = ToolContext(handle.cancel_event, handle.deadline)
        handle.started_at = started = time.monotonic()
        if handle._on_start is not None:
            self._safely_call(handle._on_start, handle)
        try:
            text = tool._invoke(handle._args, context)
        except BaseException as exc:  # a worker must outlive any tool; SystemExit included
            ended = time.monotonic()
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._log.opt(exception=exc).warning("tool {!r} (call {}) raised {}", tool.name, handle.call.id, message)
            result = ToolResult.error_result(handle.call, f"tool '{tool.name}' failed: {message}",
                                             duration_s=ended - started, started_at=started, ended_at=ended)
        else:
            ended = time.monotonic()
            result = ToolResult(handle.call.id, handle.call.name, True, text, None, ended - started, started, ended)
        handle._complete(result)

    def _safely_call(self, hook: Callable[[ToolHandle], None], handle: ToolHandle) -> None:
        try:
            hook(handle)
        except Exception as exc:
            self._log.opt(exception=exc).warning("on_start hook of tool {!r} failed: {}", handle.call.name, exc)

    def _join(self, workers: List[_Worker], until: float, began: float) -> None:
        """Join each worker until ``until``, but stop waiting for one the moment its tool is stuck.

        A tool flagged by this shutdown gets the whole ``until``; one that was
        cancelled before it and ignored that for ``cancel_grace_s`` is stuck.
        """
        me = threading.current_thread()
        grace = self.cancel_grace_s
        for worker in workers:
            thread = worker.thread
            if thread is None or thread is me:
                continue
            while thread.is_alive():
                now, current = time.monotonic(), worker.current
                if now >= until or (current is not None and current._given_up(now, grace, began)):
                    break
                stop = until
                if current is not None:
                    stop = min(stop, current.deadline)
                    flagged = current.cancelled_at
                    if flagged is not None and flagged < began:
                        stop = min(stop, flagged + grace)
                thread.join(max(0.0, stop - now))

    def _log_timeout(self, handle: ToolHandle, seconds: float) -> None:
        where = "while running; its thread is abandoned with its cancel flag set" if handle._abandoned \
            else "before it started"
        self._log.warning("tool {!r} (call {}) timed out after {}s {}", handle.call.name, handle.call.id,
                          _seconds(seconds), where)
