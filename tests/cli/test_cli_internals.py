"""The command line's private pieces, tested directly: the event printer, the markup filter, error lines,
terminal escaping, how flags and environment become engine settings, and how ``--tools`` specs load.

This module imports ``streamengine._cli``, ``streamengine._logs`` and the tools loader on purpose: each
test pins a rule of one of these algorithms (where a tool line breaks a word, which split block is
removed, which cause comes first, how each control character is shown, which timeout wins) on inputs a
whole command run cannot pick (exact timings, a given token split, a given error text) or on what it
cannot see (the engine's settings, an import error's chained cause).  The commands themselves are tested
through the installed ``streamengine`` in the other CLI modules and in tests/tools/test_tool_loading.py.
"""
from __future__ import annotations

import io
import sys
import uuid

import pytest

from streamengine import (
    LLM_WARNING,
    ConfigError,
    DoneEvent,
    EngineResult,
    ErrorEvent,
    Telemetry,
    TokenEvent,
    ToolCall,
    ToolResultEvent,
    ToolStartEvent,
)
from streamengine._cli import output as cli_output
from streamengine._cli.build import NO_CAP_S, build_engine, close_engine
from streamengine._cli.main import EventPrinter, build_parser
from streamengine._logs import for_terminal
from streamengine.tools import ToolResult, load_tools

BLOCK = '<tool name="lookup">{"city": "Oslo"}</tool>'


# --- the printer -----------------------------------------------------------------------------

class Tty(io.StringIO):
    def isatty(self):
        return True


def done_event(error=None):
    return DoneEvent(EngineResult(answer="", rounds=(), tool_results=(), telemetry=Telemetry(), error=error))


def test_printer_on_a_terminal_puts_dimmed_tool_lines_on_their_own_line_between_words():
    out = Tty()
    printer = EventPrinter(out, out, color=True)
    call = ToolCall(id="c1", name="lookup", arguments="{}")
    printer.handle(TokenEvent("Me"), 0.1)
    printer.handle(ToolStartEvent(call), 0.42)  # mid-word: waits for the word's end
    printer.handle(TokenEvent("anwhile it"), 0.5)
    printer.handle(ToolResultEvent(ToolResult("c1", "lookup", True, "x", duration_s=0.51)), 0.6)
    printer.handle(TokenEvent(" rains.\n"), 0.7)
    assert out.getvalue() == ("Meanwhile\n\x1b[2m[tool lookup started +0.42s]\x1b[0m\nit\n"
                              "\x1b[2m[tool lookup ok 0.51s]\x1b[0m\nrains.\n")


def test_printer_keeps_model_text_that_only_looks_like_the_engine_warning():
    out, info = io.StringIO(), io.StringIO()
    printer = EventPrinter(out, info)
    printer.handle(TokenEvent(LLM_WARNING + "just kidding"), 0.0)
    printer.handle(TokenEvent(" more"), 0.1)
    printer.handle(done_event(), 0.2)
    assert out.getvalue() == LLM_WARNING + "just kidding more\n"
    printer = EventPrinter(out := io.StringIO(), info := io.StringIO())
    printer.handle(TokenEvent(LLM_WARNING + "boom"), 0.0)
    printer.handle(ErrorEvent("boom"), 0.0)
    printer.handle(done_event("boom"), 0.0)
    assert out.getvalue() == "" and info.getvalue() == "streamengine: error: boom\n"


@pytest.mark.parametrize("tokens, shown", [
    (["Checking. ", BLOCK, " Still talking."], "Checking. Still talking."),
    (["Checking. " + BLOCK + " Still", " talking."], "Checking. Still talking."),
    (["weather ", '<tool name="a"/>', ". Then"], "weather. Then"),
    (["a <tool> is a word", " here"], "a <tool> is a word here"),  # not a block: kept
    (["multi\n", '<tool name="lookup">\n{"city": "Oslo"}\n</tool>', "\nline"], "multi\n\nline"),
])
def test_markup_filter_removes_blocks_split_across_tokens(tokens, shown):
    markup = cli_output.MarkupFilter()
    assert "".join(markup.feed(t) for t in tokens) + markup.flush() == shown


@pytest.mark.parametrize("message, models, lines", [
    ("all 2 model attempt(s) failed: m: LlmHttpError: provider answered HTTP 503; retry; "
     "m: LlmConnectionError: could not connect to u: refused", ["m"], ["could not connect to u: refused"]),
    ("all 2 model attempt(s) failed: a: LlmTimeoutError: idle; b: LlmHttpError: HTTP 500: x; y", ["a", "b"],
     ["all 2 models failed:", "a: idle", "b: HTTP 500: x; y"]),
    ("the model's stream failed after a partial answer: all 1 model attempt(s) failed: a: LlmStreamError: cut",
     ["a"], ["the model's stream failed after a partial answer: cut"]),
    ("plain message\nwith a newline", ["a"], ["plain message with a newline"]),
    ("all 1 model attempt(s) failed: unknown: X: y", ["a"], ["all 1 model attempt(s) failed: unknown: X: y"]),
])
def test_error_lines_put_the_cause_first(message, models, lines):
    assert cli_output.error_lines(message, models) == lines


# --- terminal escaping --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("\x1b]52;c;cGF3bmVk\x07", "^[]52;c;cGF3bmVk^G"),
    ("\x1b[2J", "^[[2J"),
    ("a\u009b31mb", "a<U+009B>31mb"),
    ("abc\u202edef", "abc<U+202E>def"),
    ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
    ("line\r\nend", "line\nend"),
    ("over\rwrite", "over^Mwrite"),
    ("\x7f\x00", "^?^@"),
    ("Zürich, 東京, emoji 🙂", "Zürich, 東京, emoji 🙂"),
])
def test_for_terminal_makes_each_control_character_visible(text, shown):
    assert for_terminal(text) == shown


def test_an_escape_sequence_cut_between_tokens_is_still_neutralised():
    pieces = ["A\x1b", "]52;c;eA==", "\x07"]
    assert "\x1b" not in "".join(for_terminal(p) for p in pieces)


# --- flags and environment to engine settings ---

def engine_for(*argv, environ=None):
    args = build_parser().parse_args(["chat", "hi", "-m", "m", "--base-url", "http://127.0.0.1:9/v1", *argv])
    return build_engine(args, environ or {})


@pytest.mark.parametrize("argv, environ, idle, cap, connect", [
    ((), {}, 30.0, 600.0, 10.0),
    (("--timeout", "0"), {}, 30.0, NO_CAP_S, 10.0),
    (("--idle-timeout", "90", "--timeout", "1200", "--connect-timeout", "3"), {}, 90.0, 1200.0, 3.0),
    ((), {"STREAMENGINE_IDLE_TIMEOUT": "45", "STREAMENGINE_TIMEOUT": "0", "STREAMENGINE_CONNECT_TIMEOUT": "2.5"},
     45.0, NO_CAP_S, 2.5),
    (("--timeout", "100"), {"STREAMENGINE_TIMEOUT": "0"}, 30.0, 100.0, 10.0),
])
def test_timeouts_from_flags_and_environment(argv, environ, idle, cap, connect):
    engine = engine_for(*argv, environ=environ)
    try:
        assert engine.config.idle_timeout == idle
        assert engine.config.completion_timeout == cap
        assert engine.client.connect_timeout == connect
    finally:
        close_engine(engine)




# --- loading --tools specs -------------------------------------------------------------------

def test_a_tools_file_that_fails_to_import_keeps_its_error_as_the_cause(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader adds the file's folder
    bad = tmp_path / f"broken_{uuid.uuid4().hex[:8]}.py"
    bad.write_text("raise RuntimeError('no\\nway')\n")
    with pytest.raises(ConfigError, match=r"cannot import '.*broken_.*\.py': RuntimeError: no way$") as info:
        load_tools(f"{bad}:TOOLS")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert bad.stem not in sys.modules
