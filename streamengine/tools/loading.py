"""Tools named on a command line or in a scenario file: ``module:attr``.

Shared by the CLI's ``--tools`` and the scenario runner, so both accept the
same spellings and fail with the same one-line messages.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, List

from ..errors import ConfigError, ToolError
from ..text import one_line as _one_line, short_repr as _short
from .tool import Tool, ToolRegistry

__all__ = ["import_object", "load_tools"]


def import_object(spec: str, what: str = "--tools") -> Any:
    """``"package.module:attr.sub"`` -> the object; one-line :class:`ConfigError` otherwise.

    The current directory is put on ``sys.path`` (as gunicorn and uvicorn do),
    so ``--tools mytools:TOOLS`` finds ``./mytools.py`` from the console script.
    """
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ConfigError(f"{what} {spec!r}: expected 'module:attribute', e.g. 'myapp.tools:TOOLS'")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # anything the module raises while importing
        raise ConfigError(f"{what} {spec!r}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {_one_line(str(exc))}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}") from exc
    return obj


def load_tools(spec: str, what: str = "--tools") -> List[Tool]:
    """The tools named by ``module:attr``: a Tool, a plain function, or a list/tuple/registry of them."""
    obj = import_object(spec, what)
    items = list(obj) if isinstance(obj, (list, tuple, ToolRegistry)) else [obj]
    tools = []
    for item in items:
        if not callable(item):
            raise ConfigError(f"{what} {spec!r}: {type(item).__name__} {_short(item)} is not a tool or a function; "
                              "point at a @tool function or a list of them")
        try:
            tools.append(Tool.from_function(item))
        except ToolError as exc:
            raise ConfigError(f"{what} {spec!r}: {_one_line(str(exc))}") from exc
    return tools
