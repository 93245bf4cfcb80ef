"""The ``streamengine`` command in-process: ``main(argv) -> int`` with captured output."""
from __future__ import annotations

import glob
import importlib
import json
import os
import queue
import re
import socket
import threading
import xml.etree.ElementTree as ET

import pytest
import requests
from cli_support import clean_env, main, tools_module  # noqa: F401  (fixtures)

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = sorted(glob.glob(os.path.join(ROOT, "scripts", "scenarios", "*.json")))
BLOCK = '<tool name="lookup">{"city": "Oslo"}</tool>'

TOOLS_SOURCE = '''
import threading

from streamengine.tools import ToolContext, tool

STARTED = threading.Event()  # the provider goes on with " Still talking." once lookup runs

@tool
def lookup(city: str, ctx: ToolContext) -> str:
    """Weather for a city."""
    STARTED.set()
    ctx.sleep(1.0)  # longer than the rest of the stream: its result line comes after "Still talking."
    return "sunny in " + city

def plain(x: int) -> int:
    """A plain function is a tool too."""
    return x * 2

TOOLS = [lookup, plain]
NOT_A_TOOL = 42
'''


def run(capsys, *argv, **hooks):
    rc = main(list(argv), **hooks)
    out, err = capsys.readouterr()
    return rc, out, err


def tool_turns(fp, tools_module):
    """The model calls lookup, and talks on once it runs (the tools module is imported now, by the CLI later)."""
    started = importlib.import_module(tools_module).STARTED
    fp.add_turn(s.text("Checking. "), s.text(BLOCK), s.wait(started, timeout=5), s.text(" Still talking."))
    fp.add_turn(s.text("It is sunny in Oslo."))


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def assert_one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("streamengine: error: ")
    assert "Traceback" not in err


# --- chat ------------------------------------------------------------------------------------

def test_chat_streams_the_answer_to_stdout_and_tool_lines_to_stderr(capsys, tools_module):
    with FakeProvider() as fp:
        tool_turns(fp, tools_module)
        rc, out, err = run(capsys, "chat", "weather?", "--base-url", fp.base_url, "--model", "m1",
                           "--tools", f"{tools_module}:TOOLS")
    assert rc == 0, err
    # stdout is not a terminal: it gets the final answer alone; the draft streamed on stderr, without markup.
    assert out == "It is sunny in Oslo.\n"
    assert re.search(r"^Checking\.\n\[tool lookup started .*\]\nStill talking\.$", err, re.M), err
    assert "<tool" not in err
    assert err.index("Checking.") < err.index("[round 2") < err.rindex("It is sunny in Oslo.")
    assert "\x1b[" not in out + err  # not a terminal: no colour codes
    assert re.search(r"^\[tool lookup started \+\d+\.\d\ds\]$", err, re.M), err
    assert re.search(r"^\[tool lookup ok \d+\.\d\ds\]$", err, re.M), err
    assert err.index("[tool lookup started") < err.index("[tool lookup ok")
    assert "[round 2" in err
    # The tool was offered to the model, both as a native tool and in the inline syntax lesson.
    first = fp.requests[0].json
    assert {t["function"]["name"] for t in first["tools"]} == {"lookup", "plain"}


def test_chat_json_prints_one_event_per_line(capsys, tools_module):
    with FakeProvider() as fp:
        tool_turns(fp, tools_module)
        rc, out, err = run(capsys, "chat", "weather?", "--base-url", fp.base_url, "--model", "m1",
                           "--tools", f"{tools_module}:lookup", "--json", "--system", "Be brief.")
    assert rc == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    names = [r["event"] for r in records]
    assert names[0] == "round" and names[-1] == "done"
    start = names.index("tool_start")
    later = next(i for i, r in enumerate(records) if r["event"] == "token" and "Still" in r["text"])
    assert start < later  # the tool started while the model was still talking
    assert records[start]["name"] == "lookup" and json.loads(records[start]["arguments"]) == {"city": "Oslo"}
    result = next(r for r in records if r["event"] == "tool_result")
    assert result["ok"] is True and result["text"] == "sunny in Oslo" and result["started_s"] is not None
    done = records[-1]
    assert done["answer"] == "It is sunny in Oslo." and done["error"] is None
    assert done["telemetry"]["tools_ok"] == 1 and done["telemetry"]["rounds"] == 2
    assert all(isinstance(r["t"], (int, float)) for r in records)
    assert fp.requests[0].json["messages"][0] == {"role": "system", "content": "Be brief."}


def test_chat_reads_provider_model_and_key_from_the_environment(capsys, monkeypatch):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "overloaded"}}))
        fp.add_turn(s.text("from the backup"))
        monkeypatch.setenv("STREAMENGINE_BASE_URL", fp.base_url)
        monkeypatch.setenv("STREAMENGINE_MODEL", "primary, backup")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
        rc, out, err = run(capsys, "chat", "hi")
    assert rc == 0, err
    assert out == "from the backup\n"
    assert [r.json["model"] for r in fp.requests] == ["primary", "backup"]
    assert fp.requests[0].headers["Authorization"] == "Bearer sk-test-123"
    assert "sk-test-123" not in out + err


def test_flags_override_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("STREAMENGINE_MODEL", "from-env")
    monkeypatch.setenv("STREAMENGINE_API_KEY", "sk-env")
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, out, _ = run(capsys, "chat", "hi", "--base-url", fp.base_url, "--model", "a", "--model", "b",
                         "--api-key", "sk-flag")
    assert rc == 0 and out == "ok\n"
    assert fp.requests[0].json["model"] == "a"
    assert fp.requests[0].headers["Authorization"] == "Bearer sk-flag"


def test_chat_llm_error_is_one_line_on_stderr_and_exit_1(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "overloaded\nreally"}}))
        rc, out, err = run(capsys, "chat", "hi", "--base-url", fp.base_url, "--model", "only")
    assert rc == 1
    assert out == ""  # the engine's visible warning token is not repeated on stdout
    assert_one_error_line(err)
    assert "overloaded" in err


def test_chat_json_llm_error_exits_1_with_the_error_event(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(500, {"error": {"message": "boom"}}))
        rc, out, err = run(capsys, "chat", "hi", "--base-url", fp.base_url, "--model", "only", "--json")
    assert rc == 1
    names = [json.loads(line)["event"] for line in out.splitlines()]
    assert "error" in names and names[-1] == "done"
    assert_one_error_line(err)


def test_chat_unreachable_provider_is_one_line_and_exit_1(capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    rc, out, err = run(capsys, "chat", "hi", "--base-url", url, "--model", "m")
    assert rc == 1
    assert out == ""
    assert_one_error_line(err)
    assert "127.0.0.1" in err


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module_xyz:TOOLS", "cannot import module 'no_such_module_xyz'"),
    ("{mod}:MISSING", "has no attribute 'MISSING'"),
    ("{mod}", "expected 'module:attribute'"),
    ("{mod}:NOT_A_TOOL", "is not a tool or a function"),
])
def test_bad_tools_flag_is_one_line_and_exit_2(capsys, tools_module, spec, needle):
    rc, out, err = run(capsys, "chat", "hi", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                       "--tools", spec.format(mod=tools_module))
    assert rc == 2
    assert out == ""
    assert_one_error_line(err)
    assert needle in err


@pytest.mark.parametrize("argv, needle", [
    (["chat", "hi"], "no model"),
    (["chat", "hi", "--model", "m", "--tool-timeout", "-1"], "positive number"),
    (["chat", "hi", "--model", "m", "--max-continuations", "-1"], "max_continuations"),
    (["chat", "hi", "--model", "m", "--base-url", "ftp://x"], "base_url"),
    (["chat", "--model", "m"], "the prompt is empty"),
    (["chat", "hi", "-m", "m", "--timeout", "-5"], "positive number of seconds"),
    (["chat", "hi", "-m", "m", "--max-tokens", "0"], "positive whole number"),
    (["chat", "hi", "-m", "m", "-o", "novalue"], "expected KEY=VALUE"),
    (["chat", "hi", "-m", "m", "--header", "X-Nope"], "expected KEY:VALUE"),
    (["chat", "hi", "-m", "m", "--provider", "anthropic", "--no-stream-options"], "only apply to --provider openai"),
    (["chat", "hi", "--bogus"], "unrecognized arguments"),
    (["serve", "--port", "70000"], "0-65535"),
    (["nope"], "no model"),  # a bare word is a prompt for chat, as with llm
])
def test_usage_errors_are_one_line_and_exit_2(capsys, argv, needle):
    rc, _out, err = run(capsys, *argv)
    assert rc == 2
    assert_one_error_line(err)
    assert needle in err


def test_no_command_prints_help_and_exits_2(capsys):
    rc, _, err = run(capsys)
    assert rc == 2 and "chat" in err and "harness" in err


def test_help_exits_0(capsys):
    rc, out, _ = run(capsys, "chat", "--help")
    assert rc == 0 and "--max-continuations" in out and "STREAMENGINE_MODEL" in out


# --- demo ------------------------------------------------------------------------------------

SPAN = r"\+(\d+\.\d+) \.\. \+(\d+\.\d+)"


def test_demo_fast_shows_tools_starting_before_the_stream_ended(capsys):
    rc, out, err = run(capsys, "demo", "--fast")
    assert rc == 0, out + err
    assert "no key, no network" in out
    # The stream as it happened: tool starts printed between the model's words.
    assert out.index("[tool get_weather started +") < out.index("While those run")
    assert out.index("[tool search_flights started +") < out.index("While those run")
    # The summary, parsed back: the numbers, not the wall clock.
    stream_end = float(re.search(r"model stream, round 1\s+\+0\.00 \.\. \+(\d+\.\d+)", out).group(1))
    tools = {m.group(1): (float(m.group(2)), float(m.group(3)))
             for m in re.finditer(r"^  tool (\w+)\s+" + SPAN, out, re.M)}
    assert set(tools) == {"get_weather", "search_flights"}
    for name, (start, end) in tools.items():
        assert start < stream_end, f"{name} started at +{start}, after the stream ended at +{stream_end}"
        assert end >= start
    total = float(re.search(r"^  total\s+(\d+\.\d+)s", out, re.M).group(1))
    durations = [end - start for start, end in tools.values()]
    phase_end = max([stream_end] + [end for _, end in tools.values()])
    for label, work in (("in parallel after the stream", max(durations)),
                        ("one by one after the stream", sum(durations))):
        line = re.search(re.escape(label) + r".*-> total (\d+\.\d+)s, overlap saved (\d+\.\d+)s", out)
        assert line, out
        waited_total, saved = float(line.group(1)), float(line.group(2))
        assert saved == pytest.approx(stream_end + work - phase_end, abs=0.02)
        assert waited_total == pytest.approx(total + saved, abs=0.02)
        assert saved > 0
    assert "started while the model was still writing" in out


# --- harness ---------------------------------------------------------------------------------

def test_harness_runs_every_shipped_scenario(capsys, tmp_path):
    assert len(SCENARIOS) >= 4
    junit = tmp_path / "out" / "junit.xml"
    rc, out, err = run(capsys, "harness", *SCENARIOS, "--junit", str(junit))
    assert rc == 0, out + err
    assert out.count("PASS ") == len(SCENARIOS)
    assert re.search(rf"^{len(SCENARIOS)} passed, 0 failed", out, re.M)
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == str(len(SCENARIOS)) and suite.get("failures") == "0"


def test_harness_failure_exits_1_and_writes_wellformed_junit(capsys, tmp_path):
    nasty = 'bad <&> "quoted" \u0001 name'
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps({
        "name": nasty,
        "turns": [[{"text": "an answer with <xml> & \u001b[31m escape"}]],
        "expect": {"answer_contains": ["something else"], "telemetry": {"rounds": 2}},
    }))
    invalid = tmp_path / "invalid.json"
    invalid.write_text('{"turns": [[{"text": 1}]]}')
    junit = tmp_path / "junit.xml"
    rc, out, _ = run(capsys, "harness", str(failing), str(invalid), SCENARIOS[0], "--junit", str(junit))
    assert rc == 1
    assert re.search(r"^FAIL bad <&> .*answer does not contain 'something else'.*telemetry\.rounds is 1", out, re.M)
    assert re.search(r"^FAIL invalid: invalid scenario: .*invalid\.json: \$\.turns\[0\]\[0\]\.text: must be a string",
                     out, re.M)
    assert "1 passed, 2 failed" in out
    root = ET.parse(junit).getroot()  # well-formed despite <, &, quotes and control characters
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failed = cases["bad <&> \"quoted\" \ufffd name"]
    failure = failed.find("failure")
    assert "something else" in failure.get("message") and "telemetry.rounds" in failure.text
    assert "<xml> &" in failed.find("system-out").text
    assert cases["invalid"].find("error") is not None


def test_harness_format_prints_what_a_scenario_file_holds_and_a_bare_harness_says_what_it_needs(capsys):
    rc, out, _ = run(capsys, "harness", "--format")
    assert rc == 0
    for key in ('"turns"', '"expect"', "{\"reasoning\": s}", "tools_started_before_stream_end", "**Approval**"):
        assert key in out
    rc, _, err = run(capsys, "harness")
    assert rc == 2 and "--format" in err and "scenario files" in err


# --- serve -----------------------------------------------------------------------------------

class Server:
    """``main([...])`` in a thread, stopped through the ``stop`` hook."""

    def __init__(self, argv):
        self.stop = threading.Event()
        self.urls = queue.Queue()
        self.rc = []
        self.thread = threading.Thread(target=lambda: self.rc.append(main(argv, stop=self.stop, ready=self.urls.put)),
                                       name="test-cli-server")

    def __enter__(self):
        self.thread.start()
        try:
            self.url = self.urls.get(timeout=10)
        except queue.Empty as empty:
            self.stop.set()
            self.thread.join(10)
            raise AssertionError(f"the server did not start (exit status {self.rc})") from empty
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


def test_serve_answers_healthz_and_streams_on_a_free_port(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("streamed "), s.text("over SSE"))
        with Server(["serve", "--port", "0", "--model", "m", "--base-url", fp.base_url, "--threads", "4"]) as srv:
            port = int(re.match(r"http://127\.0\.0\.1:(\d+)/$", srv.url).group(1))
            assert port != 0
            with requests.Session() as http:
                health = http.get(srv.url + "healthz", timeout=5)
                assert health.status_code == 200 and health.json() == {"status": "ok"}
                stream = http.post(srv.url + "v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                                   timeout=10)
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            assert 'data: "streamed "' in stream.text and stream.text.rstrip().endswith("data: [DONE]")
    assert srv.rc == [0]
    out = capsys.readouterr().out
    assert f"serving on {srv.url}" in out and "stopped" in out


def test_demo_serve_streams_the_scripted_run(capsys):
    with Server(["demo", "--serve", "--port", "0", "--fast"]) as srv, requests.Session() as http:
        assert http.get(srv.url + "healthz", timeout=5).status_code == 200
        page = http.get(srv.url, timeout=5)
        assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
        stream = http.get(srv.url + "v1/chat/stream", params={"q": "anything"},
                          headers={"Accept": "text/event-stream"}, timeout=10)
    assert stream.text.count("event: tool_start") == 2
    assert stream.text.count("event: round") == 2 and "data: [DONE]" in stream.text
    assert srv.rc == [0]
    assert "serving on http://127.0.0.1:" in capsys.readouterr().out


def test_serve_on_a_busy_port_is_one_line_and_exit_1(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        rc, _, err = run(capsys, "serve", "--port", str(busy.getsockname()[1]), "--model", "m")
    finally:
        busy.close()
    assert rc == 1
    assert_one_error_line(err)
    assert "cannot listen on 127.0.0.1:" in err


def test_verbose_error_lines_show_the_chain_underneath(capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        rc, _, err = run(capsys, "serve", "--port", str(busy.getsockname()[1]), "--model", "m", "-v")
    finally:
        busy.close()
    assert rc == 1
    lines = [line for line in err.splitlines() if not re.match(r"\d\d:\d\d:\d\d", line)]  # not log lines
    assert lines[0].startswith("streamengine: error: cannot listen on 127.0.0.1:")
    assert re.fullmatch(r"  caused by OSError: \[Errno \d+\] .*", lines[1]), err


def test_serve_system_prompt_leads_every_run(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        with Server(["serve", "--port", "0", "-m", "m", "--base-url", fp.base_url, "--threads", "2",
                     "--system", "Answer in French."]) as srv:
            with requests.Session() as http:
                stream = http.post(srv.url + "v1/chat/stream", timeout=10,
                                   json={"messages": [{"role": "user", "content": "hi"}]})
            assert "data: [DONE]" in stream.text
    assert fp.requests[0].json["messages"] == [{"role": "system", "content": "Answer in French."},
                                               {"role": "user", "content": "hi"}]
    assert "with a system prompt" in capsys.readouterr().out
