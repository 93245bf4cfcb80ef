"""What the CLI test modules share: the command in-process, a clean environment, an importable tools module.

``main(argv, stop=None, ready=None) -> int`` is the installed ``streamengine``
command's own function, found by its public name (the console-script entry
point), so the tests run exactly what a user's shell runs.  Import the
fixtures into a test module (``from cli_support import clean_env,
tools_module``); ``clean_env`` is autouse there.  ``tools_module`` writes the
module's own ``TOOLS_SOURCE``.
"""
from __future__ import annotations

import io
import sys
import uuid
from importlib.metadata import entry_points
from typing import Callable

import pytest


def installed_command(name: str = "streamengine") -> Callable[..., int]:
    """The function behind the console script ``name``, as the installed command's wrapper loads it."""
    found = entry_points()
    if hasattr(found, "select"):
        scripts = list(found.select(group="console_scripts", name=name))
    else:  # Python 3.9: a dict of groups
        scripts = [entry for entry in found.get("console_scripts", ()) if entry.name == name]
    assert scripts, f"no '{name}' console script: install the package (pip install -e '.[test]'; scripts/test does)"
    return scripts[0].load()


main = installed_command()

#: Every variable the CLI reads: a developer's own settings must not leak into a test.
CLI_ENV = ("STREAMENGINE_BASE_URL", "STREAMENGINE_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL",
           "STREAMENGINE_MODEL", "STREAMENGINE_TIMEOUT", "STREAMENGINE_IDLE_TIMEOUT",
           "STREAMENGINE_CONNECT_TIMEOUT", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "NO_COLOR")


#: A tools module with one tool, ``lookup(city)``: ``TOOLS_SOURCE = LOOKUP_TOOLS_SOURCE``.
LOOKUP_TOOLS_SOURCE = '''
from streamengine.tools import tool

@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return "sunny in " + city
'''


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # an empty pipe, not a terminal


@pytest.fixture
def tools_module(request, tmp_path, monkeypatch):
    """An importable module holding the test module's ``TOOLS_SOURCE``; returns its (unique) name."""
    name = f"se_cli_tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(request.module.TOOLS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def run(capsys, *argv):
    """``main(argv)`` in-process: ``(exit status, stdout, stderr)``."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def user_messages(request):
    """The user messages' texts of a recorded request."""
    return [m["content"] for m in request.json["messages"] if m["role"] == "user"]
