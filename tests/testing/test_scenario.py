"""Scenario files: validation errors name file and JSON path; runs check what they claim.

Through ``streamengine.testing``'s scenario runner and JUnit writer, and ``streamengine.tools.load_tools``
(what ``--tools`` and a scenario's tool specs use).  The harness command itself is tested in
tests/cli/test_cli.py.
"""
from __future__ import annotations

import glob
import os
import sys
import uuid
import xml.etree.ElementTree as ET

import pytest

from streamengine import ConfigError
from streamengine.testing import ScenarioError, ScenarioResult, load_scenario, parse_scenario, run_scenario, write_junit
from streamengine.tools import Tool, load_tools

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = sorted(glob.glob(os.path.join(ROOT, "scripts", "scenarios", "*.json")))
BLOCK = '<tool name="t">{"x": "1"}</tool>'


def scenario(**fields):
    fields.setdefault("turns", [[{"text": "hi"}]])
    return parse_scenario(fields, "case.json")


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write an importable module; returns its unique name."""
    names = []

    def make(source):
        name = f"se_harness_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        names.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in names:
        sys.modules.pop(name, None)


# --- the format ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", SCENARIOS, ids=os.path.basename)
def test_every_shipped_scenario_is_valid(path):
    loaded = load_scenario(path)
    assert loaded.turns and loaded.expect, "a shipped scenario should check something"


@pytest.mark.parametrize("doc, where, needle", [
    ([], "$", "must be a JSON object"),
    ({}, "$", "missing 'turns'"),
    ({"turns": [], "nmae": "x"}, "$.nmae", "unknown key"),
    ({"turns": []}, "$.turns", "at least one turn"),
    ({"turns": [{"text": "x"}]}, "$.turns[0]", "must be a list of steps"),
    ({"turns": [[{"text": "x"}, {"txt": "x"}]]}, "$.turns[0][1].txt", "unknown step"),
    ({"turns": [[{"text": "x", "delay": 1}]]}, "$.turns[0][0]", "exactly one key"),
    ({"turns": [[{"delay": -1}]]}, "$.turns[0][0].delay", ">= 0"),
    ({"turns": [[{"delay": True}]]}, "$.turns[0][0].delay", "got a boolean"),
    ({"turns": [[{"drop": 1}]]}, "$.turns[0][0].drop", "must be true"),
    ({"turns": [[{"http_error": {"status": 200}}]]}, "$.turns[0][0].http_error.status", "400-599"),
    ({"turns": [[{"tool_call": {"index": "0"}}]]}, "$.turns[0][0].tool_call.index", "an integer"),
    ({"turns": [[]], "tools": [{"fake": "explode", "name": "x"}]}, "$.tools[0].fake", "echo, sleep, fail, hang"),
    ({"turns": [[]], "tools": [{"fake": "echo", "name": "bad name"}]}, "$.tools[0]", "invalid"),
    ({"turns": [[]], "tools": [{"fake": "echo", "name": "x", "params": {"a": "str"}}]},
     "$.tools[0].params.a", "string, integer"),
    ({"turns": [[]], "tools": [{"fake": "echo", "name": "x"}, {"fake": "fail", "name": "x"}]},
     "$.tools[1]", "a second tool named 'x'"),
    ({"turns": [[]], "tools": [{"import": "no_such_mod_q:T"}]}, "$.tools[0].import", "cannot import"),
    ({"turns": [[]], "config": {"modles": ["m"]}}, "$.config.modles", "unknown key"),
    ({"turns": [[]], "config": {"tool_mode": "telepathy"}}, "$.config", "tool_mode"),
    ({"turns": [[]], "expect": {"events": ["round", "tokens"]}}, "$.expect.events[1]", "unknown event"),
    ({"turns": [[]], "expect": {"telemetry": {"tool_ok": 1}}}, "$.expect.telemetry.tool_ok", "unknown key"),
    ({"turns": [[]], "expect": {"request_contains": {"first": ["x"]}}}, "$.expect.request_contains.first",
     "request indexes"),
])
def test_invalid_scenarios_name_the_file_and_json_path(doc, where, needle):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, "bad.json")
    message = str(info.value)
    assert message.startswith(f"bad.json: {where}: "), message
    assert needle in message
    assert isinstance(info.value, ConfigError)


def test_unreadable_and_invalid_json_files(tmp_path):
    with pytest.raises(ScenarioError, match=r"missing\.json: cannot read"):
        load_scenario(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text('{"turns": [\n  [}\n')
    with pytest.raises(ScenarioError, match=r"broken\.json: line 2 column 4: invalid JSON"):
        load_scenario(str(broken))


# --- running ---------------------------------------------------------------------------------

def test_a_scenario_that_holds_passes_and_one_that_does_not_says_why():
    turns = [[{"text": "a " + BLOCK}, {"delay": 0.2}, {"text": " b"}], [{"text": "final"}]]
    tools = [{"fake": "echo", "name": "t", "params": {"x": "string"}}]
    good = run_scenario(scenario(turns=turns, tools=tools, expect={
        "events": ["round", "tool_start", "tool_result", "token", "round", "done"],
        "tools_started_before_stream_end": True, "answer_equals": "final", "requests": 2,
        "request_contains": {"1": ['\\"x\\": \\"1\\"']}, "telemetry": {"tools_ok": 1}, "error": False}))
    assert good.passed, good.reason
    bad = run_scenario(scenario(turns=turns, tools=tools, expect={
        "events": ["done", "round"], "tools_started_before_stream_end": False, "answer_contains": "nope",
        "requests": 3, "requested_models": ["other"], "request_contains": {"5": ["x"]},
        "telemetry": {"tools_ok": 2}, "error": True}))
    assert not bad.passed and bad.error is None
    reasons = "\n".join(bad.failures)
    for needle in ("events: expected ['done', 'round']", "t started", "before",
                   "answer does not contain 'nope'", "got 2 chat request(s), expected 3",
                   "requested models were ['fake-model', 'fake-model']", "there is no request 5",
                   "telemetry.tools_ok is 1, expected 2", "without an error"):
        assert needle in reasons
    assert "tool_start t" in bad.transcript


def test_side_effect_tool_starts_after_the_stream_by_the_providers_clock():
    result = run_scenario(scenario(
        turns=[[{"text": BLOCK}, {"delay": 0.1}, {"text": "."}, {"approve": {"t": True}}], [{"text": "sent"}]],
        tools=[{"fake": "echo", "name": "t", "params": {"x": "string"}, "side_effects": True}],
        expect={"tools_started_before_stream_end": True}))
    assert len(result.failures) == 1
    assert "t started" in result.failures[0] and "after its stream ended" in result.failures[0]


def test_fail_and_sleep_fakes_and_parse_errors():
    result = run_scenario(scenario(
        turns=[[{"text": '<tool name="f">{}</tool><tool name="z">{"s": 1}</tool><tool name="t">not json</tool>'}],
               [{"text": "explained"}]],
        tools=[{"fake": "fail", "name": "f", "message": "disk full"},
               {"fake": "sleep", "name": "z", "seconds": 0.05, "params": {"s": "integer"}, "result": "slept"}],
        expect={"telemetry": {"tools_failed": 1, "tools_ok": 1, "parse_errors": 1},
                "request_contains": {"1": ["disk full", "slept"]}}))
    assert result.passed, result.reason


def test_stall_and_drop_steps_end_the_round_with_an_error():
    result = run_scenario(scenario(
        config={"idle_timeout": 0.2, "models": ["a", "b"]},
        turns=[[{"stall": True}], [{"text": "partial"}, {"drop": True}]],
        expect={"error": True, "answer_contains": "partial",
                "requested_models": ["a", "b"]}))
    assert result.passed, result.reason


def test_imported_tools_and_a_crashing_import_are_reported(module):
    name = module("from streamengine.tools import tool\n\n@tool\ndef t(x: str) -> str:\n"
                  "    '''Echo.'''\n    return 'imported ' + x\n")
    result = run_scenario(scenario(turns=[[{"text": BLOCK}], [{"text": "ok"}]], tools=[{"import": f"{name}:t"}],
                                   expect={"request_contains": {"1": ["imported 1"]}}))
    assert result.passed, result.reason
    broken = module("raise RuntimeError('no database')\n")
    with pytest.raises(ScenarioError, match=r"\$\.tools\[0\]\.import: .*RuntimeError: no database"):
        scenario(tools=[{"import": f"{broken}:x"}])


def test_a_scenario_that_cannot_run_is_an_error_not_a_crash(monkeypatch):
    from streamengine.testing import _scenario as harness

    def broken_engine(*args, **kwargs):
        raise RuntimeError("engine on fire")

    monkeypatch.setattr(harness, "StreamingEngine", broken_engine)
    crashed = run_scenario(scenario())
    assert not crashed.passed and crashed.error == "crashed: RuntimeError: engine on fire"
    monkeypatch.setattr(harness, "StreamingEngine", lambda *a, **k: (_ for _ in ()).throw(ConfigError("closed")))
    refused = run_scenario(scenario())
    assert refused.error == "could not run: closed"


# --- load_tools ------------------------------------------------------------------------------

def test_load_tools_accepts_a_tool_a_function_a_list_and_a_registry(module):
    name = module(
        "from streamengine.tools import ToolRegistry, tool\n"
        "@tool\ndef a() -> str:\n    '''A.'''\n    return 'a'\n"
        "def b() -> str:\n    '''B.'''\n    return 'b'\n"
        "LIST = [a, b]\nREG = ToolRegistry([a, b])\nclass NS:\n    inner = (a,)\n"
    )
    assert [t.name for t in load_tools(f"{name}:a")] == ["a"]
    assert [t.name for t in load_tools(f"{name}:b")] == ["b"]
    assert [t.name for t in load_tools(f"{name}:LIST")] == ["a", "b"]
    assert [t.name for t in load_tools(f"{name}:REG")] == ["a", "b"]
    assert [t.name for t in load_tools(f"{name}:NS.inner")] == ["a"]
    assert all(isinstance(t, Tool) for t in load_tools(f"{name}:LIST"))


def test_load_tools_refuses_functions_that_cannot_be_tools(module):
    name = module("def bad(*args):\n    return 1\n")
    with pytest.raises(ConfigError, match=r"'.*:bad': .*\*args"):
        load_tools(f"{name}:bad")


# --- junit -----------------------------------------------------------------------------------

def test_junit_escapes_markup_and_drops_what_xml_cannot_hold(tmp_path):
    nasty = 'a <b> & "c" \'d\' \x00\x07\x1b ]]> \ud800 \U0001f600'
    results = [ScenarioResult("ok", "ok.json", 0.1),
               ScenarioResult(nasty, "x.json", 0.2, failures=[nasty, "second"], transcript=nasty),
               ScenarioResult("err", "e.json", 0.0, error=nasty)]
    path = tmp_path / "deep" / "junit.xml"
    write_junit(results, str(path))
    root = ET.parse(path).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert cases[0].get("name") == "ok" and cases[0].find("failure") is None
    shown = 'a <b> & "c" \'d\' \ufffd\ufffd\ufffd ]]> \ufffd \U0001f600'
    assert cases[1].get("name") == shown
    assert cases[1].find("failure").get("message") == shown
    assert cases[1].find("failure").text == shown + "\nsecond"
    assert cases[1].find("system-out").text == shown
    assert cases[2].find("error").get("message") == shown
