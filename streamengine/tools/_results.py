"""What a tool returned, as the text the model reads.

A value with an obvious JSON form becomes JSON; anything else is refused
with :class:`ToolReturnError` instead of being ``str()``-ed: ``repr`` of an
arbitrary object (``<Thing object at 0x7f...>``) or of a set is text the
model cannot use, and an ``ok`` result carrying it hides the bug from the
tool's author.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import sys
from typing import Any

from .._errors import ToolError

_WHAT_TO_RETURN = "return str, a JSON value (dict/list/number/bool/None), a dataclass or a pydantic model"


class ToolFailure(ToolError):
    """A tool's failure already worded for the model (an MCP server's error): the result is its message as is."""


class ToolReturnError(ToolFailure):
    """A tool returned a value that has no JSON form; the message says what to return instead."""


class _NoJsonForm(TypeError):
    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__name__)
        self.value = value


def result_to_text(value: Any, tool_name: str = "?") -> str:
    """str as is, None as "", UTF-8 bytes decoded; JSON values, dataclasses and pydantic models as JSON.

    Inside those, ``datetime``/``date``/``time`` become ISO strings and
    ``Enum`` members their values (what ``model_dump(mode="json")`` does too).
    Raises :class:`ToolReturnError` naming the offending type otherwise.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolReturnError(f"tool '{tool_name}' returned bytes that are not UTF-8 text ({exc.reason} at "
                                  f"byte {exc.start}); decode them, or {_WHAT_TO_RETURN}") from exc
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_form)
    except _NoJsonForm as exc:
        inside = "" if exc.value is value else f"{_a(type(value).__name__)} containing "
        raise ToolReturnError(f"tool '{tool_name}' returned {inside}{_a(type(exc.value).__name__)}; "
                              f"{_WHAT_TO_RETURN}") from exc
    except (TypeError, ValueError) as exc:  # NaN/inf, cycles, dict keys that are not str/int/float/bool
        raise ToolReturnError(f"tool '{tool_name}' returned {_a(type(value).__name__)} that is not valid "
                              f"JSON ({exc}); {_WHAT_TO_RETURN}") from exc


def _json_form(value: Any) -> Any:
    """``json.dumps``'s ``default``: the JSON form of the few non-JSON types with an obvious one."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    pydantic = sys.modules.get("pydantic")  # a pydantic model implies pydantic is imported
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    raise _NoJsonForm(value)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
