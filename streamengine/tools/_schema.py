"""A tool's signature as a pydantic model: the JSON schema the model reads, the validator, and its error sentences.

Parameter descriptions from a tool's docstring (Google ``Args:`` or Sphinx ``:param x:``).

The docstring is where Python authors already describe parameters; reading
it means the model gets those descriptions without a second copy in code.

pydantic's JSON schema, trimmed to what a model needs and OpenAI strict mode accepts.

pydantic emits ``title`` on every node, ``$ref`` into ``$defs`` for every
enum, dataclass and model, and ``anyOf [X, null]`` for ``Optional[X]``.  A
model reads the schema as prompt text, so titles are noise and references
make it look things up; here non-recursive references are inlined (recursive
ones stay as ``$ref`` into a top-level ``$defs``, which strict mode accepts),
titles go, ``Optional`` becomes ``"type": [X, "null"]``, and every object with
declared properties says ``additionalProperties: false``.

pydantic's validation errors as the one-line sentences the model reads.

A model fixes its call from the error text alone, so each problem names the
argument path (``flags[1]``, ``point.x``, ``scores['b']``), what the schema
wants in the words of the schema it was sent, and what it actually sent.

A tool's signature as a pydantic model: the JSON schema the model reads, and its validator.

What the model is told and what is checked come from one place, the
function's signature, so the two can never drift apart.  Any type pydantic
can validate from JSON and describe as JSON schema is accepted (Enum,
Literal, dataclasses, TypedDict, datetime/date, pydantic models,
``Annotated[..., Field(...)]``).  pydantic is imported when the first tool is
built, so ``import streamengine`` stays cheap for code that defines none.

Arguments are validated in pydantic's *strict* JSON mode, as the model's
JSON: ``"3"`` is not an integer and ``true`` is not a number (a model that
sends them misread the schema and is told so), while strings still become
``datetime``/``Enum`` values and objects become dataclasses and models.  An
integral float (``2.0``) counts as the integer it equals.
"""
from __future__ import annotations

import inspect
import json
import math
import re
import types
import typing
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .._errors import ToolError
from .._messages import ToolContext
from .._validation import json_type

_SECTION_RE = re.compile(r"^(\s*)(?:Args|Arguments|Parameters|Params)\s*:\s*$")
_ENTRY_RE = re.compile(r"^(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: Optional[str]) -> Tuple[str, Dict[str, str]]:
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


_SCHEMA_MAPS = ("properties", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames")
_NULL = {"type": "null"}


def tidy(schema: Mapping[str, Any]) -> Dict[str, Any]:
    """The schema with references inlined where possible, titles dropped, nullables compact."""
    defs = dict(schema.get("$defs", {}))
    kept: Set[str] = set()
    body = {k: v for k, v in schema.items() if k != "$defs"}
    out: Dict[str, Any] = _clean(_inline(body, defs, (), kept))
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
        kept: Mapping[str, Any] = options[0] if options[1] == {"type": "null"} else options[1]
        return kept
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


_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NONE_TYPE = type(None)
_UNION_TYPE = getattr(types, "UnionType", None)  # ``int | None`` on Python 3.10+
_SUPPORTED_TYPES = (
    "str, int, float, bool, list / List[X], dict / Dict[str, X], Optional[X], Union[...], Literal[...], "
    "Enum, datetime / date / time, a dataclass, a TypedDict, a pydantic model or Any"
)
_SIMPLE_TYPES = (str, bool, int, float)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else repr(hint)


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


def _annotation_notes(hint: Any) -> Tuple[Any, Optional[str], bool]:
    """``Annotated[int, "how many"]`` -> (hint, "how many", has a Field with a description)."""
    if typing.get_origin(hint) is not typing.Annotated:
        return hint, None, False
    _, *extras = typing.get_args(hint)
    notes = [e for e in extras if isinstance(e, str)]
    described = any(getattr(e, "description", None) for e in extras if not isinstance(e, str))
    return hint, (notes[0] if notes else None), described


def _integral(value: Any) -> Any:
    """``2.0`` -> ``2`` throughout: JSON has one number type, pydantic's strict int wants no float."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


class _Signature:
    """What ``Tool`` learns from a function: schema, validator, required names, context parameter."""

    def __init__(self, fn: Callable[..., Any], name: str, param_docs: Dict[str, str]) -> None:
        label = f"tool {name!r}"
        hints = _resolve_hints(fn, label)
        self.required: List[str] = []
        self.optional: Set[str] = set()
        self.context_param: Optional[str] = None
        self._fields: Dict[str, Tuple[Any, Any]] = {}  # model field name -> (hint, FieldInfo)
        self._names: Dict[str, str] = {}  # model field name -> parameter name
        params = list(inspect.signature(fn).parameters.values())
        if params and params[0].name in ("self", "cls"):
            raise ToolError(
                f"{label}: the first parameter is {params[0].name!r}; decorate a plain function, or wrap "
                "a bound method with Tool.from_function(obj.method)"
            )
        for param in params:
            self._add(param, hints, label, param_docs)
        self._model, raw_schema = self._build_model(name, label)
        self.schema = tidy(raw_schema)
        self.schema.setdefault("properties", {})
        self.schema["additionalProperties"] = False
        if self.required:
            self.schema["required"] = list(self.required)

    def _add(self, param: inspect.Parameter, hints: Dict[str, Any], label: str, docs: Dict[str, str]) -> None:
        from pydantic import Field

        where = f"parameter {param.name!r} of {label}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ToolError(f"{where}: {star}{param.name} cannot be described to the model; declare each "
                            "argument as a named parameter")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolError(f"{where} is positional-only; tools are called with keyword arguments, "
                            "remove the '/' from the signature")
        hint, note, described = _annotation_notes(hints.get(param.name, inspect.Parameter.empty))
        if _is_context_hint(hint):
            if self.context_param is not None:
                raise ToolError(f"{label} declares two ToolContext parameters ({self.context_param!r} and "
                                f"{param.name!r}); keep one")
            self.context_param = param.name
            return
        if hint is inspect.Parameter.empty:
            default = param.default
            # ``limit=5`` says "integer" even without a hint
            inferred = type(default) if default is not param.empty and default is not None else None
            hint = inferred if any(inferred is t for t in _SIMPLE_TYPES) else Any
        options: Dict[str, Any] = {"alias": param.name}
        description = note or docs.get(param.name)
        if description and not described:
            options["description"] = description
        if param.default is inspect.Parameter.empty:
            self.required.append(param.name)
        else:
            self.optional.add(param.name)
            options["default"] = param.default
        field_name = f"p{len(self._fields)}"  # any parameter name works, even 'model_config' or '_x'
        self._fields[field_name] = (hint, Field(**options))
        self._names[field_name] = param.name

    def _build_model(self, name: str, label: str) -> Tuple[Any, Dict[str, Any]]:
        from pydantic import ConfigDict, create_model

        config = ConfigDict(extra="forbid", allow_inf_nan=False)
        try:
            # Any values: mypy reads a **dict as possibly holding create_model's own keywords (__base__ ...).
            fields: Dict[str, Any] = self._fields
            model = create_model(f"{name}_arguments", __config__=config, **fields)
            with warnings.catch_warnings():  # a default that is not JSON is left out of the schema, on purpose
                warnings.simplefilter("ignore")
                return model, model.model_json_schema(by_alias=True)
        except Exception as exc:  # PydanticSchemaGenerationError, PydanticUserError, TypeError
            raise self._unsupported(exc, label) from exc

    def _unsupported(self, exc: Exception, label: str) -> ToolError:
        """Name the parameter whose type pydantic cannot handle, and say what works."""
        from pydantic import TypeAdapter

        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for field_name, (hint, _) in self._fields.items():
            try:
                TypeAdapter(hint).json_schema()
            except Exception:  # the culprit
                where = f"parameter {self._names[field_name]!r} of {label}"
                return ToolError(f"{where} has type {_type_name(hint)}, which cannot be described to the model "
                                 f"as JSON ({reason}); use {_SUPPORTED_TYPES}")
        return ToolError(f"{label}: its parameters cannot be described as JSON ({reason}); use {_SUPPORTED_TYPES}")

    def check(self, args: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
        """The validated keyword arguments and a list of problems (empty when valid).

        A null for an argument that has a default means "use the default"
        (models often send it for options they do not want to set).
        """
        from pydantic import ValidationError

        properties = self.schema["properties"]
        problems = _unknown(args, properties)
        known = {k: v for k, v in args.items() if k in properties and not (v is None and k in self.optional)}
        try:
            try:
                data = json.dumps(_integral(known), ensure_ascii=False)
            except (TypeError, ValueError):  # Python objects from a Python caller: pydantic's lax mode
                model = self._model.model_validate(known)
            else:
                model = self._model.model_validate_json(data, strict=True)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False)
            return {}, problems + problems_from_errors(errors, self.schema, known)
        if problems:
            return {}, problems
        return {self._names[f]: getattr(model, f) for f in model.model_fields_set}, []


class _GivenSchema:
    """A schema that comes ready-made (an MCP server's ``inputSchema``): sent as is, checked by its owner.

    The server validates its own arguments and its error reaches the model as
    the tool's result, so the only check here is the one every call needs:
    the arguments are a JSON object.
    """

    context_param: Optional[str] = None

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema: Dict[str, Any] = json.loads(json.dumps(schema))

    def check(self, args: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
        return dict(args), []


def _unknown(args: Mapping[str, Any], properties: Mapping[str, Any]) -> List[str]:
    unknown = [key for key in args if key not in properties]
    if not unknown:
        return []
    allowed = ", ".join(repr(p) for p in properties) or "none (this tool takes no arguments)"
    noun = "argument" if len(unknown) == 1 else "arguments"
    return [f"unknown {noun} {', '.join(repr(str(k)) for k in unknown)}; allowed arguments: {allowed}"]
