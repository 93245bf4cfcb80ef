"""``streamengine chat`` as people use it: pipes, flags after the command, a conversation, clean stdout.

In-process ``main(argv)`` against FakeProvider over real HTTP; stdin is
replaced by a StringIO (a pipe) or a StringIO that says it is a terminal.
"""
from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys

import pytest
from cli_support import CLI_ENV, LOOKUP_TOOLS_SOURCE, clean_env, run, tools_module, user_messages  # noqa: F401  (fixtures)

from streamengine import __version__
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

BLOCK = '<tool name="lookup">{"city": "Oslo"}</tool>'
TOOLS_SOURCE = LOOKUP_TOOLS_SOURCE


class TtyInput(io.StringIO):
    """Keyboard input: a terminal, with these lines typed."""

    def isatty(self):
        return True


# --- the prompt -------------------------------------------------------------------------------

def test_the_prompt_comes_from_a_pipe(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("summarize this\nplease\n"))
    with FakeProvider() as fp:
        fp.add_turn(s.text("done"))
        rc, out, err = run(capsys, "chat", "-m", "m", "--base-url", fp.base_url)
    assert rc == 0, err
    assert out == "done\n"
    assert user_messages(fp.requests[0]) == ["summarize this\nplease\n"]


@pytest.mark.parametrize("prompt, piped, sent", [
    ("-", "from stdin", "from stdin"),  # a dash reads stdin instead of sending a dash
    ("Summarize this", "NOTES: moved to 3pm\n", "NOTES: moved to 3pm\n\nSummarize this"),  # llm's order
], ids=["dash", "piped-and-prompt"])
def test_stdin_is_the_prompt_or_comes_before_it(capsys, monkeypatch, prompt, piped, sent):
    monkeypatch.setattr(sys, "stdin", io.StringIO(piped))
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, _, err = run(capsys, "chat", prompt, "-m", "m", "--base-url", fp.base_url)
    assert rc == 0, err
    assert user_messages(fp.requests[0]) == [sent]


def test_options_after_the_command_and_short_flags(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, _out, err = run(capsys, "chat", "hi", "-vv", "-m", "primary", "-m", "backup", "-s", "Be brief.",
                            "--base-url", fp.base_url)
    assert rc == 0, err
    body = fp.requests[0].json
    assert body["model"] == "primary"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert "DEBUG" in err and "POST " in err  # -vv after the command turned logging on


def test_version(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"streamengine {__version__}"


def test_sampling_flags_and_free_options_reach_the_request(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("ok"))
        rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--temperature", "0.2",
                         "--max-tokens", "64", "-o", "top_p=0.9", "--option", 'stop=["END"]', "-o", "user=alice",
                         "--no-stream-options")
    assert rc == 0, err
    body = fp.requests[0].json
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64
    assert body["top_p"] == 0.9 and body["stop"] == ["END"] and body["user"] == "alice"
    assert "stream_options" not in body


# --- stdout is the answer -------------------------------------------------------------------------

def tool_turns(fp):
    fp.add_turn(s.text("Checking. "), s.text(BLOCK), s.text(" one moment."))
    fp.add_turn(s.text("It is sunny in Oslo."))


def test_redirected_stdout_gets_only_the_final_answer(capsys, tools_module):
    with FakeProvider() as fp:
        tool_turns(fp)
        rc, out, err = run(capsys, "chat", "weather?", "-m", "m", "--base-url", fp.base_url,
                           "--tools", f"{tools_module}:lookup")
    assert rc == 0, err
    assert out == "It is sunny in Oslo.\n"
    assert "Checking." in err and "one moment." in err and "[tool lookup ok" in err and "<tool" not in err + out


class TtyOutput(io.StringIO):
    """A screen: stdout at a terminal."""

    def isatty(self):
        return True


def test_a_terminal_watches_every_round_live_without_markup(capsys, tools_module, monkeypatch):
    screen = TtyOutput()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setenv("NO_COLOR", "1")
    with FakeProvider() as fp:
        tool_turns(fp)
        rc, _, err = run(capsys, "chat", "weather?", "-m", "m", "--base-url", fp.base_url,
                         "--tools", f"{tools_module}:lookup")
    assert rc == 0, err
    assert screen.getvalue() == "Checking. one moment.\nIt is sunny in Oslo.\n"
    assert "[round 2: revised answer" in err


def test_json_output_is_unchanged_by_the_answer_rule(capsys, tools_module):
    with FakeProvider() as fp:
        tool_turns(fp)
        rc, out, _ = run(capsys, "chat", "weather?", "-m", "m", "--base-url", fp.base_url,
                         "--tools", f"{tools_module}:lookup", "--json")
    assert rc == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert any(r["event"] == "token" and BLOCK in r["text"] for r in records)
    assert records[-1]["answer"] == "It is sunny in Oslo."


# --- a conversation at the terminal ------------------------------------------------------------

def test_a_conversation_keeps_its_history_until_ctrl_d(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", TtyInput("first question\n\nsecond question\n"))
    with FakeProvider() as fp:
        fp.add_turn(s.text("first answer"))
        fp.add_turn(s.text("second answer"))
        rc, out, err = run(capsys, "chat", "-m", "m", "-s", "Be brief.", "--base-url", fp.base_url)
    assert rc == 0, err
    assert out == "first answer\nsecond answer\n"
    assert "Ctrl-D" in err and err.count("> ") == 4  # three lines typed (one blank), then end of input
    assert fp.requests[1].json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]


def test_multi_reads_a_pasted_text_as_one_message_up_to_its_end_marker(capsys, monkeypatch):
    pasted = "def f():\n    return 1\n\n!end\nmore of the paste"
    monkeypatch.setattr(sys, "stdin", TtyInput(f"!multi\nfirst line\nsecond line\n!end\n"
                                               f"!multi code\n{pasted}\n!end code\n"))
    with FakeProvider() as fp:
        fp.add_turn(s.text("one"))
        fp.add_turn(s.text("two"))
        rc, out, err = run(capsys, "chat", "-m", "m", "--base-url", fp.base_url)
    assert rc == 0, err
    assert out == "one\ntwo\n" and "'!multi'" in err
    asked = [m["content"] for m in fp.requests[1].json["messages"] if m["role"] == "user"]
    assert asked == ["first line\nsecond line", pasted]


def test_a_failed_turn_is_left_out_of_the_conversation(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", TtyInput("one\ntwo\nexit\nnever sent\n"))
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(500, {"error": {"message": "boom"}}))
        fp.add_turn(s.text("fine"))
        rc, out, err = run(capsys, "chat", "-m", "m", "--base-url", fp.base_url)
    assert rc == 0
    assert "boom" in err and out == "fine\n"
    assert user_messages(fp.requests[1]) == ["two"]
    assert len(fp.requests) == 2


# --- timeouts ---------------------------------------------------------------------------------------

def test_a_bad_timeout_variable_is_a_usage_error_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("STREAMENGINE_IDLE_TIMEOUT", "soon")
    rc, _, err = run(capsys, "chat", "hi", "-m", "m")
    assert rc == 2 and "STREAMENGINE_IDLE_TIMEOUT" in err and "'soon'" in err


def test_the_idle_timeout_flag_governs_a_stalled_stream(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("partial"), s.stall())
        rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", fp.base_url, "--idle-timeout", "0.3")
    assert rc == 1
    assert out == "partial\n"
    assert "idle timeout" in err and "0.3s" in err


# --- errors: the cause first ------------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused_is_one_short_line_with_the_cause_first(capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    rc, out, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", url)
    assert rc == 1 and out == ""
    assert err == f"streamengine: error: could not connect to {url}: connection refused \u2014 is the server running?\n"


def test_several_failed_models_get_a_line_each(capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    rc, _, err = run(capsys, "chat", "hi", "-m", "alpha", "-m", "beta", "--base-url", url)
    assert rc == 1
    lines = err.splitlines()
    assert lines[0] == "streamengine: error: all 2 models failed:"
    assert re.fullmatch(r"  alpha: could not connect to .*: connection refused .*", lines[1])
    assert re.fullmatch(r"  beta: could not connect to .*: connection refused .*", lines[2])
    assert len(lines) == 3


def test_verbose_shows_what_is_underneath(capsys):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", url, "-v")
    assert rc == 1
    assert "streamengine: error: could not connect" in err
    assert "MaxRetryError" in err and "ECONNREFUSED" in err  # what urllib3 said, from the log
    assert "DEBUG" not in err  # one -v after the command counts once: info, not debug


def test_the_anthropic_provider_flag_speaks_the_messages_api(capsys):
    with FakeProvider(wire="anthropic") as fp:
        fp.add_turn(s.text("bonjour"))
        rc, out, err = run(capsys, "chat", "hi", "-m", "claude", "--provider", "anthropic", "--api-key", "sk-ant",
                           "--base-url", fp.base_url, "--no-log")
    assert rc == 0, err
    assert out == "bonjour\n"
    request = fp.requests[0]
    assert request.path == "/v1/messages" and request.headers["x-api-key"] == "sk-ant"
    assert request.json["model"] == "claude" and "hi" in json.dumps(request.json["messages"])


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a POSIX pseudo-terminal")
def test_a_conversation_on_a_real_pseudo_terminal():
    """The installed command with stdin on a pty: input() reads typed lines, Ctrl-D ends it."""
    with FakeProvider() as fp:
        fp.add_turn(s.text("hello back"))
        fp.add_turn(s.text("still here"))
        primary, secondary = os.openpty()
        env = {k: v for k, v in os.environ.items() if k not in CLI_ENV}
        proc = subprocess.Popen([sys.executable, "-m", "streamengine", "chat", "-m", "m", "--base-url",
                                 fp.base_url], stdin=secondary, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env)
        os.close(secondary)
        try:
            os.write(primary, b"hello\n")
            assert fp.wait_for_requests(1, timeout=20)
            os.write(primary, b"are you there?\n")
            assert fp.wait_for_requests(2, timeout=20)
            os.write(primary, b"\x04")  # Ctrl-D at the start of a line: end of input
            out, err = proc.communicate(timeout=20)
        finally:
            os.close(primary)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert out.decode() == "hello back\nstill here\n"
    assert [m["content"] for m in fp.requests[1].json["messages"]] == ["hello", "hello back", "are you there?"]


# --- engine events the CLI must show plainly -------------------------------------------------

def test_failover_after_tokens_prints_a_marker_and_succeeds(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with FakeProvider() as fp:
        fp.respond_with(lambda request: [s.text("half an ans"), s.drop()] if request["model"] == "flaky"
                        else [s.text("a whole answer")])
        rc, out, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "flaky", "-m", "steady",
                           "--failover-after-tokens")
    assert rc == 0
    assert "[round 1 restarted: model flaky failed mid-answer" in err and "discard the text above" in err
    assert out == "a whole answer\n"  # the void draft went to stderr, not into the answer
    assert [r.json["model"] for r in fp.requests] == ["flaky", "steady"]


def test_a_problem_the_run_went_on_past_is_a_warning_not_a_failure(capsys, monkeypatch, tools_module):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with FakeProvider() as fp:
        fp.add_turn(s.text('Checking <tool name="lookup">{"city": </tool> now.'))
        fp.add_turn(s.text("Sorry, I wrote that call badly."))
        rc, out, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "m",
                           "--tools", f"{tools_module}:lookup")
    assert rc == 0, err
    assert out.strip() == "Sorry, I wrote that call badly."
    assert "error:" not in err
    told = fp.requests[1].json["messages"][-1]["content"]
    assert "was not run" in told and "not valid JSON" in told
