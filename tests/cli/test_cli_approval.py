"""Nothing with a side effect runs from the command line without a person's yes.

``chat`` asks at a terminal (a real pseudo-terminal here: the installed
command in its own session, Ctrl-C typed as a person types it), refuses
without one, and runs everything with ``--yes``; ``serve`` refuses unless
``--approve all``; a harness scenario says per call.  Every tool here
writes a line to a file when it runs, so "it ran" is what the tool did, not
what the CLI said.
"""
from __future__ import annotations

import io
import json
import sys
import threading

import pytest
import requests
from cli_support import clean_env, main, run  # noqa: F401  (fixture)
from pty_support import Terminal, child_env

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

TOOLS_SOURCE = '''
import os
from streamengine.tools import tool

@tool(side_effects=True)
def create_branch(repo_path: str, branch_name: str) -> str:
    """Create a git branch: it writes to the repository."""
    with open(os.environ["SE_TEST_RAN"], "a", encoding="utf-8") as ran:
        ran.write(branch_name + "\\n")
    return "created " + branch_name
'''
ARGS = {"repo_path": "/srv/repo", "branch_name": "x"}
CALL = f'<tool name="create_branch">{json.dumps(ARGS)}</tool>'
PROMPT = b'run create_branch {"branch_name": "x", "repo_path": "/srv/repo"}? [y/N] '


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory holding the tools module (``se_approval_tools``); ``ran`` lists what the tool did."""
    (tmp_path / "se_approval_tools.py").write_text(TOOLS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SE_TEST_RAN", str(tmp_path / "ran.txt"))
    yield tmp_path
    sys.modules.pop("se_approval_tools", None)


def ran(workdir):
    path = workdir / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


def branch_turns(fp, call=CALL):
    fp.add_turn(s.text("Creating it. " + call))
    fp.add_turn(s.text("Done."))


def told_the_model(fp):
    """What the continuation told the model about the call."""
    return fp.requests[1].json["messages"][-1]["content"]


def chat_at_a_terminal(workdir, fp, *extra):
    argv = ["chat", "make branch x", "-m", "m", "--base-url", fp.base_url, "--tools", "se_approval_tools:create_branch",
            "--no-log", *extra]
    return Terminal(argv, env=child_env(SE_TEST_RAN=str(workdir / "ran.txt"), NO_COLOR="1"), cwd=str(workdir),
                    stdout_pipe=True)


# --- chat at a terminal -------------------------------------------------------------------------

def test_at_a_terminal_chat_asks_and_y_runs_the_tool(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp) as term:
            term.wait_for(PROMPT)
            assert ran(workdir) == []  # asked first
            term.type(b"y\n")
            rc, out = term.finish()
    assert rc == 0, term.screen
    assert ran(workdir) == ["x"]
    assert out == b"Done.\n"
    assert "created x" in told_the_model(fp)


@pytest.mark.parametrize("answer", [b"n\n", b"\n", b"sure\n"], ids=["n", "enter", "anything-but-yes"])
def test_at_a_terminal_anything_but_yes_refuses_and_the_model_reads_the_refusal(workdir, answer):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp) as term:
            term.wait_for(PROMPT)
            term.type(answer)
            rc, out = term.finish()
    assert rc == 0, term.screen
    assert ran(workdir) == []
    assert out == b"Done.\n"
    told = told_the_model(fp)
    assert "not run" in told and "approved" in told
    assert b"[tool create_branch not run: not approved]" in term.screen


def test_ctrl_c_at_the_prompt_refuses_and_the_run_goes_on_to_its_answer(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp) as term:
            term.wait_for(PROMPT)
            term.type(b"\x03")  # the terminal turns it into SIGINT for the command
            rc, out = term.finish()
    assert rc == 0, term.screen
    assert ran(workdir) == []
    assert out == b"Done.\n"
    assert len(fp.requests) == 2 and "not run" in told_the_model(fp)
    assert b"interrupted" not in term.screen


def test_the_question_follows_the_text_it_is_about(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp) as term:
            screen = term.wait_for(PROMPT)
            term.type(b"n\n")
            term.finish()
    assert b"Creating it." in screen and screen.index(b"Creating it.") < screen.index(PROMPT)


def test_eof_at_the_prompt_refuses(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp) as term:
            term.wait_for(PROMPT)
            term.type(b"\x04")  # Ctrl-D: end of input
            rc, out = term.finish()
    assert rc == 0, term.screen
    assert ran(workdir) == [] and out == b"Done.\n"


def test_the_prompt_shows_the_arguments_in_full_with_control_characters_made_visible(workdir):
    name = "x\u009b2J\u202e" + "long" * 100  # an 8-bit CSI, a bidi override, and no cut
    call = f'<tool name="create_branch">{json.dumps({"repo_path": "/srv/repo", "branch_name": name})}</tool>'
    with FakeProvider() as fp:
        branch_turns(fp, call)
        with chat_at_a_terminal(workdir, fp) as term:
            screen = term.wait_for(b"? [y/N] ")
            term.type(b"n\n")
            rc, _ = term.finish()
    assert rc == 0, term.screen
    shown = ('"branch_name": "x<U+009B>2J<U+202E>' + "long" * 100 + '", "repo_path": "/srv/repo"}? [y/N] ').encode()
    assert shown in screen
    assert "\u009b".encode() not in screen and "\u202e".encode() not in screen


def test_a_conversation_at_the_terminal_asks_and_goes_on(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        fp.add_turn(s.text("Anything else?"))
        argv = ["chat", "-m", "m", "--base-url", fp.base_url, "--tools", "se_approval_tools:create_branch", "--no-log"]
        with Terminal(argv, env=child_env(SE_TEST_RAN=str(workdir / "ran.txt"), NO_COLOR="1"),
                      cwd=str(workdir)) as term:
            term.wait_for(b"> ")
            term.type(b"make branch x\n")
            term.wait_for(PROMPT)
            term.type(b"y\n")
            term.wait_for(b"Done.")
            term.type(b"thanks\n")
            term.wait_for(b"Anything else?")
            term.wait_for(b"> ")
            term.type(b"\x04")
            rc, _ = term.finish()
    assert rc == 0, term.screen
    assert ran(workdir) == ["x"]
    assert [m["content"] for m in fp.requests[2].json["messages"] if m["role"] == "user"] == ["make branch x", "thanks"]


def test_approve_never_refuses_at_a_terminal_without_asking(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp, "--approve", "never") as term:
            rc, out = term.finish()
    assert rc == 0, term.screen
    assert b"[y/N]" not in term.screen and ran(workdir) == []
    assert b"refused create_branch" in term.screen and out == b"Done.\n"


def test_yes_at_a_terminal_runs_without_asking(workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        with chat_at_a_terminal(workdir, fp, "-y") as term:
            rc, _out = term.finish()
    assert rc == 0, term.screen
    assert b"[y/N]" not in term.screen and ran(workdir) == ["x"]


# --- chat without a terminal ----------------------------------------------------------------------

def test_with_piped_stdin_chat_refuses_and_says_so_on_stderr(capsys, workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        rc, out, err = run(capsys, "chat", "make branch x", "-m", "m", "--base-url", fp.base_url,
                           "--tools", "se_approval_tools:create_branch", "--no-log")
    assert rc == 0, err
    assert ran(workdir) == []
    assert out == "Done.\n"
    assert "refused create_branch" in err and "--yes" in err
    told = told_the_model(fp)
    assert "not run" in told and "approved" in told


def test_a_refusal_is_on_stderr_with_json_output_too(capsys, workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        rc, out, err = run(capsys, "chat", "make branch x", "-m", "m", "--base-url", fp.base_url,
                           "--tools", "se_approval_tools:create_branch", "--no-log", "--json")
    assert rc == 0, err
    assert "refused create_branch" in err
    results = [json.loads(line) for line in out.splitlines() if '"tool_result"' in line]
    assert [r["ok"] for r in results] == [False]


@pytest.mark.parametrize("flag", [["--yes"], ["-y"], ["--approve", "all"]])
def test_yes_runs_side_effect_tools_without_a_terminal(capsys, workdir, flag):
    with FakeProvider() as fp:
        branch_turns(fp)
        rc, _out, err = run(capsys, "chat", "make branch x", "-m", "m", "--base-url", fp.base_url,
                            "--tools", "se_approval_tools:create_branch", "--no-log", *flag)
    assert rc == 0, err
    assert ran(workdir) == ["x"]
    assert "created x" in told_the_model(fp)
    assert "refused" not in err


@pytest.mark.parametrize("argv, needle", [
    (["--approve", "ask"], "--approve ask needs a terminal"),
    (["--yes", "--approve", "never"], "-y/--yes and --approve never"),
    (["--approve", "maybe"], "invalid choice"),
])
def test_approval_flags_that_cannot_hold_are_usage_errors(capsys, argv, needle):
    rc, _, err = run(capsys, "chat", "hi", "-m", "m", "--base-url", "http://127.0.0.1:9/v1", "--no-log", *argv)
    assert rc == 2 and needle in err


class Tty(io.StringIO):
    """A terminal: what is typed at it, what it shows."""

    def isatty(self):
        return True


@pytest.mark.parametrize("stdin_tty, stderr_tty, asked", [(True, True, True), (True, False, False),
                                                           (False, True, False)],
                         ids=["both-terminals", "stderr-to-a-file", "stdin-from-a-pipe"])
def test_chat_asks_only_when_stdin_and_stderr_are_both_terminals(capsys, monkeypatch, workdir, stdin_tty,
                                                                   stderr_tty, asked):
    """stdin a terminal but stderr not (2> file): nobody sees a question, so nothing is asked."""
    monkeypatch.setattr(sys, "stdin", (Tty if stdin_tty else io.StringIO)("y\n"))
    err = (Tty if stderr_tty else io.StringIO)()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("NO_COLOR", "1")
    with FakeProvider() as fp:
        branch_turns(fp)
        rc = main(["chat", "make branch x", "-m", "m", "--base-url", fp.base_url,
                   "--tools", "se_approval_tools:create_branch", "--no-log"])
    assert rc == 0, err.getvalue()
    assert (PROMPT.decode() in err.getvalue()) is asked
    assert ran(workdir) == (["x"] if asked else [])
    assert ("not run" in told_the_model(fp)) is not asked


# --- serve ---------------------------------------------------------------------------------------

def serve_one_stream(capsys, fp, *extra):
    """``streamengine serve`` with the tools module; one browser-less stream, then stop."""
    stop, replies, threads = threading.Event(), [], []

    def ask(url):
        try:
            replies.append(requests.post(url.rstrip("/") + "/v1/chat/stream", timeout=30,
                                         json={"messages": [{"role": "user", "content": "make branch x"}]}).text)
        finally:
            stop.set()

    def ready(url):
        threads.append(threading.Thread(target=ask, args=(url,)))
        threads[-1].start()

    rc = main(["serve", "--port", "0", "--base-url", fp.base_url, "-m", "m",
               "--tools", "se_approval_tools:create_branch", *extra], stop=stop, ready=ready)
    for thread in threads:
        thread.join(timeout=30)
    out, err = capsys.readouterr()
    return rc, out, err, replies


def test_serve_refuses_side_effect_calls_by_default_and_says_so_at_start(capsys, workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        rc, _out, err, replies = serve_one_stream(capsys, fp)
    assert rc == 0, err
    assert ran(workdir) == []
    assert "create_branch" in err and "refused" in err and "--approve all" in err and "--approve ask" in err
    assert "not run" in told_the_model(fp)
    assert "Done." in replies[0]


def test_serve_approve_all_runs_them_with_a_warning_at_start(capsys, workdir):
    with FakeProvider() as fp:
        branch_turns(fp)
        rc, _out, err, _replies = serve_one_stream(capsys, fp, "--approve", "all")
    assert rc == 0, err
    assert ran(workdir) == ["x"]
    assert "WARNING" in err and "--approve all" in err and "create_branch" in err
    assert "created x" in told_the_model(fp)


def test_serve_asks_only_with_a_run_log(capsys):
    """The page's answer reaches a held call through the run log (tests/cli/test_cli_serve_runs.py has it asking)."""
    rc, _, err = run(capsys, "serve", "--approve", "ask", "-m", "m")
    assert rc == 2 and "--approve ask needs --runs URL" in err


# --- harness -------------------------------------------------------------------------------------

def scenario(tmp_path, approve_in_turn, expect):
    turn = [{"text": '<tool name="send_email">{"to": "ana@example.com"}</tool>'},
            {"text": '<tool name="delete_all">{}</tool>'}]
    if approve_in_turn is not None:
        turn.append({"approve": approve_in_turn})
    path = tmp_path / "approve.json"
    path.write_text(json.dumps({
        "name": "approval per call",
        "turns": [turn, [{"text": "ok"}]],
        "tools": [{"fake": "echo", "name": "send_email", "params": {"to": "string"}, "side_effects": True,
                   "result": "sent"},
                  {"fake": "echo", "name": "delete_all", "side_effects": True, "result": "deleted"},
                  {"fake": "echo", "name": "unused", "side_effects": True}],
        "expect": expect,
    }))
    return path


def test_a_harness_scenario_approves_per_call_and_refuses_unnamed_calls(capsys, tmp_path):
    path = scenario(tmp_path, {"send_email": True, "delete_all": False},
                    {"telemetry": {"tools_ok": 1, "refused": 1}, "request_contains": {"1": ["sent"]}})
    rc, out, err = run(capsys, "harness", str(path))
    assert rc == 0, out + err
    path = scenario(tmp_path, {"send_email": True},
                    {"telemetry": {"tools_ok": 1, "refused": 1}, "request_contains": {"1": ["sent", "not run"]}})
    rc, out, err = run(capsys, "harness", str(path))
    assert rc == 0, out + err
    path = scenario(tmp_path, None, {"telemetry": {"tools_ok": 0, "refused": 2}})
    rc, out, err = run(capsys, "harness", str(path))
    assert rc == 0, out + err


@pytest.mark.parametrize("approve, needle", [
    ([], "an object of tool name -> true or false"),
    ({"send_email": "yes"}, "$.turns[0][2].approve.send_email: must be true or false"),
])
def test_a_bad_approve_step_names_the_json_path(capsys, tmp_path, approve, needle):
    rc, out, _err = run(capsys, "harness", str(scenario(tmp_path, approve, {})))
    assert rc == 1 and needle in out
