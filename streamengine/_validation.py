"""Checks for the numbers and names a user passes in: one rule, one message, everywhere.

Settings arrive from code, environment variables and JSON; a wrong one
should fail at construction with a message that names the setting and the
fix, not later as an ``OverflowError`` deep inside ``threading`` (which is
what ``Event.wait(float("inf"))`` raises) or as a silent surprise (``True``
is an ``int`` in Python, so ``timeout=True`` would mean one second).

So every check here refuses ``bool``, ``nan``, ``inf`` and negative values
and raises :class:`ConfigError` worded the same way::

    from streamengine._validation import seconds, count, name
    seconds(value, "heartbeat_s", allow_none=True)   # -> Optional[float]
    count(value, "max_retries")                      # -> int >= 0
    name(value, "model")                             # -> non-empty str

It also holds the short renderings of values that those messages (and a
scenario report, a tool-argument error) use, so a value is described the
same way wherever it is refused: ``one_line``, ``short_repr``, ``json_type``.
"""
from __future__ import annotations

import math
from typing import Literal, Optional, overload

from ._errors import ConfigError


@overload
def seconds(value: object, what: str, *, allow_none: Literal[False] = ..., allow_zero: bool = ...) -> float: ...


@overload
def seconds(value: object, what: str, *, allow_none: bool, allow_zero: bool = ...) -> Optional[float]: ...


def seconds(value: object, what: str, *, allow_none: bool = False, allow_zero: bool = False) -> Optional[float]:
    """``value`` as a finite number of seconds (> 0, or >= 0 with ``allow_zero``).

    ``what`` names the setting in the message (e.g. ``"EngineConfig.tool_timeout"``).
    ``None`` passes through only with ``allow_none`` (meaning "no limit" or
    "not set", as the caller documents).
    """
    if value is None and allow_none:
        return None
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds {bound}, got {value!r} "
                          f"({type(value).__name__}); e.g. {what}=30")
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of seconds {bound}, got {value!r}; "
                          f"for a long limit write a large number (e.g. 3600)")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{what} must be a number of seconds {bound}, got {value!r}")
    return float(value)


def count(value: object, what: str, *, minimum: int = 0) -> int:
    """``value`` as an integer ``>= minimum`` (``bool`` and floats such as ``2.0`` refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def name(value: object, what: str) -> str:
    """``value`` as a non-empty string with something besides whitespace in it."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return value


# --------------------------------------------------------------- describing values

def one_line(text: object) -> str:
    """Whitespace (newlines included) folded to single spaces: error lines stay one line."""
    return " ".join(str(text).split())


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with ``...``."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def json_type(value: object) -> str:
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
