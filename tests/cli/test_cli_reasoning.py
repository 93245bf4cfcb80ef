"""A thinking model on the command line: its reasoning dimmed on stderr at a terminal, in ``--json``, in the log.

The terminal cases run the installed command on a real pseudo-terminal
(``pty_support``) against a FakeProvider that thinks before it answers; the
pipe, ``--json`` and log cases run in-process with ``capsys``.
"""
from __future__ import annotations

import json
import sqlite3

import pytest
from cli_support import clean_env, run  # noqa: F401  (fixtures)
from pty_support import Terminal, child_env

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

DIM = b"\x1b[2m"
#: Reasoning with a clipboard write (OSC 52) in it: a terminal must show it, never obey it.
THOUGHT = "Let me think\x1b]52;c;cGF3bmVk\x07 about Oslo."


def thinking_turn(fp):
    fp.add_turn(s.reasoning("Let me think"), s.reasoning("\x1b]52;c;cGF3bmVk\x07 about Oslo."),
                s.text("It is sunny."))


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("STREAMENGINE_LOG", raising=False)
    return home


def test_at_a_terminal_reasoning_is_dimmed_on_its_own_line_before_the_answer():
    with FakeProvider() as fp:
        thinking_turn(fp)
        argv = ["chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log"]
        with Terminal(argv, env=child_env(TERM="xterm")) as term:
            rc, _ = term.finish()
    assert rc == 0, term.screen
    screen = term.screen.replace(b"\r\n", b"\n")
    assert DIM + b"Let me think" in screen
    assert b"^[]52;c;cGF3bmVk^G about Oslo." in screen and b"\x1b]52" not in screen
    thought_ends = screen.rindex(b"about Oslo.")
    answer = screen.index(b"It is sunny.")
    assert thought_ends < answer and b"\n" in screen[thought_ends:answer]


def test_no_reasoning_hides_it_and_a_piped_stdout_never_gets_it():
    with FakeProvider() as fp:
        thinking_turn(fp)
        thinking_turn(fp)
        base = ["chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log"]
        with Terminal(base + ["--no-reasoning"], env=child_env(TERM="xterm")) as hidden:
            rc, _ = hidden.finish()
        assert rc == 0, hidden.screen
        with Terminal(base, env=child_env(TERM="xterm"), stdout_pipe=True) as piped:
            piped_rc, stdout = piped.finish()
    assert b"Let me think" not in hidden.screen and b"It is sunny." in hidden.screen
    assert piped_rc == 0 and stdout == b"It is sunny.\n"
    assert b"Let me think" in piped.screen  # stderr is still the terminal


def test_a_pipe_for_stderr_gets_no_reasoning(capsys):
    with FakeProvider() as fp:
        thinking_turn(fp)
        rc, out, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log")
    assert rc == 0, err
    assert out == "It is sunny.\n" and "think" not in err


def test_json_has_a_reasoning_record_per_piece_and_done_keeps_each_round(capsys):
    with FakeProvider() as fp:
        thinking_turn(fp)
        rc, out, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url, "--no-log", "--json")
    assert rc == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    thoughts = [(r["text"], r["round"]) for r in records if r["event"] == "reasoning"]
    assert thoughts == [("Let me think", 1), ("\x1b]52;c;cGF3bmVk\x07 about Oslo.", 1)]
    names = [r["event"] for r in records]
    assert names.index("reasoning") < names.index("token")
    done = records[-1]
    assert done["event"] == "done" and done["reasoning_rounds"] == [THOUGHT] and done["answer"] == "It is sunny."


def test_the_log_keeps_the_reasoning_beside_the_answer_and_logs_shows_it(capsys, data_home):
    with FakeProvider() as fp:
        thinking_turn(fp)
        assert run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url)[0] == 0
        fp.add_turn(s.text("Still sunny."))
        assert run(capsys, "chat", "-c", "again?", "--base-url", fp.base_url)[0] == 0
        resent = fp.requests[-1].json["messages"]
    assert "think" not in json.dumps(resent)  # -c sends the answer back, never the reasoning
    rc, out, _ = run(capsys, "logs", "--json")
    runs = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [r["reasoning"] for r in runs] == [THOUGHT, None]
    rc, out, _ = run(capsys, "logs")
    assert rc == 0 and f"[reasoning]\n{THOUGHT}\n[/reasoning]\n\nIt is sunny." in out


def test_a_log_made_before_reasoning_was_kept_gains_the_column(capsys, data_home):
    folder = data_home / "streamengine"
    folder.mkdir(parents=True, mode=0o700)
    with sqlite3.connect(str(folder / "logs.db")) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation TEXT NOT NULL, "
                   "at REAL NOT NULL, model TEXT, system TEXT, prompt TEXT NOT NULL, answer TEXT NOT NULL, "
                   "stop_reason TEXT, finish_reason TEXT)")
        db.execute("INSERT INTO runs (conversation, at, prompt, answer) VALUES ('c1', 0, 'old q', 'old a')")
    db.close()
    with FakeProvider() as fp:
        thinking_turn(fp)
        rc, _, err = run(capsys, "chat", "q", "-m", "m", "--base-url", fp.base_url)
    assert rc == 0 and "warning" not in err, err
    rc, out, _ = run(capsys, "logs", "--json")
    assert [json.loads(line)["reasoning"] for line in out.splitlines()] == [None, THOUGHT]
