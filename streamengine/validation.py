"""Checks for the numbers and names a user passes in: one rule, one message, everywhere.

Settings arrive from code, environment variables and JSON; a wrong one
should fail at construction with a message that names the setting and the
fix, not later as an ``OverflowError`` deep inside ``threading`` (which is
what ``Event.wait(float("inf"))`` raises) or as a silent surprise (``True``
is an ``int`` in Python, so ``timeout=True`` would mean one second).

So every check here refuses ``bool``, ``nan``, ``inf`` and negative values
and raises :class:`ConfigError` worded the same way::

    from streamengine.validation import seconds, count, name
    seconds(value, "heartbeat_s", allow_none=True)   # -> Optional[float]
    count(value, "max_retries")                      # -> int >= 0
    name(value, "model")                             # -> non-empty str
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, overload

from .errors import ConfigError

__all__ = ["count", "name", "seconds"]


@overload
def seconds(value: Any, what: str, *, allow_none: Literal[False] = ..., allow_zero: bool = ...) -> float: ...


@overload
def seconds(value: Any, what: str, *, allow_none: bool, allow_zero: bool = ...) -> Optional[float]: ...


def seconds(value: Any, what: str, *, allow_none: bool = False, allow_zero: bool = False) -> Optional[float]:
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


def count(value: Any, what: str, *, minimum: int = 0) -> int:
    """``value`` as an integer ``>= minimum`` (``bool`` and floats such as ``2.0`` refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def name(value: Any, what: str) -> str:
    """``value`` as a non-empty string with something besides whitespace in it."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return value
