"""The README's provider recipes, read from README.rst and run as typed through the CLI's main()."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import List, Tuple

from cli_support import CLI_ENV, main

from streamengine.testing import FakeProvider

README = (Path(__file__).resolve().parents[2] / "README.rst").read_text(encoding="utf-8")


PROVIDERS = README.split("Providers\n---------", 1)[1].split("\nIn a web app", 1)[0]


def recipes(title: str) -> List[str]:
    """The console blocks that follow ``**title**`` (up to the next bold title)."""
    section = PROVIDERS.split(f"**{title}**", 1)[1].split("\n**", 1)[0]
    blocks = re.findall(r"\.\. code-block:: console\n\n((?:(?:   .*)?\n)+)", section)
    assert blocks, f"no console block for {title}"
    return [unindented(b) for b in blocks]


def unindented(block: str) -> str:
    """The block's text as typed: indentation removed, continued lines joined."""
    return "\n".join(line[3:] for line in block.splitlines()).replace("\\\n", " ")


def run_recipe(block: str, root: str, monkeypatch, capsys) -> Tuple[int, str, str]:
    """Run a recipe's lines with every URL's scheme and host replaced by ``root``."""
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", root + "/v1")  # where "the default" points in this test
    rc, out, err = None, "", ""
    for line in block.splitlines():
        command = re.sub(r"https?://[^/\s]+", root, line.strip().lstrip("$ ").strip())
        if command.startswith("export "):
            name, _, value = command[len("export "):].partition("=")
            monkeypatch.setenv(name, value)
        elif command.startswith("streamengine "):
            rc = main(shlex.split(command)[1:])
            out, err = capsys.readouterr()
    assert rc is not None, f"the recipe runs no streamengine command:\n{block}"
    return rc, out, err


def root_of(provider: FakeProvider) -> str:
    return provider.base_url[: -len("/v1")]
