"""The real frontend clients, run by Node from tests/web/frontend (package.json and its committed lockfile).

scripts/test installs Node where missing and runs ``npm ci`` there when the
lockfile changed (scripts/_node.sh).  Without Node or the packages the tests
skip, and fail under ``CI=true``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

FRONTEND = Path(__file__).resolve().parents[1] / "web" / "frontend"
NODE_TIMEOUT_S = 60


def require_node() -> str:
    """Node on PATH with tests/web/frontend's packages installed; else a skip (a failure under CI=true)."""
    node = shutil.which("node")
    missing = "node is not installed" if node is None else \
        "tests/web/frontend/node_modules is missing" if not (FRONTEND / "node_modules" / "ai5").is_dir() else ""
    if missing:
        message = (f"{missing}: run the tests through scripts/test (it installs Debian's nodejs and runs npm ci "
                   "in tests/web/frontend), or run npm ci there yourself")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the frontend tests must run in CI)", pytrace=False)
        pytest.skip(message)
    assert node is not None
    return node


def run_node(node: str, script: str, *args: str) -> Dict[str, Any]:
    """Run ``script`` of tests/web/frontend with ``args``; its one JSON line of output, decoded."""
    done = subprocess.run([node, script, *args], cwd=FRONTEND, capture_output=True, text=True,
                          timeout=NODE_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"node {script} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"node {script} printed no result:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    result: Dict[str, Any] = json.loads(lines[-1])
    return result
