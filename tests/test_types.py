"""Types hold for users: the README's examples and a loop over ``engine.run()`` pass ``mypy --strict``.

The package ships ``py.typed``, so a user's type checker reads our hints: an
example that mypy rejects is a promise the package does not keep.  Every
``.. code-block:: python`` of README.rst is checked as a reader would run it:
the blocks in order share one module, a block that starts with ``# NAME.py`` is
that file, and the Flask and Django blocks are files of their own (they import
``llm``).  Only errors in those files count here (``follow_imports = silent``):
the package's own errors are ``scripts/check``'s business.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple

import pytest

pytest.importorskip("mypy", reason="mypy 2 runs on Python 3.10+ only (the check extra installs it there)")

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.rst").read_text(encoding="utf-8")

# Until `tool` (streamengine/tools/_tool.py) has overloads, `@tool(timeout=10)` returns Any and mypy --strict
# calls each function it decorates untyped (bare `@tool` is fine: its result is the Tool it returns).
PACKAGE_ERRORS = [
    re.compile(r'Untyped decorator makes function "\w+" untyped  \[untyped-decorator\]'),
]

# Frameworks' idioms, not ours: views are written as Flask's and Django's docs write them (their bodies, where
# streamengine is called, are still checked: strict includes check_untyped_defs), `app.wsgi_app = ...` is how
# Flask wraps its app, and Django ships no types (django-stubs needs a settings module).
def mypy_ini(framework_modules: List[str]) -> str:
    return f"""\
[mypy]
strict = True
follow_imports = silent
[mypy-{",".join(framework_modules)}]
disallow_untyped_defs = False
disable_error_code = method-assign
[mypy-django.*]
ignore_missing_imports = True
"""

NARROWING = '''\
"""A loop over engine.run() that tells events apart by name, as users write it."""
from typing import Iterable, List

from typing_extensions import assert_never

from streamengine import EngineConfig, Event, OpenAICompatibleClient, StreamingEngine


def describe(events: Iterable[Event]) -> List[str]:
    lines: List[str] = []
    for event in events:
        if event.name == "token":
            lines.append(event.text)
        elif event.name == "tool_start":
            lines.append(event.call.name)
        elif event.name == "tool_result":
            lines.append(f"{event.result.name} {event.skipped or ''}")
        elif event.name == "refusal":
            lines.append(f"{event.text} in round {event.round}")
        elif event.name == "reasoning":
            lines.append(f"({event.text} in round {event.round})")
        elif event.name == "round":
            lines.append(str(event.round + 1))
        elif event.name == "reset":
            lines.append(event.reason)
        elif event.name == "error":
            lines.append(event.message if event.fatal else "")
        elif event.name == "done":
            lines.append(event.result.answer)
        elif event.name == "heartbeat":
            pass
        else:
            assert_never(event)
    return lines


client = OpenAICompatibleClient("http://127.0.0.1:9/v1", api_key="sk-...")
with StreamingEngine(client, [], EngineConfig(models=["gpt-4o-mini"])) as engine:
    for event in engine.run([{"role": "user", "content": "hi"}]):
        if event.name == "token":
            print(event.text.upper())
'''

# The control: without the check on its name, an event's attributes are not there for mypy.
UNNARROWED = '''\
from streamengine import Event


def text_of(event: Event) -> str:
    return event.text
'''


class MypyError(NamedTuple):
    line: int
    message: str


class PackageTypeErrors(Exception):
    """The example's only errors are the package's known ones (PACKAGE_ERRORS): expected to fail until fixed."""


def python_blocks() -> List[str]:
    return ["\n".join(line[3:] for line in match.group(1).splitlines()).strip() + "\n"
            for match in re.finditer(r"\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", README)]


def example_files() -> Dict[str, str]:
    """The README's blocks as the files a reader would make, plus the narrowing example and its control."""
    files: Dict[str, List[str]] = {"readme_examples.py": []}
    for index, code in enumerate(python_blocks()):
        own_file = re.match(r"# ([\w.]+\.py)\n", code)
        if own_file:
            files[own_file.group(1)] = [code]
        elif "from flask import" in code:
            files["flask_example.py"] = [code]
        elif "from django" in code:
            files[f"django_example_{index}.py"] = [code]
        else:
            files["readme_examples.py"].append(code)
    files["narrowing_example.py"] = [NARROWING]
    files["unnarrowed_example.py"] = [UNNARROWED]
    return {name: "\n".join(blocks) for name, blocks in files.items()}


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[MypyError]]:
    """Each example file's errors from one mypy --strict run (this checkout's package, a fresh cache)."""
    folder = tmp_path_factory.mktemp("typed_examples")
    for name, code in example_files().items():
        (folder / name).write_text(code, encoding="utf-8")
    frameworks = [name[:-len(".py")] for name in example_files() if name.startswith(("flask_", "django_"))]
    (folder / "mypy.ini").write_text(mypy_ini(frameworks), encoding="utf-8")
    env = {**os.environ, "MYPYPATH": str(ROOT)}  # this checkout's streamengine, whatever is installed
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(folder / ".mypy_cache"),
         "--no-error-summary", "--show-error-codes", *sorted(example_files())],
        cwd=folder, env=env, capture_output=True, text=True, timeout=240, check=False)
    if done.returncode not in (0, 1) or done.stderr.strip():
        pytest.fail(f"mypy did not run (exit {done.returncode}):\n{done.stderr}{done.stdout}")
    errors: Dict[str, List[MypyError]] = {name: [] for name in example_files()}
    for line in done.stdout.splitlines():
        found = re.match(r"([\w.]+\.py):(\d+): error: (.*)$", line)
        if found:
            errors[found.group(1)].append(MypyError(int(found.group(2)), found.group(3)))
    return errors


def assert_type_checks(errors: List[MypyError], code: str) -> None:
    """Fail on any error of the example's own; raise PackageTypeErrors when only the package's known ones remain."""
    own = [e for e in errors if not any(p.fullmatch(e.message) for p in PACKAGE_ERRORS)]
    lines = code.splitlines()
    assert own == [], "\n".join(f"{e.line}: {e.message}\n    {lines[e.line - 1].strip()}" for e in own)
    if errors:
        raise PackageTypeErrors("\n".join(f"{e.line}: {e.message}" for e in errors))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [
    "readme_examples.py",
    "llm.py",
    "flask_example.py",
    *[name for name in example_files() if name.startswith("django_example_")],
    "narrowing_example.py",
])
def test_example_passes_mypy_strict(mypy_errors: Dict[str, List[MypyError]], name: str) -> None:
    assert_type_checks(mypy_errors[name], example_files()[name])


@pytest.mark.timeout(300)
def test_an_event_not_told_apart_by_name_has_no_text_for_mypy(mypy_errors: Dict[str, List[MypyError]]) -> None:
    own = mypy_errors["unnarrowed_example.py"]
    assert {e.line for e in own} == {5} and all('has no attribute "text"  [union-attr]' in e.message for e in own)
    assert {m for e in own for m in re.findall(r'Item "(\w+)"', e.message)} == {
        "ToolStartEvent", "ToolResultEvent", "RoundEvent", "ResetEvent", "ErrorEvent", "DoneEvent", "HeartbeatEvent"}


def test_every_readme_python_block_is_checked() -> None:
    files = example_files()
    for code in python_blocks():
        assert any(code in text for text in files.values()), code
    assert len([name for name in files if name.startswith("django_example_")]) == 2
