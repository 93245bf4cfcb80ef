"""A short soak in CI: 60 sequential + 20 concurrent runs through the WSGI app under waitress.

The full soak (1000 + 100) is ``scripts/soak``; this runs the same code,
shorter, so a leak or a run that does not end with ``done`` + ``[DONE]``
fails the suite.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("no_thread_leak")

SOAK_PY = Path(__file__).resolve().parents[3] / "scripts" / "soak.py"


def _load_soak():
    spec = importlib.util.spec_from_file_location("streamengine_soak_script", SOAK_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_short_soak_with_random_faults():
    soak = _load_soak()
    report = soak.run_soak(sequential=60, concurrent=20, seed=7)
    assert report.ok, report.summary()
    # Every kind of fault was really exercised, and every run was accounted for.
    assert set(report.injected) >= {"http_503", "drop_before_headers", "stall", "tool_hung", "tool_error"}
    assert sum(n for k, n in report.outcomes.items() if k != "FAILED") == 80
    assert report.outcomes["FAILED"] == 0


def test_the_soak_reports_a_run_that_does_not_end_with_done():
    """The checker itself: a stream cut before ``done`` must be a failure, not a pass."""
    soak = _load_soak()
    ok = soak._check([b'data: "hi"', b'event: done\ndata: {"answer": "hi", "telemetry": {}}', b"data: [DONE]"], 1)
    assert ok.ok
    assert not soak._check([b'data: "hi"', b"data: [DONE]"], 1).ok
    assert not soak._check([b'data: "hi"', b'event: done\ndata: {"telemetry": {}}'], 1).ok
    internal = soak._check([b'event: error\ndata: {"message": "internal error: KeyError"}',
                            b'event: done\ndata: {"telemetry": {"stop_reason": "internal_error"}}',
                            b"data: [DONE]"], 0)
    assert not internal.ok
