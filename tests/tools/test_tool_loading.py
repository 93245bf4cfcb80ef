"""``--tools`` specs: ``module:attr`` and ``path/to/file.py:attr``, with one-line errors."""
from __future__ import annotations

import sys
import uuid

import pytest

from streamengine import ConfigError
from streamengine.tools import Tool
from streamengine.tools._tool import import_object, load_tools


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


def test_a_file_path_spec_imports_the_file(tool_file):
    path, stem = tool_file
    tools = load_tools(f"{path}:TOOLS")
    assert [t.name for t in tools] == ["greet"] and isinstance(tools[0], Tool)
    assert tools[0].run({"name": "ann"}) == '{"text": "hello ann"}'
    assert sys.modules[stem].__file__ == str(path)  # importable under its own name: classes pickle
    assert load_tools(f"{path}:greet")[0] is tools[0]  # loaded once


def test_a_relative_file_path_works(tool_file, monkeypatch):
    path, _ = tool_file
    monkeypatch.chdir(path.parent.parent)
    assert import_object(f"deep/{path.name}:TOOLS")[0].name == "greet"


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
def test_malformed_specs_say_which_form_to_use(spec, pattern):
    with pytest.raises(ConfigError, match=pattern) as info:
        import_object(spec)
    assert "\n" not in str(info.value)


def test_a_file_that_fails_to_import_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader adds the file's folder
    bad = tmp_path / f"broken_{uuid.uuid4().hex[:8]}.py"
    bad.write_text("raise RuntimeError('no\\nway')\n")
    with pytest.raises(ConfigError, match=r"cannot import '.*broken_.*\.py': RuntimeError: no way$") as info:
        load_tools(f"{bad}:TOOLS")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert bad.stem not in sys.modules
    with pytest.raises(ConfigError, match=r"has no attribute 'NOPE'"):
        good = tmp_path / f"good_{uuid.uuid4().hex[:8]}.py"
        good.write_text("X = 1\n")
        load_tools(f"{good}:NOPE")
    sys.modules.pop(good.stem, None)
