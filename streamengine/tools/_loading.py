"""Tools named on a command line or in a scenario file: ``module:attr`` or ``file.py:attr``.

Shared by the CLI's ``--tools`` and the scenario runner, so both accept the
same spellings and fail with the same one-line messages.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, List

from .._errors import ConfigError, ToolError
from .._validation import one_line as _one_line
from .._validation import short_repr as _short
from ._tool import Tool, ToolRegistry

_FORMS = "expected 'module:attribute' (e.g. 'myapp.tools:TOOLS') or 'path/to/file.py:attribute' (e.g. 'tools.py:TOOLS')"


def import_object(spec: str, what: str = "--tools") -> Any:
    """``"package.module:attr.sub"`` or ``"path/to/file.py:attr"`` -> the object; one-line :class:`ConfigError` otherwise.

    The current directory is put on ``sys.path`` (as gunicorn and uvicorn do),
    so ``--tools mytools:TOOLS`` finds ``./mytools.py`` from the console script.
    A ``.py`` path is imported from that file, with its directory on
    ``sys.path`` so that its own imports of neighbouring modules work.
    """
    source, sep, attr = str(spec).rpartition(":")  # rpartition: a Windows path has a ':' of its own
    if not sep or not source.strip() or not attr.strip() or not _is_dotted(attr):
        raise ConfigError(f"{what} {spec!r}: {_FORMS}")
    if source.endswith(".py") or "/" in source or os.sep in source:
        obj, label = _import_file(spec, source, what), source
    elif _is_dotted(source):
        obj, label = _import_module(spec, source, what), source
    else:
        raise ConfigError(f"{what} {spec!r}: {source!r} is neither a module name nor a .py file; {_FORMS}")
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{what} {spec!r}: {label!r} has no attribute {attr!r}") from exc
    return obj


def _is_dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _import_module(spec: str, module_name: str, what: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # anything the module raises while importing
        raise ConfigError(f"{what} {spec!r}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {_one_line(str(exc))}") from exc


def _import_file(spec: str, source: str, what: str) -> Any:
    path = os.path.abspath(source)
    if not source.endswith(".py"):
        raise ConfigError(f"{what} {spec!r}: {source!r} looks like a path but does not end in .py; {_FORMS}")
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {spec!r}: no such file {path!r}")
    stem = os.path.splitext(os.path.basename(path))[0]
    existing = sys.modules.get(stem)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
        return existing  # loaded before (by path or as a module): one module object, not two
    # Under its own name when that is free, so classes in it pickle by reference like any module's.
    name = stem if stem.isidentifier() and existing is None else f"_streamengine_file_{abs(hash(path)):x}"
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{what} {spec!r}: cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # anything the file raises while running
        sys.modules.pop(name, None)
        raise ConfigError(f"{what} {spec!r}: cannot import {path!r}: "
                          f"{type(exc).__name__}: {_one_line(str(exc))}") from exc
    return module


def load_tools(spec: str, what: str = "--tools") -> List[Tool]:
    """The tools named by ``module:attr`` or ``file.py:attr``: a Tool, a plain function, or a list/tuple/registry of them."""
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
