"""A tool's signature as a pydantic model: the JSON schema the model reads, and its validator.

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
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from .._errors import ToolError
from .._tool_context import ToolContext
from ._arguments import problems_from_errors
from ._jsonschema import tidy

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
            model = create_model(f"{name}_arguments", __config__=config, **self._fields)  # type: ignore[call-overload]
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

