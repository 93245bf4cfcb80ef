"""``streamengine chat`` and who says yes to a side-effect tool call from the command line.

Who says yes to a side-effect tool call from the command line: the person at the terminal, a flag, or nobody.

A tool marked ``side_effects=True`` (and an MCP tool whose server's
annotations are not trusted, or that is not read-only) writes somewhere.
The engine runs such a call only when its ``approve`` hook says yes; this
module is that hook for ``chat``:

* ``ask`` (the default when stdin and stderr are terminals): one question
  per call on the terminal, the arguments shown in full and made safe to
  show; only ``y``/``yes`` runs it.  Enter, anything else, Ctrl-C or
  Ctrl-D at the question is a no, and the run goes on;
* ``all`` (``-y``/``--yes``): every call runs;
* ``never`` (the default without a terminal: a pipe, cron, CI): every call
  is refused and the refusal is said on stderr.

A refused call is not run; the model is told so and answers without it.

``streamengine chat``: one answer, a piped prompt, or a conversation at the terminal.

What goes where, so ``streamengine chat ... > answer.txt`` holds the answer:

* stdout: the final answer only, without tool markup.  When a revision round
  can follow (tools are offered) and stdout is a file or a pipe, the answer
  is written once the run knows it is final; otherwise it streams.
* stderr: everything else -- tool activity, round markers, error lines, and
  (when stdout is not a terminal) each round's text as it streams.
* ``--json``: every event as one JSON object per line on stdout, unchanged
  (a thinking model's ``reasoning`` events too).
* a thinking model's reasoning: dimmed on stderr while it thinks, when stderr
  is a terminal (``--no-reasoning`` hides it); never on stdout, never in a
  pipe.  The run log keeps it beside the answer.

On a terminal you watch every round as it is written, the draft included:
the revised answer follows a ``[round 2: revised answer]`` line on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import select
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, TextIO

from .._logs import for_terminal, is_terminal
from .._messages import LLM_WARNING, PROG, StopReason, as_message
from .._parts import Part, TextPart
from .._validation import one_line
from .attach import attachments
from .build import UsageError, build_engine, close_engine
from .log import ConversationLogError, RunLog, default_log, logging_enabled
from .output import EventPrinter, JsonEventPrinter, strip_markup, use_color, write, write_error

if TYPE_CHECKING:
    from .._engine.result import EngineResult
    from .._engine.run import StreamingEngine
    from .._messages import ToolCall
    from .main import _Hooks

APPROVE_MODES = ("ask", "all", "never")
#: What a refusal note says about the way to let such calls run.
_HOW_TO_ALLOW = "-y/--yes lets side-effect tools run"
#: A refusal note shows this much of the call (the question, which decides, shows it all).
_NOTE_CHARS = 200


def add_approval_flags(chat: argparse.ArgumentParser) -> None:
    g = chat.add_argument_group("tools with side effects")
    g.add_argument("--approve", choices=APPROVE_MODES,
                   help="before each call of a tool with side effects: ask at the terminal, run all, or refuse "
                        "(default: ask when stdin and stderr are a terminal, else never)")
    g.add_argument("-y", "--yes", action="store_true", help="run every side-effect tool call without asking "
                                                            "(= --approve all)")


def approval_mode(args: argparse.Namespace, stdin: TextIO, err: TextIO) -> str:
    """``ask``, ``all`` or ``never``, from the flags and whether a person can be asked."""
    chosen: Optional[str] = getattr(args, "approve", None)
    if getattr(args, "yes", False):
        if chosen not in (None, "all"):
            raise UsageError(f"-y/--yes and --approve {chosen} contradict each other; pass one of them")
        return "all"
    at_terminal = is_terminal(stdin) and is_terminal(err)
    if chosen == "ask" and not at_terminal:
        raise UsageError("--approve ask needs a terminal on stdin and stderr to ask on; without one pass "
                         "-y/--yes to run side-effect tools, or --approve never")
    if chosen is not None:
        return chosen
    return "ask" if at_terminal else "never"


def shown_call(call: ToolCall) -> str:
    """``NAME {arguments}`` in full, one line, every control character visible (never obeyed)."""
    try:
        arguments = json.dumps(json.loads(call.arguments or "{}"), ensure_ascii=False)
    except (ValueError, RecursionError):  # shown as the model wrote them
        arguments = call.arguments
    return for_terminal(f"{call.name} {arguments}")


class Approval:
    """The engine's ``approve`` hook for one ``chat`` command.

    ``before_asking`` (set per answer) ends the printer's current line, so a
    question or a refusal note starts on a line of its own.
    """

    def __init__(self, mode: str, stdin: TextIO, err: TextIO, explicit: bool = False) -> None:
        self.mode, self.stdin, self.err = mode, stdin, err
        self.explicit = explicit  # --approve never was asked for (else: no terminal to ask on)
        self.before_asking: Optional[Callable[[], None]] = None
        self._asking, self._interrupted = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def ctrl_c_answers(self) -> Iterator[None]:
        """While a run goes: Ctrl-C at a question is a no to it, elsewhere it stops the run as before.

        The engine asks on a thread of its own, and only the main thread gets
        the signal: so the main thread's handler ends the question instead.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigint(signum: int, frame: Any) -> None:
            if self._asking.is_set():
                self._interrupted.set()
            else:
                signal.default_int_handler(signum, frame)

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def __call__(self, call: ToolCall) -> bool:
        if self.mode == "all":
            return True
        if self.before_asking is not None:
            self.before_asking()
        if self.mode == "ask":
            return self._ask(call)
        why = "--approve never" if self.explicit else "no terminal to ask on"
        shown = shown_call(call)
        shown = shown if len(shown) <= _NOTE_CHARS else shown[:_NOTE_CHARS - 3] + "..."
        write(self.err, f"{PROG}: refused {shown}: it has side effects ({why}); {_HOW_TO_ALLOW}\n")
        return False

    def _ask(self, call: ToolCall) -> bool:
        """One question; a yes only from ``y``/``yes``.  Ctrl-C or Ctrl-D here is a no, not the end of the run."""
        self._interrupted.clear()
        self._asking.set()  # before the question shows: a Ctrl-C typed at it is its answer
        try:
            write(self.err, f"run {shown_call(call)}? [y/N] ")
            answer = self._typed_line()
        except KeyboardInterrupt:
            answer = None
        finally:
            self._asking.clear()
        if answer is None:  # Ctrl-C: the terminal echoed ^C; the run goes on without the call
            write(self.err, "\n")
            return False
        if not answer:  # end of input
            write(self.err, "\n")
            return False
        return answer.strip().lower() in ("y", "yes")

    def _typed_line(self) -> Optional[str]:
        """The line typed; None once Ctrl-C came (:meth:`ctrl_c_answers`), looked at every 50 ms."""
        try:
            self.stdin.fileno()
        except (OSError, ValueError):  # no file to wait on (an in-memory stdin): its line is there already
            return self.stdin.readline()
        while not self._interrupted.is_set():
            if select.select([self.stdin], [], [], 0.05)[0]:
                return self.stdin.readline()
        return None


def approval_for(args: argparse.Namespace, stdin: TextIO, err: TextIO) -> Approval:
    return Approval(approval_mode(args, stdin, err), stdin, err, explicit=getattr(args, "approve", None) == "never")


#: How long a piped stdin may stay silent before ``chat "PROMPT"`` goes on without it.
STDIN_WAIT_S = 0.5


def _prompt(args: argparse.Namespace, stdin: TextIO) -> Optional[str]:
    """The question: piped text first, then the argument (as ``llm`` combines them).

    ``None`` means "no prompt and a person at the keyboard": the interactive mode.
    With no argument (or ``-``) stdin *is* the prompt and is read to its end.
    With an argument, stdin is extra context, read only when it is not a
    terminal *and* has data (or its end) within :data:`STDIN_WAIT_S`: a cron
    job or a CI step whose stdin is an open pipe nobody writes to must not
    hang, and ``select`` is the one check that tells "nothing yet" apart
    without reading.
    """
    if args.prompt is None and is_terminal(stdin):
        return None
    if args.prompt is None or args.prompt == "-":
        text = stdin.read()
    else:
        piped = stdin.read() if not is_terminal(stdin) and _readable_soon(stdin) else ""
        text = piped.rstrip("\n") + "\n\n" + args.prompt if piped.strip() else args.prompt
    if not text.strip():
        raise UsageError('the prompt is empty; pass it as an argument (streamengine chat "...") or on stdin')
    return text


def _readable_soon(stream: TextIO) -> bool:
    """Whether reading ``stream`` will not block: data or its end within STDIN_WAIT_S.

    A stream without a file descriptor (a StringIO) never blocks.  Where
    ``select`` cannot watch it (a Windows pipe) stdin is not read: a missing
    context is better than a hung job.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return True
    try:
        ready, _, _ = select.select([fd], [], [], STDIN_WAIT_S)
    except (OSError, ValueError):
        return False
    return bool(ready)


def cmd_chat(args: argparse.Namespace, hooks: _Hooks) -> int:
    stdin, out, err = sys.stdin, sys.stdout, sys.stderr
    approval = approval_for(args, stdin, err)
    prompt = _prompt(args, stdin)
    parts = attachments(args)  # read before the engine is built: a bad path is a usage error at once
    log = Conversation.open(args, err)
    engine = build_engine(args, approve=approval)
    chat = _Chat(engine, args, out, err, log, approval)
    try:
        system = log.system = args.system or log.system  # a continued conversation keeps its system message
        history: List[Dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        history += log.history
        if prompt is None:
            return _conversation(chat, history, parts)
        status, _ = chat.answer(history + [user_message(prompt, parts)])
        return status
    finally:
        close_engine(engine)


def user_message(text: str, parts: Sequence[Part]) -> Dict[str, Any]:
    """The user's message: the text, then the attachments (``-a``), as content parts when there are any."""
    return {"role": "user", "content": [TextPart(text), *parts] if parts else text}


def _conversation(chat: _Chat, history: List[Dict[str, Any]], parts: Sequence[Part] = ()) -> int:
    """Read a line, answer it with the whole conversation so far; Ctrl-D (or 'exit') ends it.

    The attachments go with the first message, and stay in the conversation.
    """
    try:
        importlib.import_module("readline")  # line editing and history for input()
    except ImportError:  # pragma: no cover - Windows
        pass
    out, err = chat.out, chat.err
    write(err, f"{PROG} chat with {', '.join(chat.engine.config.models)}: type a message, "
               f"'!multi' for several lines (then '!end'), Ctrl-D or 'exit' to end\n")
    while True:
        try:
            line = _read_line(out, err)
        except EOFError:
            write(err, "\n")
            return 0
        if line.strip() in ("exit", "quit"):
            return 0
        if line.split()[:1] == ["!multi"]:
            try:
                line = _read_lines_until(_end_marker(line), out, err)
            except EOFError:
                write(err, "\n")
                return 0
        if not line.strip():
            continue
        history.append(user_message(line, parts))
        try:
            _, answer = chat.answer(history)
        except KeyboardInterrupt:  # stops this answer, not the conversation
            write(err, "\n[interrupted]\n")
            answer = None
        if answer:
            history.append({"role": "assistant", "content": answer})
            parts = ()  # sent: they are in the conversation now
        else:
            history.pop()  # a failed turn is not part of the conversation


def _end_marker(line: str) -> str:
    """``!multi`` ends at ``!end``; ``!multi WORD`` at ``!end WORD`` (so a pasted text may hold ``!end``), as in llm."""
    return " ".join(["!end", *line.split()[1:2]])


def _read_lines_until(marker: str, out: TextIO, err: TextIO) -> str:
    """The lines typed or pasted up to ``marker``, as one message."""
    lines: List[str] = []
    while True:
        line = _read_line(out, err, prompt="... ")
        if line.strip() == marker:
            return "\n".join(lines)
        lines.append(line)


def _read_line(out: TextIO, err: TextIO, prompt: str = "> ") -> str:
    """One typed line.  readline must know the prompt to redraw it, but input() writes it to
    stdout: so only when stdout is the terminal; otherwise the prompt goes to stderr."""
    if is_terminal(out):
        return input(prompt)
    write(err, prompt)
    return input()


class _Chat:
    """One ``chat`` command's engine, streams, run log and approval: what every answer needs."""

    def __init__(self, engine: StreamingEngine, args: argparse.Namespace, out: TextIO, err: TextIO, log: Conversation,
                 approval: Approval) -> None:
        self.engine, self.args, self.out, self.err, self.log, self.approval = engine, args, out, err, log, approval

    def answer(self, messages: List[Dict[str, Any]]) -> tuple[int, Optional[str]]:
        """Run once and print it; returns the exit status and the final answer (None on failure)."""
        args, out, err, engine = self.args, self.out, self.err, self.engine
        t0 = time.monotonic()
        models = engine.config.models
        tools = bool(engine.registry.names)
        # Text shown live may be revised (a later round) or taken back (failover after tokens):
        # then a pipe or file gets the final answer once it is known, and drafts go to stderr.
        revisable = (tools and engine.config.max_continuations > 0) \
            or (engine.config.failover_after_tokens and len(models) > 1)
        live = args.json or is_terminal(out) or not revisable
        if args.json:
            printer: Any = JsonEventPrinter(out, t0=t0)
            self.approval.before_asking = None
        else:
            printer = EventPrinter(out if live else err, err, color=use_color(out if live else err, err), t0=t0,
                                   hide_markup=tools, models=models,
                                   reasoning=is_terminal(err) and not getattr(args, "no_reasoning", False))
            self.approval.before_asking = printer.end_line
        events = engine.run(messages)
        try:
            with self.approval.ctrl_c_answers():
                for event in events:
                    printer.handle(event, time.monotonic() - t0)
        finally:
            events.close()  # on Ctrl-C: cancels the provider stream and the tools
        return self._finish(printer, live, messages)

    def _finish(self, printer: Any, live: bool, messages: List[Dict[str, Any]]) -> tuple[int, Optional[str]]:
        args, out, err = self.args, self.out, self.err
        result = printer.result
        failed = result is None or result.error is not None or bool(printer.errors)
        answer = final_answer(result)
        if not args.json:
            if not live and answer:
                write(out, answer + "\n")
            summary = printer.summary()
            if summary is not None and (result.telemetry.tools_started or result.telemetry.rounds > 1):
                printer.note(summary)
        elif printer.errors:
            write_error(err, printer.errors[-1], self.engine.config.models)
        if failed:
            return 1, None
        if not args.json:
            _warn_failover(result, self.engine.config.models, err)
        self.log.record(as_message(messages[-1]).content, answer, result)  # the text: attachments are not kept
        return (EXIT_NOT_WHOLE if _not_whole(result, err, args.json) else 0), answer


#: The exit status of an answer that is not whole: cut off (``length``, ``content_filter``), refused,
#: or a draft left when the revision rounds ran out (``max_continuations_reached``).
EXIT_NOT_WHOLE = 3


def _not_whole(result: EngineResult, err: TextIO, quiet: bool) -> bool:
    """Say (on stderr) why the answer is not whole; True when it is not."""
    cut = result.cut_off
    if not quiet and cut is not None:
        write(err, f"{PROG}: warning: {CUT_OFF_ADVICE.get(cut, cut)} (finish reason {cut})\n")
    if not quiet and result.refusal:
        write(err, f"{PROG}: warning: the model refused: {for_terminal(one_line(result.refusal))}\n")
    unfinished = result.telemetry.stop_reason == StopReason.MAX_CONTINUATIONS_REACHED
    if not quiet and unfinished:
        write(err, f"{PROG}: warning: the answer is an unfinished draft: the model called tools in its last "
                   f"allowed round (--max-continuations {max(0, result.telemetry.rounds - 1)}) and never read "
                   f"their results; raise --max-continuations\n")
    return cut is not None or bool(result.refusal) or unfinished


def _warn_failover(result: EngineResult, models: Sequence[str], err: TextIO) -> None:
    """Say on stderr that the answer came from another model than the first: a mistyped name must not pass unseen.

    Each failed attempt is one line of ``telemetry.failed_attempts``
    (``MODEL: ErrorType: message``), shown with the model that answered.
    """
    telemetry = result.telemetry
    if not telemetry.failovers:
        return
    used = telemetry.model_used
    failures = [line for line in telemetry.failed_attempts if not line.startswith(f"{used}: ")]
    if failures:
        said = "; ".join("model {} failed ({})".format(*line.split(": ", 1)) for line in dict.fromkeys(failures))
    else:
        said = f"{telemetry.failovers} failover(s) in earlier rounds"
    write(err, f"{PROG}: warning: {for_terminal(said)}; answered by {for_terminal(str(used))}\n")


#: What to tell a person whose answer was cut off, by finish reason.
CUT_OFF_ADVICE: Dict[str, str] = {
    StopReason.LENGTH: "the answer was cut off at the token limit; raise --max-tokens",
    StopReason.CONTENT_FILTER: "the provider's content filter cut the answer off",
}


def final_answer(result: Optional[EngineResult]) -> str:
    """What stdout promises: the last round's answer, without tool markup or the engine's warning.

    A run that stopped at ``max_continuations_reached`` carries every draft
    joined in ``answer``; only the last round is an answer to the question.
    """
    if result is None or not result.answer or result.answer.startswith(LLM_WARNING):
        return ""
    text = result.answer
    if result.telemetry.stop_reason == StopReason.MAX_CONTINUATIONS_REACHED and result.rounds:
        text = result.rounds[-1]
    return strip_markup(text).strip()


def _joined_reasoning(result: EngineResult) -> Optional[str]:
    """Every round's reasoning, a blank line between rounds; None without any."""
    return "\n\n".join(text for text in result.reasoning_rounds if text) or None


class Conversation:
    """The run log for this command: the history ``-c`` continues, and where each answer is recorded."""

    def __init__(self, log: Optional[RunLog], conversation: Optional[str], system: Optional[str],
                 history: List[Dict[str, str]], model: Optional[str], err: TextIO) -> None:
        self.log, self.conversation, self.system, self.history = log, conversation, system, history
        self.model, self.err = model, err

    @classmethod
    def open(cls, args: argparse.Namespace, err: TextIO) -> Conversation:
        model = (args.model or [None])[0]
        if not logging_enabled(os.environ, getattr(args, "no_log", False)):
            if getattr(args, "continue_", False):
                raise UsageError("-c/--continue needs the run log, which --no-log or STREAMENGINE_LOG=0 "
                                 "turned off")
            return cls(None, None, None, [], model, err)
        log = default_log()
        if not getattr(args, "continue_", False):
            return cls(log, None, None, [], model, err)
        conversation = log.last_conversation()
        if conversation is None:
            raise UsageError(f"-c/--continue: there is no earlier conversation in {log.path}")
        system, history = log.messages(conversation)
        if not args.model:  # as llm does: -c keeps the conversation's model unless -m names another
            model = log.last_model(conversation)
            args.model = [model] if model else args.model
        return cls(log, conversation, system, history, model, err)

    def record(self, prompt: str, answer: str, result: EngineResult) -> None:
        if self.log is None:
            return
        reasons = result.finish_reasons
        try:
            self.conversation = self.log.record(
                self.conversation, model=result.telemetry.model_used or self.model, system=self.system,
                prompt=prompt, answer=answer, stop_reason=result.telemetry.stop_reason,
                reasoning=_joined_reasoning(result),
                finish_reason=reasons[-1] if reasons else None)
        except ConversationLogError as exc:  # the answer was given; a log that fails is only a warning
            write(self.err, f"{PROG}: warning: the answer was not recorded: {exc}\n")
