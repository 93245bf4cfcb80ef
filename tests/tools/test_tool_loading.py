"""``--tools`` specs: ``module:attr`` and ``path/to/file.py:attr``, with one-line errors.

Each spec goes through the installed ``streamengine`` command in-process (``cli_support.main``); a tool
that loads is called by the model over FakeProvider, so "loaded" means the model's call ran it.
That a failed import keeps its cause chained is checked on the loader itself in
tests/cli/test_cli_internals.py.
"""
from __future__ import annotations

import json
import re
import sys
import uuid

import pytest
from cli_support import clean_env, run  # noqa: F401  (fixture)

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: Nothing listens here: a spec that fails to load ends the command before any request.
NOWHERE = "http://127.0.0.1:9/v1"


@pytest.fixture
def tool_file(tmp_path):
    """A tools file importing a helper module that sits next to it (as a script would)."""
    stem = f"mytools_{uuid.uuid4().hex[:8]}"
    helper = f"helper_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / f"{helper}.py").write_text("PREFIX = 'hello '\n")
    (folder / f"{stem}.py").write_text(
        "import dataclasses\n"
        f"from {helper} import PREFIX\n"
        "from streamengine.tools import tool\n"
        "@dataclasses.dataclass\nclass Greeting:\n    text: str\n"
        "@tool\ndef greet(name: str) -> Greeting:\n    '''Greet.'''\n    return Greeting(PREFIX + name)\n"
        "TOOLS = [greet]\n"
    )
    yield folder / f"{stem}.py", stem
    for name in (stem, helper):
        sys.modules.pop(name, None)
    while str(folder) in sys.path:
        sys.path.remove(str(folder))


def greet_ann(capsys, spec):
    """A chat whose model calls ``greet(name="ann")`` from ``--tools spec``; returns what the model was told."""
    with FakeProvider() as fp:
        fp.add_turn(s.text('<tool name="greet">{"name": "ann"}</tool>'))
        fp.add_turn(s.text("done"))
        rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--no-log", "--tools", spec)
        assert rc == 0, err
        assert out == "done\n"
        return fp.requests[1].json["messages"][-1]["content"]


def refusal(capsys, spec):
    """The one error line a spec that cannot load gives (exit status 2), without its ``streamengine: error: ``."""
    rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", NOWHERE, "--no-log", "--tools", spec)
    assert rc == 2 and out == "", err
    assert err.startswith("streamengine: error: ") and err.count("\n") == 1, err
    return err[len("streamengine: error: "):].rstrip("\n")


def test_a_file_path_spec_imports_the_file(capsys, tool_file):
    path, stem = tool_file
    assert json.dumps({"text": "hello ann"}) in greet_ann(capsys, f"{path}:TOOLS")
    module = sys.modules[stem]
    assert module.__file__ == str(path)  # importable under its own name: classes pickle
    assert json.dumps({"text": "hello ann"}) in greet_ann(capsys, f"{path}:greet")
    assert sys.modules[stem] is module  # loaded once


def test_a_relative_file_path_works(capsys, tool_file, monkeypatch):
    path, _ = tool_file
    monkeypatch.chdir(path.parent.parent)
    assert "hello ann" in greet_ann(capsys, f"deep/{path.name}:TOOLS")


@pytest.mark.parametrize("spec, pattern", [
    ("justamodule", r"^--tools 'justamodule': expected 'module:attribute' \(e\.g\. 'myapp\.tools:TOOLS'\) or "
                    r"'path/to/file\.py:attribute'"),
    ("mod:", r"expected 'module:attribute'"),
    (":TOOLS", r"expected 'module:attribute'"),
    ("mod:not an attr", r"expected 'module:attribute'"),
    ("my-module:TOOLS", r"'my-module' is neither a module name nor a \.py file; expected"),
    ("some/dir:TOOLS", r"'some/dir' looks like a path but does not end in \.py; expected"),
    ("missing_dir/none.py:TOOLS", r"no such file '.*none\.py'"),
])
def test_malformed_specs_say_which_form_to_use(capsys, spec, pattern):
    assert re.search(pattern, refusal(capsys, spec))


def test_a_file_that_fails_to_import_is_named(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader adds the file's folder
    bad = tmp_path / f"broken_{uuid.uuid4().hex[:8]}.py"
    bad.write_text("raise RuntimeError('no\\nway')\n")
    assert re.search(r"cannot import '.*broken_.*\.py': RuntimeError: no way$", refusal(capsys, f"{bad}:TOOLS"))
    assert bad.stem not in sys.modules
    good = tmp_path / f"good_{uuid.uuid4().hex[:8]}.py"
    good.write_text("X = 1\n")
    try:
        assert "has no attribute 'NOPE'" in refusal(capsys, f"{good}:NOPE")
    finally:
        sys.modules.pop(good.stem, None)


def test_with_v_a_file_that_fails_to_import_shows_the_chain_underneath(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    bad = tmp_path / f"broken_{uuid.uuid4().hex[:8]}.py"
    bad.write_text("import json\njson.loads('{oops')\n")
    rc, out, err = run(capsys, "chat", "hi", "-v", "-m", "m", "--base-url", NOWHERE, "--no-log", "--tools",
                       f"{bad}:TOOLS")
    assert rc == 2 and out == "", err
    first, *rest = err.splitlines()
    assert first.startswith("streamengine: error: --tools") and "cannot import" in first and "JSONDecodeError" in first
    assert any(line.strip().startswith("caused by JSONDecodeError: Expecting property name") for line in rest), err


def test_a_bare_file_offers_every_tool_it_defines_and_none_it_imports(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    stem, empty_stem = f"bare_{uuid.uuid4().hex[:8]}", f"empty_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{stem}.py"
    path.write_text(
        "from streamengine.tools import tool\n"
        "from streamengine.testing import FakeProvider  # imported, not a tool\n"
        "@tool\ndef greet(name: str) -> str:\n    '''Greet.'''\n    return 'hi ' + name\n"
        "@tool\ndef part(name: str) -> str:\n    '''Say goodbye.'''\n    return 'bye ' + name\n"
        "def helper() -> str:\n    return 'not a tool'\n"
    )
    try:
        with FakeProvider() as fp:
            fp.add_turn(s.text('<tool name="greet">{"name": "ann"}</tool><tool name="part">{"name": "bo"}</tool>'))
            fp.add_turn(s.text("done"))
            rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--no-log",
                             "--tools", str(path))
            assert rc == 0, err
            told = fp.requests[1].json["messages"][-1]["content"]
            offered = fp.requests[0].json["messages"][0]["content"]
        assert "hi ann" in told and "bye bo" in told
        assert "greet" in offered and "part" in offered and "helper" not in offered
        empty = tmp_path / f"{empty_stem}.py"
        empty.write_text("X = 1\n")
        assert "defines no @tool" in refusal(capsys, str(empty))
    finally:
        for name in (stem, empty_stem):
            sys.modules.pop(name, None)
