"""The install story: the sdist and the wheel build, and the wheel alone is a working install.

The build is what ``python -m build`` does: the sdist first, then the wheel
from the unpacked sdist, so a file the sdist forgets fails here too.  It runs
without build isolation (the test extra has setuptools and wheel): isolation
downloads them twice, ~30 s against ~4 s.  The wheel, with its ``serve``
extra, goes into a fresh venv that has nothing else (no pip, no access to
this checkout); its dependencies come from the package index, as a user's
do.  From that venv the README's first example runs against a loopback
FakeProvider, ``streamengine --version`` answers, and the web page is served
from the installed package.
"""
from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = [pytest.mark.usefixtures("no_thread_leak"), pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("setup.cfg", "setup.py", "pyproject.toml", "README.rst")
OPENAI = '"https://api.openai.com/v1"'
SETUP = configparser.ConfigParser()
SETUP.read(ROOT / "setup.cfg")
VERSION = SETUP["metadata"]["version"]
WHEEL = f"streamengine-{VERSION}-py3-none-any.whl"
README = (ROOT / "README.rst").read_text(encoding="utf-8")

#: What the README's first example prints when the model calls the weather tool once.
FIRST_EXAMPLE_OUTPUT = ['Let me check. <tool name="weather">{"city": "Oslo"}</tool>', "[weather started]",
                        "[weather: sunny in Oslo]", "", "[revised answer]", "It is sunny in Oslo.", "[done: 2 rounds]"]

#: Run in the installed venv: where streamengine came from, and the page the WSGI app serves from its files.
INSTALLED_CHECK = """
import sys
from wsgiref.util import setup_testing_defaults
import waitress  # the serve extra
import streamengine
from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.wsgi import make_wsgi_app

print(streamengine.__file__)
with StreamingEngine(OpenAICompatibleClient(sys.argv[1], api_key="sk-x"), [], EngineConfig(model="m")) as engine:
    environ = {"PATH_INFO": "/", "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    status = []
    page = b"".join(make_wsgi_app(engine)(environ, lambda line, headers, exc_info=None: status.append(line)))
    print(status[0], b"<html" in page.lower())
"""


def run(args: Sequence[Any], cwd: Path, timeout: float) -> str:
    """Run a command outside this checkout's environment; its stdout, or a failure showing its output."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not name.startswith("STREAMENGINE_")}
    env["PYTHONNOUSERSITE"] = "1"
    done = subprocess.run([str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                    f"{done.stderr[-3000:]}")
    return done.stdout


def build(tmp_path: Path) -> Dict[str, Path]:
    """The sdist and the wheel, built from a copy of the sources (the build writes egg-info beside them)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "streamengine", src / "streamengine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], tmp_path, timeout=120)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == WHEEL, "the README's Installation section names the wheel by this name"
    return {"sdist": sdist, "wheel": wheel}


def package_files() -> List[str]:
    """Every file the package is made of, as paths inside a wheel."""
    files = [path for path in (ROOT / "streamengine").rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"]
    return sorted(path.relative_to(ROOT).as_posix() for path in files)


def check_contents(sdist: Path, wheel: Path) -> None:
    expected = package_files()
    assert "streamengine/py.typed" in expected and "streamengine/static/index.html" in expected
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = sorted(name for name in archive.namelist() if name.startswith("streamengine/"))
    assert in_wheel == expected, f"missing from the wheel: {sorted(set(expected) - set(in_wheel))}"
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert set(expected) <= in_sdist, f"missing from the sdist: {sorted(set(expected) - in_sdist)}"
    assert {"README.rst", "setup.cfg", "pyproject.toml"} <= in_sdist


def weather_turns(payload: Dict[str, Any]) -> List[Any]:
    """Round 1 calls the weather tool inline; the round after it answers."""
    if any(m["role"] == "assistant" for m in payload["messages"]):
        return [s.text("It is sunny in Oslo.")]
    return [s.text('Let me check. <tool name="weather">{"city": "Oslo"}</tool>')]


def first_readme_example() -> str:
    block = re.search(r"\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", README)
    assert block, "the README has no Python example"
    return "\n".join(line[3:] for line in block.group(1).splitlines()).strip() + "\n"


def test_the_installation_section_names_every_extra_and_the_wheel() -> None:
    section = README.split("Installation\n------------\n", 1)[1].split("\nExample\n-------\n", 1)[0]
    extras = set(SETUP["options.extras_require"]) - {"test", "bench", "check"}  # for developers, not users
    described = set(re.findall(r"^``(\w+)``  ", section, re.M))
    assert described == extras, f"setup.cfg's extras {sorted(extras)}, the README's table {sorted(described)}"
    assert f'pip install "dist/{WHEEL}[serve]"' in section
    python = SETUP["options"]["python_requires"].lstrip(">=")
    assert f"Python {python} or newer" in section


def test_the_wheel_alone_installs_and_runs_the_readme_example(tmp_path: Path) -> None:
    built = build(tmp_path)
    check_contents(built["sdist"], built["wheel"])

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, timeout=60)
    python, here = venv / "bin" / "python", tmp_path / "user"
    here.mkdir()
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-input",
         f"{built['wheel']}[serve]"], tmp_path, timeout=180)

    version = run([venv / "bin" / "streamengine", "--version"], here, timeout=30)
    assert version.strip() == f"streamengine {VERSION}"
    with FakeProvider() as fp:
        fp.respond_with(weather_turns)
        (here / "example.py").write_text(first_readme_example().replace(OPENAI, repr(fp.base_url)), encoding="utf-8")
        assert run([python, "example.py"], here, timeout=30).splitlines() == FIRST_EXAMPLE_OUTPUT
        where, page = run([python, "-c", INSTALLED_CHECK, fp.base_url], here, timeout=30).splitlines()
    assert Path(where).resolve().is_relative_to(venv.resolve()), f"streamengine was imported from {where}"
    assert page == "200 OK True", "the installed package did not serve its page"
