"""What the command line shows a person: escape sequences shown, never obeyed; honest warnings; a private log.

The terminal cases run the installed command on a real pseudo-terminal
(``pty_support``); the pipe cases in-process with ``capsys``.  Model text
reaches a pipe byte for byte; tool lines, warnings and errors are messages
for a person and never carry a raw control character, wherever they go.
"""
from __future__ import annotations

import io
import json
import os
import sqlite3
import stat
import sys

import pytest
from cli_support import clean_env, run, tools_module  # noqa: F401  (fixtures)
from pty_support import Terminal, child_env

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: A clipboard write (OSC 52), a link hiding its target (OSC 8), a cleared screen, an 8-bit CSI.
HOSTILE = "A\x1b]52;c;cGF3bmVk\x07 \x1b]8;;https://evil.example/\x07docs\x1b]8;;\x07 \x1b[2J\u009b31m end"
TOOLS_SOURCE = f'''
from streamengine import ToolError
from streamengine.tools import tool

@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    raise ToolError({HOSTILE!r})
'''


# --- chat ----------------------------------------------------------------------------------------

def hostile_turns(fp):
    fp.add_turn(s.text(HOSTILE + ' <tool name="lookup">{"city": "Oslo"}</tool>'))
    fp.add_turn(s.text(HOSTILE))


def test_at_a_terminal_model_and_tool_text_is_shown_not_obeyed(tools_module, tmp_path):
    with FakeProvider() as fp:
        hostile_turns(fp)
        argv = ["chat", "q", "-m", "m", "--base-url", fp.base_url, "--tools", f"{tools_module}:lookup", "--no-log"]
        sys_path = os.pathsep.join([str(tmp_path)] + sys.path)
        with Terminal(argv, env=child_env(NO_COLOR="1", PYTHONPATH=sys_path)) as term:
            rc, _ = term.finish()
    assert rc == 0, term.screen
    screen = term.screen.decode()
    assert "\x1b" not in screen and "\x07" not in screen and "\u009b" not in screen
    assert "A^[]52;c;cGF3bmVk^G ^[]8;;https://evil.example/^Gdocs^[]8;;^G ^[[2J<U+009B>31m end" in screen
    assert "[tool lookup error" in screen and "^[]52;c;" in screen.split("[tool lookup error", 1)[1]


def test_a_piped_answer_stays_byte_exact_and_stderr_lines_are_neutralised(capsys, tools_module):
    with FakeProvider() as fp:
        hostile_turns(fp)
        rc, out, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url,
                           "--tools", f"{tools_module}:lookup", "--no-log")
    assert rc == 0, err
    assert out == HOSTILE + "\n"  # the model's text, as it wrote it: a pipe is data
    tool_line = next(line for line in err.splitlines() if line.startswith("[tool lookup error"))
    assert "\x1b" not in tool_line and "^[]52;c;cGF3bmVk^G" in tool_line
    # the drafts on stderr are answer text too: a pipe gets them as written
    assert HOSTILE in err


@pytest.mark.parametrize("at_a_terminal", [True, False], ids=["terminal", "pipe"])
def test_json_events_at_a_terminal_escape_what_a_terminal_would_obey(capsys, monkeypatch, at_a_terminal):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    if at_a_terminal:
        monkeypatch.setattr(sys, "stdout", Tty())
    with FakeProvider() as fp:
        fp.add_turn(s.text("x\u009b2J\u202e"))
        rc, piped, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log", "--json")
    assert rc == 0, err
    shown = sys.stdout.getvalue() if at_a_terminal else piped
    tokens = [record["text"] for record in map(json.loads, shown.splitlines()) if record["event"] == "token"]
    assert tokens == ["x\u009b2J\u202e"]
    assert ("\u009b" in shown) is not at_a_terminal


def test_an_error_body_with_escapes_is_one_visible_line(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": "bad \x1b]52;c;eA==\x07 request"}}))
        rc, _, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log")
    assert rc == 1
    assert "\x1b" not in err and "^[]52;c;eA==^G" in err


# --- warnings that were missing ------------------------------------------------------------------

def test_a_failover_from_a_mistyped_model_warns_on_stderr(capsys):
    with FakeProvider() as fp:
        fp.respond_with(lambda request: [s.http_error(404, {"error": {"message": "model gpt-4o-mnii not found"}})]
                        if request["model"] == "gpt-4o-mnii" else [s.text("an answer")])
        rc, out, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "gpt-4o-mnii", "-m", "gpt-4o",
                           "--no-log")
    assert rc == 0, err
    assert out == "an answer\n"
    assert "warning: model gpt-4o-mnii failed (LlmHttpError: " in err and "404" in err
    assert "model gpt-4o-mnii not found" in err and "; answered by gpt-4o" in err


def test_no_failover_no_warning(capsys):
    with FakeProvider() as fp:
        fp.add_turn(s.text("an answer"))
        rc, _, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "a", "-m", "b", "--no-log")
    assert rc == 0 and err == ""


def test_running_out_of_revision_rounds_warns_and_exits_3(capsys, tools_module):
    with FakeProvider() as fp:
        fp.add_turn(s.text('First draft <tool name="lookup">{"city": "Oslo"}</tool>'))
        fp.add_turn(s.text('Still drafting <tool name="lookup">{"city": "Bergen"}</tool>'))
        rc, out, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "m", "--no-log",
                           "--tools", f"{tools_module}:lookup", "--max-continuations", "1")
    assert rc == 3, err
    assert out == "Still drafting\n"
    assert "warning: the answer is an unfinished draft" in err and "--max-continuations" in err


# --- the run log ---------------------------------------------------------------------------------

@pytest.fixture
def data_home(tmp_path, monkeypatch):
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("STREAMENGINE_LOG", raising=False)
    return home


def one_chat(capsys, fp, *extra):
    fp.add_turn(s.text("an answer"))
    return run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "m", *extra)


def test_the_log_is_private_to_its_owner(capsys, data_home):
    with FakeProvider() as fp:
        rc, _, err = one_chat(capsys, fp)
    assert rc == 0, err
    assert stat.S_IMODE((data_home / "streamengine").stat().st_mode) == 0o700
    assert stat.S_IMODE((data_home / "streamengine" / "logs.db").stat().st_mode) == 0o600


def test_a_log_an_older_version_left_readable_is_made_private(capsys, data_home):
    folder = data_home / "streamengine"
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)
    sqlite3.connect(str(folder / "logs.db")).close()
    os.chmod(folder / "logs.db", 0o644)
    rc, _, err = run(capsys, "logs")
    assert rc == 0, err
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "logs.db").stat().st_mode) == 0o600


def damaged(home):
    (home / "streamengine").mkdir(parents=True)
    (home / "streamengine" / "logs.db").write_bytes(b"not a database, not at all" * 100)
    return "is damaged", "mv "


def a_folder_in_its_place(home):
    (home / "streamengine" / "logs.db").mkdir(parents=True)
    return "cannot open the run log", "XDG_DATA_HOME"


def a_file_in_place_of_its_folder(home):
    home.mkdir(parents=True)
    (home / "streamengine").write_text("oops")
    return "cannot open the run log", "not a directory"


@pytest.mark.parametrize("command", [["logs"], ["chat", "-c", "again"]], ids=["logs", "chat-c"])
@pytest.mark.parametrize("spoil", [damaged, a_folder_in_its_place, a_file_in_place_of_its_folder])
def test_a_log_that_cannot_be_read_is_one_error_line_not_a_traceback(capsys, data_home, command, spoil):
    needles = spoil(data_home)
    rc, _, err = run(capsys, *command, "--base-url", "http://127.0.0.1:9/v1", "-m", "m") if command[0] == "chat" \
        else run(capsys, *command)
    assert rc == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("streamengine: error: ") and all(n in err for n in needles)


@pytest.mark.parametrize("command", [["logs"], ["chat", "-c", "again"]], ids=["logs", "chat-c"])
def test_a_locked_log_is_one_error_line_saying_so(capsys, data_home, command):
    """The command waits a few seconds for the lock, as it would for a second ``streamengine`` writing."""
    with FakeProvider() as fp:
        one_chat(capsys, fp)
    holder = sqlite3.connect(str(data_home / "streamengine" / "logs.db"), isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        rc, _, err = run(capsys, *command, "--base-url", "http://127.0.0.1:9/v1", "-m", "m") \
            if command[0] == "chat" else run(capsys, *command)
    finally:
        holder.close()
    assert rc == 1, err
    assert "Traceback" not in err and "is locked by another program" in err


def test_logs_shows_logged_model_text_safely_at_a_terminal_and_as_logged_into_a_pipe(capsys, data_home,
                                                                                    monkeypatch):
    with FakeProvider() as fp:
        fp.add_turn(s.text(HOSTILE))
        rc, _, err = run(capsys, "chat", "q", "--base-url", fp.base_url, "-m", "m")
    assert rc == 0, err
    rc, out, _ = run(capsys, "logs")
    assert rc == 0 and HOSTILE in out

    class Tty(io.StringIO):
        def isatty(self):
            return True

    screen = Tty()
    monkeypatch.setattr(sys, "stdout", screen)
    for argv in (["logs"], ["logs", "--json"]):
        assert run(capsys, *argv)[0] == 0
    assert "\x1b" not in screen.getvalue() and "\u009b" not in screen.getvalue()
    assert "A^[]52;c;cGF3bmVk^G" in screen.getvalue()


def test_plain_chat_with_a_damaged_log_answers_and_warns(capsys, data_home):
    damaged(data_home)
    with FakeProvider() as fp:
        rc, out, err = one_chat(capsys, fp)
    assert rc == 0 and out == "an answer\n"
    assert "warning: the answer was not recorded" in err and "is damaged" in err
