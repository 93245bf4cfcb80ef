"""``streamengine chat``: one answer, a piped prompt, or a conversation at the terminal.

What goes where, so ``streamengine chat ... > answer.txt`` holds the answer:

* stdout: the final answer only, without tool markup.  When a revision round
  can follow (tools are offered) and stdout is a file or a pipe, the answer
  is written once the run knows it is final; otherwise it streams.
* stderr: everything else -- tool activity, round markers, error lines, and
  (when stdout is not a terminal) each round's text as it streams.
* ``--json``: every event as one JSON object per line on stdout, unchanged.

On a terminal you watch every round as it is written, the draft included:
the revised answer follows a ``[round 2: revised answer]`` line on stderr.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any, Dict, List, Optional, TextIO

from .build import UsageError, build_engine, close_engine
from .output import LLM_WARNING, EventPrinter, JsonEventPrinter, strip_markup, use_color, write, write_error

__all__ = ["cmd_chat", "is_terminal"]


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return False


def _prompt(args: argparse.Namespace, stdin: TextIO) -> Optional[str]:
    """The question: the argument, or stdin when it is piped or the argument is ``-``.

    ``None`` means "no prompt and a person at the keyboard": the interactive mode.
    """
    if args.prompt is not None and args.prompt != "-":
        text = args.prompt
    elif args.prompt is None and is_terminal(stdin):
        return None
    else:
        text = stdin.read()
    if not text.strip():
        raise UsageError('the prompt is empty; pass it as an argument (streamengine chat "...") or on stdin')
    return text


def cmd_chat(args: argparse.Namespace, hooks: Any) -> int:
    stdin, out, err = sys.stdin, sys.stdout, sys.stderr
    prompt = _prompt(args, stdin)
    engine = build_engine(args)
    try:
        history: List[Dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
        if prompt is None:
            return _conversation(engine, history, args, out, err)
        status, _ = _answer(engine, history + [{"role": "user", "content": prompt}], args, out, err)
        return status
    finally:
        close_engine(engine)


def _conversation(engine: Any, history: List[Dict[str, str]], args: argparse.Namespace,
                  out: TextIO, err: TextIO) -> int:
    """Read a line, answer it with the whole conversation so far; Ctrl-D (or 'exit') ends it."""
    try:
        importlib.import_module("readline")  # line editing and history for input()
    except ImportError:  # pragma: no cover - Windows
        pass
    write(err, f"streamengine chat with {', '.join(engine.config.models)}: type a message, "
               f"Ctrl-D or 'exit' to end\n")
    while True:
        try:
            line = _read_line(out, err)
        except EOFError:
            write(err, "\n")
            return 0
        if line.strip() in ("exit", "quit"):
            return 0
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            _, answer = _answer(engine, history, args, out, err)
        except KeyboardInterrupt:  # stops this answer, not the conversation
            write(err, "\n[interrupted]\n")
            answer = None
        if answer:
            history.append({"role": "assistant", "content": answer})
        else:
            history.pop()  # a failed turn is not part of the conversation


def _read_line(out: TextIO, err: TextIO) -> str:
    """One typed line.  readline must know the prompt to redraw it, but input() writes it to
    stdout: so only when stdout is the terminal; otherwise the prompt goes to stderr."""
    if is_terminal(out):
        return input("> ")
    write(err, "> ")
    return input()


def _answer(engine: Any, messages: List[Dict[str, str]], args: argparse.Namespace,
            out: TextIO, err: TextIO) -> "tuple[int, Optional[str]]":
    """Run once and print it; returns the exit status and the final answer (None on failure)."""
    t0 = time.monotonic()
    models = engine.config.models
    # Text shown live may be revised (a later round) or taken back (failover after tokens):
    # then a pipe or file gets the final answer once it is known, and drafts go to stderr.
    revisable = (bool(engine.registry.names) and engine.config.max_continuations > 0) \
        or (engine.config.failover_after_tokens and len(models) > 1)
    live = args.json or is_terminal(out) or not revisable
    if args.json:
        printer: Any = JsonEventPrinter(out, t0=t0)
    else:
        printer = EventPrinter(out if live else err, err, color=use_color(out if live else err, err), t0=t0,
                               hide_markup=revisable, models=models)
    events = engine.run(messages)
    try:
        for event in events:
            printer.handle(event, time.monotonic() - t0)
    finally:
        events.close()  # on Ctrl-C: cancels the provider stream and the tools
    result = printer.result
    failed = result is None or result.error is not None or bool(printer.errors)
    answer = _final_answer(result)
    if not args.json:
        if not live and answer:
            write(out, answer + "\n")
        summary = printer.summary()
        if summary is not None and (result.telemetry.tools_started or result.telemetry.rounds > 1):
            printer.note(summary)
    elif printer.errors:
        write_error(err, printer.errors[-1], models)
    return (1 if failed else 0), (None if failed else answer)


def _final_answer(result: Any) -> str:
    if result is None or not result.answer or result.answer.startswith(LLM_WARNING):
        return ""
    return strip_markup(result.answer).strip()
