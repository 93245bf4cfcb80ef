"""The first hour of a newcomer who knows ``llm``: what they type must do what they expect.

In-process ``main(argv)`` against FakeProvider over real HTTP, and the
installed command in a subprocess where a real pipe or terminal is the point.
The run log goes to a temporary XDG_DATA_HOME (conftest).
"""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys

import pytest
import requests
from cli_support import CLI_ENV, LOOKUP_TOOLS_SOURCE, clean_env, run, tools_module, user_messages  # noqa: F401  (fixtures)
from test_cli import Server

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

BLOCK = '<tool name="lookup">{"city": "Oslo"}</tool>'
TOOLS_SOURCE = LOOKUP_TOOLS_SOURCE


@pytest.fixture(autouse=True)
def own_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("STREAMENGINE_LOG", raising=False)
    return tmp_path / "data" / "streamengine" / "logs.db"


# --- 4. stdin and the prompt ----------------------------------------------------------------

def test_an_open_pipe_nobody_writes_to_does_not_hang_a_prompt_given_as_argument(tmp_path):
    """A cron job's stdin: an open pipe, never written, never closed while the command runs."""
    with FakeProvider() as fp, open(tmp_path / "out", "w+b") as out, open(tmp_path / "err", "w+b") as err:
        fp.add_turn(s.text("fine"))
        env = {k: v for k, v in os.environ.items() if k not in CLI_ENV}
        proc = subprocess.Popen([sys.executable, "-m", "streamengine", "chat", "status?", "-m", "m",
                                 "--base-url", fp.base_url, "--no-log"],
                                stdin=subprocess.PIPE, stdout=out, stderr=err, env=env)
        try:
            proc.wait(timeout=30)  # stdin stays open (and empty) the whole time
        finally:
            proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        assert proc.returncode == 0, err.read()
        assert out.read().decode() == "fine\n"
    assert user_messages(fp.requests[0]) == ["status?"]


# --- 5. no abbreviations; a real --no-stream ---------------------------------------------------

@pytest.mark.parametrize("flag", ["--no-stream-opt", "--no"])
def test_flags_are_never_abbreviated(capsys, flag):
    rc, _, err = run(capsys, "chat", "hi", "-m", "m", flag)
    assert rc == 2 and "unrecognized arguments" in err


def test_no_stream_asks_for_the_whole_answer(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("whole"))
        rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--no-stream")
    assert rc == 0, err
    assert out == "whole\n"
    assert not fp.requests[0].json.get("stream") and "stream_options" not in fp.requests[0].json


# --- 6. --tool-mode, and the hint for llama-server without --jinja ---------------------------------

def test_tool_mode_inline_sends_no_tools_field(capsys, tools_module):
    with FakeProvider() as fp:
        fp.add_turn(s.text("no tools needed"))
        rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url,
                         "--tools", f"{tools_module}:lookup", "--tool-mode", "inline")
    assert rc == 0, err
    body = fp.requests[0].json
    assert "tools" not in body and '<tool name="lookup">' in body["messages"][0]["content"]


def test_a_server_without_jinja_gets_a_hint_naming_jinja_and_inline_mode(capsys, tools_module):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(500, {"error": {"code": 500, "message": "tools param requires --jinja flag",
                                                 "type": "server_error"}}))
        rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url,
                         "--tools", f"{tools_module}:lookup", "--tool-mode", "native")
    assert rc == 1
    assert "--jinja" in err and "--tool-mode inline" in err and "retry later" not in err


# --- 7. stdout carries only the final answer ------------------------------------------------------

def test_no_continuations_still_keeps_tool_markup_off_stdout(capsys, tools_module):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Checking. "), s.text(BLOCK), s.text(" done."))
        _rc, out, _err = run(capsys, "chat", "weather?", "-m", "m", "--base-url", fp.base_url,
                             "--tools", f"{tools_module}:lookup", "--max-continuations", "0")
    assert "<tool" not in out and out.strip() == "Checking. done."


def test_a_run_stopped_at_max_continuations_prints_only_its_last_round(capsys, tools_module):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Draft one. "), s.text(BLOCK))
        fp.add_turn(s.text("Draft two. "), s.text(BLOCK.replace("Oslo", "Rome")))
        _rc, out, err = run(capsys, "chat", "weather?", "-m", "m", "--base-url", fp.base_url,
                            "--tools", f"{tools_module}:lookup", "--max-continuations", "1")
    assert out == "Draft two.\n", err
    assert "Draft one." in err  # the draft was shown, on stderr


# --- 8. -o as llm takes it; options that clash with flags ---------------------------------------

def test_o_key_value_as_two_words(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "-o", "temperature", "0.5",
                         "-o", "seed", "7", "-o", "top_p=0.9")
    assert rc == 0, err
    body = fp.requests[0].json
    assert body["temperature"] == 0.5 and body["seed"] == 7 and body["top_p"] == 0.9


@pytest.mark.parametrize("option, flag", [("stream=false", "--no-stream"), ("model=other", "-m/--model")])
def test_options_a_flag_owns_are_refused_naming_the_flag(capsys, option, flag):
    rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", "http://127.0.0.1:9/v1", "-o", option)
    assert rc == 2 and flag in err and "base_url" not in err


def test_an_option_and_its_flag_together_are_refused(capsys):
    rc, _, err = run(capsys, "chat", "hi", "-m", "m", "-o", "temperature", "0.5", "--temperature", "0.2")
    assert rc == 2 and "--temperature" in err and "pass one" in err


# --- 10. a bare prompt, --key, -c, logs ------------------------------------------------------------

def test_a_bare_prompt_runs_chat_and_key_is_the_api_key(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("hello"))
        rc, out, err = run(capsys, "say hi", "-m", "m", "--base-url", fp.base_url, "--key", "sk-abc")
    assert rc == 0, err
    assert out == "hello\n"
    assert fp.requests[0].headers["Authorization"] == "Bearer sk-abc"


def test_continue_resumes_the_last_conversation_and_logs_lists_it(capsys, own_log):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Paris."))
        fp.add_turn(s.text("About 2 million."))
        first = run(capsys, "chat", "Capital of France?", "-m", "m", "--base-url", fp.base_url, "-s", "Be brief.")
        assert first[0] == 0
        rc, out, err = run(capsys, "chat", "-c", "Its population?", "-m", "m", "--base-url", fp.base_url)
    assert rc == 0, err
    assert [m["content"] for m in fp.requests[1].json["messages"]] == ["Be brief.", "Capital of France?", "Paris.",
                                                                      "Its population?"]
    assert own_log.exists()
    rc, out, _ = run(capsys, "logs", "-n", "5", "--json")
    runs = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in runs] == ["Capital of France?", "Its population?"]
    assert runs[0]["conversation"] == runs[1]["conversation"] and runs[1]["answer"] == "About 2 million."
    assert run(capsys, "logs", "--path")[1].strip() == str(own_log)


@pytest.mark.parametrize("switch", ["--no-log", "env"])
def test_the_log_can_be_turned_off(capsys, own_log, monkeypatch, switch):
    if switch == "env":
        monkeypatch.setenv("STREAMENGINE_LOG", "0")
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url,
                         *(["--no-log"] if switch == "--no-log" else []))
    assert rc == 0, err
    assert not own_log.exists()


def test_continue_keeps_the_conversations_model_unless_m_names_another(capsys, own_log, monkeypatch):
    monkeypatch.setenv("STREAMENGINE_MODEL", "the-default")
    with FakeProvider() as fp:
        for answer in ("one", "two", "three"):
            fp.add_turn(s.text(answer))
        assert run(capsys, "chat", "first", "-m", "picked", "--base-url", fp.base_url)[0] == 0
        assert run(capsys, "chat", "-c", "second", "--base-url", fp.base_url)[0] == 0
        assert run(capsys, "chat", "-c", "third", "-m", "other", "--base-url", fp.base_url)[0] == 0
    assert [r.json["model"] for r in fp.requests] == ["picked", "picked", "other"]


def test_continue_without_an_earlier_conversation_says_so(capsys, own_log):
    rc, _, err = run(capsys, "chat", "-c", "more", "-m", "m", "--base-url", "http://127.0.0.1:9/v1")
    assert rc == 2 and "no earlier conversation" in err and str(own_log) in err


# --- 11. truncation and refusals are told -----------------------------------------------------------

def test_an_answer_cut_at_the_token_limit_is_a_warning_and_exit_3(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello"), s.finish("length"))
        rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--max-tokens", "5")
    assert rc == 3
    assert out == "Hello\n"
    assert "cut off" in err and "--max-tokens" in err and "finish reason length" in err


def test_the_json_done_record_carries_each_rounds_finish_reason(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello"), s.finish("length"))
        rc, out, _ = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--json")
    done = json.loads(out.splitlines()[-1])
    assert done["event"] == "done" and done["finish_reasons"] == ["length"]
    assert done["telemetry"]["finish_reasons"] == ["length"] and rc == 3


def test_a_refusal_is_shown_on_stderr_and_is_not_a_whole_answer(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.raw(b'data: {"choices":[{"index":0,"delta":{"refusal":"I can\'t help with that."}}]}\n\n'),
                    s.finish("stop"), s.done())
        rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url)
    assert rc == 3 and out == ""
    assert "the model refused: I can't help with that." in err


# --- 15. serve logs without -v; --expose-errors ---------------------------------------------------------

FAILING_TOOLS = '''
from streamengine.tools import tool

@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    raise RuntimeError("weather service down for " + city)
'''


@pytest.mark.parametrize("expose", [False, True], ids=["redacted", "exposed"])
def test_serve_logs_a_tools_error_with_its_request_id_and_exposes_it_only_when_asked(capsys, tmp_path,
                                                                                      monkeypatch, expose):
    (tmp_path / "failing_tools_mod.py").write_text(FAILING_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    with FakeProvider() as fp:
        fp.add_turn(s.text(BLOCK))
        fp.add_turn(s.text("Sorry."))
        argv = ["serve", "--port", "0", "-m", "m", "--base-url", fp.base_url, "--threads", "2",
                "--tools", "failing_tools_mod:lookup"] + (["--expose-errors"] if expose else [])
        with Server(argv) as srv, requests.Session() as http:
            stream = http.post(srv.url + "v1/chat/stream", timeout=10,
                               json={"messages": [{"role": "user", "content": "weather?"}]}).text
    sys.modules.pop("failing_tools_mod", None)
    result = json.loads(next(line for line in stream.split("\n\n") if "event: tool_result" in line)
                        .split("data: ", 1)[1])
    request_id = re.search(r"request id (\w+)", result["error"]).group(1)
    err = capsys.readouterr().err
    assert "WARNING" in err and f"request {request_id}" in err and "weather service down for Oslo" in err
    assert ("weather service down for Oslo" in result["error"]) is expose


# --- 9. tool notices on a real terminal ---------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a POSIX pseudo-terminal")
def test_tool_notices_on_a_real_terminal_never_split_a_word(tmp_path):
    """stdout and stderr on one pty, as a person runs it: the notice waits for the word's end."""
    (tmp_path / "pty_tools_mod.py").write_text(LOOKUP_TOOLS_SOURCE)
    with FakeProvider() as fp:
        fp.add_turn(s.text("Me"), s.text(BLOCK), s.delay(0.3), s.text("anwhile it rains.\n"))
        fp.add_turn(s.text("Done.\n"))
        primary, secondary = os.openpty()
        env = {k: v for k, v in os.environ.items() if k not in CLI_ENV}
        env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen([sys.executable, "-m", "streamengine", "chat", "weather?", "-m", "m",
                                 "--base-url", fp.base_url, "--tools", "pty_tools_mod:lookup", "--no-log"],
                                stdin=secondary, stdout=secondary, stderr=secondary, env=env)
        os.close(secondary)
        screen = b""
        try:
            proc.wait(timeout=30)
            while True:
                ready, _, _ = select.select([primary], [], [], 0.5)
                if not ready:
                    break
                try:
                    data = os.read(primary, 65536)
                except OSError:  # the terminal closed with the process
                    break
                if not data:
                    break
                screen += data
        finally:
            os.close(primary)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = re.sub(r"\x1b\[[0-9;]*m", "", screen.decode("utf-8", "replace")).replace("\r\n", "\n")
    assert proc.returncode == 0, text
    lines = text.splitlines()
    assert "Meanwhile" in lines, text
    assert any(re.fullmatch(r"\[tool lookup started \+\d+\.\d\ds\]", line) for line in lines), text
    assert "Me [" not in text and "] anwhile" not in text
