"""The README is the front door: its commands exist and its Python examples are real."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.rst").read_text(encoding="utf-8")


def python_blocks():
    blocks = []
    for match in re.finditer(r"\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", README):
        lines = [line[3:] for line in match.group(1).splitlines()]
        blocks.append("\n".join(lines).strip() + "\n")
    return blocks


def test_readme_opens_with_exactly_the_two_commands():
    first_block = README.split(".. code-block:: console", 1)[1].split("\n\n", 2)[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["scripts/demo", "scripts/test"]
    for command in commands:
        assert os.access(ROOT / command, os.X_OK)
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("code", python_blocks())
def test_every_python_example_compiles(code):
    compile(code, "README.rst", "exec")


def test_the_first_example_runs_against_a_loopback_provider(capsys):
    from streamengine.testing import FakeProvider, steps as s

    example = python_blocks()[0]
    with FakeProvider() as fp:
        fp.add_turn(s.text('Let me check. <tool name="weather">{"city": "Oslo"}</tool>'))
        fp.add_turn(s.text("It is sunny in Oslo."))
        code = example.replace('"https://api.openai.com/v1"', repr(fp.base_url))
        exec(compile(code, "README.rst", "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "tool_start" in out and "tool_result" in out and "It is sunny in Oslo." in out
    assert out.strip().splitlines()[-1].startswith("done")
