"""How a run looks in a terminal: the answer, tool activity, errors a person can act on.

Three streams, three jobs.  ``EventPrinter`` writes text and tool lines;
``MarkupFilter`` takes the model's inline ``<tool ...>...</tool>`` blocks out of
the text a person reads (tool lines say the same thing in words);
``error_lines`` turns an engine error into its cause first, without the
failover list's bookkeeping when there was only one model.

Control characters (escape sequences: a clipboard write, a hidden link, a
cleared screen) are shown, never obeyed (:func:`streamengine._logs.for_terminal`):
in the answer text only where it reaches a terminal (a pipe or file gets
the model's text byte for byte), in every tool line, warning and error
always (they are messages for a person, wherever stderr goes).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from .._engine.events import (
    DoneEvent,
    ErrorEvent,
    Event,
    ReasoningEvent,
    RefusalEvent,
    ResetEvent,
    RoundEvent,
    TokenEvent,
    ToolResultEvent,
    ToolStartEvent,
)
from .._logs import for_terminal, is_terminal
from .._messages import LLM_WARNING, PROG
from .._validation import one_line as _one_line

_DIM, _BOLD, _RED, _RESET = "\x1b[2m", "\x1b[1m", "\x1b[31m", "\x1b[0m"
BOLD, RESET = _BOLD, _RESET


def write(stream: TextIO, text: str) -> None:
    """Write, replacing what the terminal's encoding cannot show instead of crashing mid-answer."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "replace").decode(encoding, "replace"))
    stream.flush()



def write_error(stream: TextIO, message: str, models: Sequence[str] = ()) -> None:
    """``streamengine: error: CAUSE`` (plus one indented line per model when several failed)."""
    write_error_lines(stream, error_lines(message, models))


def write_error_lines(stream: TextIO, lines: Sequence[str]) -> None:
    """The first line after ``streamengine: error:``, the others indented; control characters made visible."""
    text = f"{PROG}: error: {lines[0]}\n" + "".join(f"  {line}\n" for line in lines[1:])
    write(stream, for_terminal(text))


_ALL_FAILED = re.compile(r"(?:^|(?<= ))all \d+ model attempt\(s\) failed: ")


def error_lines(message: str, models: Sequence[str] = ()) -> List[str]:
    """The cause first: one line, or a line per model when several models failed.

    The engine reports "all N model attempt(s) failed: MODEL: Type: cause; ...".
    With one model that prefix only hides the cause; with several, each
    model's last cause gets its own line.  Anything else is shown as is.
    """
    prefix = _ALL_FAILED.search(message)
    attempts = _split_attempts(message[prefix.start():], models) if prefix else []
    if prefix is None or not attempts:
        return [_one_line(message)]
    lines = attempt_lines(attempts)
    lines[0] = _one_line(message[:prefix.start()]) + (" " if prefix.start() else "") + lines[0]
    return lines


def attempt_lines(attempts: Sequence[Tuple[str, str]]) -> List[str]:
    """Each model's last cause; a single model's cause alone, without "all 1 model(s)"."""
    last: Dict[str, str] = {}
    for model, cause in attempts:
        last.pop(model, None)
        last[model] = _one_line(cause)
    if len(last) == 1:
        return [next(iter(last.values()))]
    return [f"all {len(last)} models failed:"] + [f"{model}: {cause}" for model, cause in last.items()]


def _split_attempts(message: str, models: Sequence[str]) -> List[Tuple[str, str]]:
    prefix = _ALL_FAILED.match(message)
    if prefix is None or not models:
        return []
    rest = message[prefix.end():]
    names = "|".join(re.escape(m) for m in sorted(set(models), key=len, reverse=True))
    starts = list(re.finditer(rf"(?:^|; )({names}): [A-Za-z_][\w.]*: ", rest))
    if not starts or starts[0].start() != 0:
        return []
    ends = [m.start() for m in starts[1:]] + [len(rest)]
    return [(m.group(1), rest[m.end():end]) for m, end in zip(starts, ends)]


#: A complete inline tool block, as the engine releases it (whole, in one token).
_BLOCK = re.compile(r"[ \t]*<tool\s[^>]*?(?:/>|>.*?</tool>)", re.S)
_TRAILING_SPACE = re.compile(r"[ \t]+$")
_WORD_GAP = re.compile(r"[ \t]*\n|[ \t]+")


def strip_markup(text: str) -> str:
    """``text`` without inline tool blocks (and the space before each)."""
    return _BLOCK.sub("", text)


class MarkupFilter:
    """Removes tool blocks from streamed text; a space before a block may arrive a token earlier.

    Trailing spaces are held until the next text shows whether a block
    follows them, so "Checking. <tool ...>...</tool> Done." reads "Checking. Done."
    """

    def __init__(self) -> None:
        self._space = ""

    def feed(self, text: str) -> str:
        text = strip_markup(self._space + text)
        trailing = _TRAILING_SPACE.search(text)
        self._space = trailing.group(0) if trailing else ""
        return text[:trailing.start()] if trailing else text

    def flush(self) -> str:
        space, self._space = self._space, ""
        return space


def use_color(*streams: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return all(callable(getattr(s, "isatty", None)) and s.isatty() for s in streams)


class EventPrinter:
    """Shows engine events as text: tokens as they come, tool activity with timings.

    ``info`` receives the tool lines.  When it is a different stream from
    ``out`` (chat: stdout vs stderr) the answer on ``out`` stays clean; when it
    is the same (the demo) tool lines get their own lines between the text.
    With ``color``, tool lines are dimmed and written inline in the text flow.
    ``spans`` adds each tool's start and end offsets (the demo).
    ``hide_markup`` takes inline tool blocks out of the text.  ``models``
    lets an error line drop the failover bookkeeping (:func:`error_lines`).
    ``reasoning`` shows a thinking model's reasoning on ``info`` as it
    streams (dimmed with ``color``), ended by a line break before anything else.
    """

    def __init__(self, out: TextIO, info: TextIO, *, color: bool = False, spans: bool = False,
                 t0: Optional[float] = None, hide_llm_warning: bool = True, hide_markup: bool = False,
                 models: Sequence[str] = (), reasoning: bool = False) -> None:
        self.out, self.info_stream = out, info
        self.show_reasoning = reasoning
        self._thinking = False  # reasoning is being written on info: a line break ends it
        self._shown = for_terminal if is_terminal(out) else _as_is  # the answer: byte for byte into a pipe
        self.markup = MarkupFilter() if hide_markup else None
        self.models = tuple(models)
        self.color, self.spans = color, spans
        self.t0 = time.monotonic() if t0 is None else t0
        self.hide_llm_warning = hide_llm_warning
        self.result: Any = None
        self.errors: List[str] = []
        self._at_line_start = True
        self._held: Optional[str] = None
        # Answer and notices share one screen: a notice that comes mid-word waits for the
        # word's end and takes a line of its own, instead of "Me [tool weather ok] anwhile".
        self._one_screen = info is out or (is_terminal(out) and is_terminal(info))
        self._notices: List[str] = []

    def handle(self, event: Event, t: float) -> None:
        if isinstance(event, ReasoningEvent):
            if self.show_reasoning:
                self._reasoning(event.text)
            return
        if self._thinking:
            self._thinking = False
            write(self.info_stream, "\n")
        held, self._held = self._held, None
        if held is not None and not isinstance(event, ErrorEvent):
            self._text(held)  # it was model text after all, not the engine's warning
        if isinstance(event, TokenEvent):
            if self.hide_llm_warning and event.text.startswith(LLM_WARNING):
                self._held = event.text  # the error line says it once, on stderr
            else:
                self._text(event.text)
        elif isinstance(event, ToolStartEvent):
            self._info(f"tool {event.call.name} started +{t:.2f}s")
        elif isinstance(event, ToolResultEvent):
            self._info(self._result_line(event))
        elif isinstance(event, RefusalEvent):
            self._newline()
            write(self.info_stream, for_terminal(f"{PROG}: the model refused: {_one_line(event.text)}\n"))
        elif isinstance(event, RoundEvent) and event.round > 1:
            self._newline()
            self._info(f"round {event.round}: revised answer +{t:.2f}s")
        elif isinstance(event, ResetEvent):
            # Text already printed cannot be taken back: say plainly that it is void.
            self._newline()
            self._info(f"[round {event.round} restarted: {event.reason}; discard the text above] +{t:.2f}s")
        elif isinstance(event, ErrorEvent) and not event.fatal:
            self._newline()
            write(self.info_stream, for_terminal(f"{PROG}: warning: {_one_line(event.message)}\n"))
        elif isinstance(event, ErrorEvent):
            self.errors.append(event.message)
            self._newline()
            write_error(self.info_stream, event.message, self.models)
        elif isinstance(event, DoneEvent):
            self.result = event.result
            self._newline()

    def _reasoning(self, text: str) -> None:
        """Reasoning as it streams, on a line of its own: shown (never obeyed), dimmed with color."""
        if not self._thinking:
            self._newline()
            self._thinking = True
        shown = for_terminal(text)
        write(self.info_stream, f"{_DIM}{shown}{_RESET}" if self.color else shown)

    def _result_line(self, event: ToolResultEvent) -> str:
        r = event.result
        skipped = skip_reason(event)
        if skipped is not None:
            return f"tool {r.name} not run: {skipped}"
        status = "ok" if r.ok else ("timed out" if getattr(r, "timed_out", False) else "error")
        line = f"tool {r.name} {status} {r.duration_s:.2f}s"
        if self.spans and r.started_at and r.ended_at:
            line += f", ran +{r.started_at - self.t0:.2f} .. +{r.ended_at - self.t0:.2f}"
        if not r.ok and r.error:
            line += f": {_one_line(r.error)}"
        return line

    def _text(self, text: str) -> None:
        if self.markup is not None:
            text = self.markup.feed(text)
            if self._at_line_start:
                text = text.lstrip(" \t")  # after a tool line, the space that preceded the block
        if not text:
            return
        text = self._shown(text)
        gap = _WORD_GAP.search(text) if self._notices else None
        if gap is not None:  # a word ends here: the waiting notices get their own line
            write(self.out, text[:gap.start()] + "\n")
            self._at_line_start = True
            self._flush_notices()
            text = text[gap.end():]
            if not text:
                return
        write(self.out, text)
        self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if self.markup is not None:
            self.markup.flush()  # spaces before a line break are not worth a line of their own
        if not self._at_line_start:
            write(self.out, "\n")
            self._at_line_start = True
        self._flush_notices()

    def note(self, message: str) -> None:
        """A line of tool activity (or any remark) on the info stream."""
        self._info(message)

    def end_line(self) -> None:
        """End the text's current line (and show waiting notices): a question or a note follows on its own."""
        self._newline()

    def _info(self, message: str) -> None:
        message = for_terminal(message)  # tool names and errors are the tools' and the model's text
        line = f"{_DIM}[{message}]{_RESET}\n" if self.color else f"[{message}]\n"
        if self._one_screen and not self._at_line_start:
            self._notices.append(line)  # mid-line: on its own line once this one ends
            return
        if self.info_stream is not self.out:
            self.out.flush()
        write(self.info_stream, line)

    def _flush_notices(self) -> None:
        notices, self._notices = self._notices, []
        if notices:
            self.out.flush()
            write(self.info_stream, "".join(notices))

    def summary(self) -> Optional[str]:
        r = self.result
        if r is None:
            return None
        t = r.telemetry
        tools = f", tools {t.tools_ok} ok" + (f" / {t.tools_failed + t.tools_timed_out} failed" if
                                             t.tools_failed + t.tools_timed_out else "") \
            + (f" / {t.refused} not approved" if t.refused else "")
        return f"done: {t.rounds} round{'s' if t.rounds != 1 else ''}{tools}, {t.total_s:.2f}s, model {t.model_used}"


def _as_is(text: str) -> str:
    return text


#: A skipped call's reason (``ToolResultEvent.skipped``) in words.
SKIP_REASONS = {
    "not_approved": "not approved", "duplicate": "a repeat of an earlier call", "not_allowed": "not allowed",
    "round_cap": "over the calls-per-round cap", "request_cap": "over the calls-per-request cap",
    "pool_busy": "no free worker", "cancelled": "cancelled", "stream_not_finished": "the answer broke off",
}


def skip_reason(event: ToolResultEvent) -> Optional[str]:
    """Why a call never ran, in words; None for a call that ran (ok, failed or timed out)."""
    skipped = event.skipped
    return SKIP_REASONS.get(skipped, skipped.replace("_", " ")) if skipped else None


class JsonEventPrinter:
    """One JSON object per event per line (``"event"`` = its name, ``"t"`` = seconds since start).

    At a terminal every character past ASCII is escaped (``\\u001b``): the
    same JSON, and nothing a terminal obeys.
    """

    def __init__(self, out: TextIO, *, t0: Optional[float] = None) -> None:
        self.out = out
        self._ascii = is_terminal(out)
        self.t0 = time.monotonic() if t0 is None else t0
        self.result: Any = None
        self.errors: List[str] = []

    def handle(self, event: Event, t: float) -> None:
        record: Dict[str, Any] = {"event": event.name, "t": round(t, 4)}
        record.update(self._fields(event))
        write(self.out, json.dumps(record, ensure_ascii=self._ascii, default=str) + "\n")

    def _fields(self, event: Event) -> Dict[str, Any]:
        if isinstance(event, TokenEvent):
            return {"text": event.text}
        if isinstance(event, ToolStartEvent):
            return {"id": event.call.id, "name": event.call.name, "arguments": event.call.arguments}
        if isinstance(event, ToolResultEvent):
            r = event.result
            return {"call_id": r.call_id, "name": r.name, "ok": r.ok, "skipped": getattr(event, "skipped", None),
                    "text": r.text, "error": r.error,
                    "duration_s": r.duration_s, "timed_out": getattr(r, "timed_out", False),
                    "started_s": self._offset(r.started_at), "ended_s": self._offset(r.ended_at)}
        if isinstance(event, RoundEvent):
            return {"round": event.round}
        if isinstance(event, (RefusalEvent, ReasoningEvent)):
            return {"text": event.text, "round": event.round}
        if isinstance(event, ResetEvent):
            return {"round": event.round, "reason": event.reason}
        if isinstance(event, ErrorEvent):
            if event.fatal:
                self.errors.append(event.message)
            return {"message": event.message, "fatal": event.fatal}
        if isinstance(event, DoneEvent):
            self.result = done = event.result
            return {"answer": done.answer, "rounds": list(done.rounds), "reasoning_rounds": list(done.reasoning_rounds),
                    "error": done.error,
                    "refusal": done.refusal, "finish_reasons": list(done.finish_reasons),
                    "telemetry": dataclasses.asdict(done.telemetry),
                    "usage": dataclasses.asdict(done.usage) if done.usage else None}
        return {}

    def _offset(self, stamp: float) -> Optional[float]:
        return round(stamp - self.t0, 4) if stamp else None
