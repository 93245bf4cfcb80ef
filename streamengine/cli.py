"""The ``streamengine`` command: ``chat``, ``serve``, ``demo`` and ``harness``.

``main(argv) -> int`` never lets a traceback reach the terminal for a user's
mistake or an unreachable provider: those end as one line on stderr,
``streamengine: error: ...``, and an exit status —

* 0: success;
* 1: the run ended with an LLM error, a scenario failed, or the OS refused
  something (a port in use);
* 2: a usage error (bad flags, no model configured, ``--tools`` that does not
  import);
* 130: interrupted (Ctrl-C).

``chat`` keeps stdout for the answer alone, so ``streamengine chat ... > out.txt``
captures just the text; tool starts and results (with timings) go to stderr,
dimmed and inline on a terminal, as ``[bracketed lines]`` otherwise.
``--json`` prints one JSON object per event instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from .errors import ConfigError, StreamEngineError
from .events import DoneEvent, ErrorEvent, Event, RoundEvent, TokenEvent, ToolResultEvent, ToolStartEvent
from .text import one_line as _one_line

__all__ = ["EventPrinter", "JsonEventPrinter", "build_parser", "main"]

PROG = "streamengine"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_LLM_WARNING = "\u26a0\ufe0f LLM error: "  # the engine's visible warning token (round.py)
_DIM, _BOLD, _RED, _RESET = "\x1b[2m", "\x1b[1m", "\x1b[31m", "\x1b[0m"


class UsageError(Exception):
    """A command line that cannot be run as written (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not a usage block plus a message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


# --------------------------------------------------------------------------- output helpers

def _write(stream: TextIO, text: str) -> None:
    """Write, replacing what the terminal's encoding cannot show instead of crashing mid-answer."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "replace").decode(encoding, "replace"))
    stream.flush()



def _error_line(stream: TextIO, message: str) -> None:
    _write(stream, f"{PROG}: error: {_one_line(message)}\n")


def _use_color(*streams: TextIO) -> bool:
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
    """

    def __init__(self, out: TextIO, info: TextIO, *, color: bool = False, spans: bool = False,
                 t0: Optional[float] = None, hide_llm_warning: bool = True) -> None:
        self.out, self.info_stream = out, info
        self.color, self.spans = color, spans
        self.t0 = time.monotonic() if t0 is None else t0
        self.hide_llm_warning = hide_llm_warning
        self.result: Any = None
        self.errors: List[str] = []
        self._at_line_start = True
        self._held: Optional[str] = None
        self._space_due = False

    def handle(self, event: Event, t: float) -> None:
        held, self._held = self._held, None
        if held is not None and not isinstance(event, ErrorEvent):
            self._text(held)  # it was model text after all, not the engine's warning
        if isinstance(event, TokenEvent):
            if self.hide_llm_warning and event.text.startswith(_LLM_WARNING):
                self._held = event.text  # the error line says it once, on stderr
            else:
                self._text(event.text)
        elif isinstance(event, ToolStartEvent):
            self._info(f"tool {event.call.name} started +{t:.2f}s")
        elif isinstance(event, ToolResultEvent):
            self._info(self._result_line(event.result))
        elif isinstance(event, RoundEvent) and event.round > 1:
            self._newline()
            self._info(f"round {event.round}: revised answer +{t:.2f}s")
        elif isinstance(event, ErrorEvent):
            self.errors.append(event.message)
            self._newline()
            _error_line(self.info_stream, event.message)
        elif isinstance(event, DoneEvent):
            self.result = event.result
            self._newline()

    def _result_line(self, r: Any) -> str:
        status = "ok" if r.ok else ("timed out" if getattr(r, "timed_out", False) else "error")
        line = f"tool {r.name} {status} {r.duration_s:.2f}s"
        if self.spans and r.started_at and r.ended_at:
            line += f", ran +{r.started_at - self.t0:.2f} .. +{r.ended_at - self.t0:.2f}"
        if not r.ok and r.error:
            line += f": {_one_line(r.error)}"
        return line

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._space_due and not text[0].isspace():
            text = " " + text
        self._space_due = False
        _write(self.out, text)
        self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        self._space_due = False
        if not self._at_line_start:
            _write(self.out, "\n")
            self._at_line_start = True

    def note(self, message: str) -> None:
        """A line of tool activity (or any remark) on the info stream."""
        self._info(message)

    def _info(self, message: str) -> None:
        if self.color:
            if self.info_stream is not self.out:
                self.out.flush()
            if self._at_line_start:
                _write(self.info_stream, f"{_DIM}[{message}]{_RESET}\n")
            else:  # inline, in the text flow; the space after it waits for the next text
                _write(self.info_stream, f"{'' if self._space_due else ' '}{_DIM}[{message}]{_RESET}")
                self._space_due = True
            return
        if self.info_stream is self.out:
            self._newline()
        _write(self.info_stream, f"[{message}]\n")

    def summary(self) -> Optional[str]:
        r = self.result
        if r is None:
            return None
        t = r.telemetry
        tools = f", tools {t.tools_ok} ok" + (f" / {t.tools_failed + t.tools_timed_out} failed" if
                                             t.tools_failed + t.tools_timed_out else "")
        return f"done: {t.rounds} round{'s' if t.rounds != 1 else ''}{tools}, {t.total_s:.2f}s, model {t.model_used}"


class JsonEventPrinter:
    """One JSON object per event per line (``"event"`` = its name, ``"t"`` = seconds since start)."""

    def __init__(self, out: TextIO, *, t0: Optional[float] = None) -> None:
        self.out = out
        self.t0 = time.monotonic() if t0 is None else t0
        self.result: Any = None
        self.errors: List[str] = []

    def handle(self, event: Event, t: float) -> None:
        record: Dict[str, Any] = {"event": event.name, "t": round(t, 4)}
        record.update(self._fields(event))
        _write(self.out, json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def _fields(self, event: Event) -> Dict[str, Any]:
        if isinstance(event, TokenEvent):
            return {"text": event.text}
        if isinstance(event, ToolStartEvent):
            return {"id": event.call.id, "name": event.call.name, "arguments": event.call.arguments}
        if isinstance(event, ToolResultEvent):
            r = event.result
            return {"call_id": r.call_id, "name": r.name, "ok": r.ok, "text": r.text, "error": r.error,
                    "duration_s": r.duration_s, "timed_out": getattr(r, "timed_out", False),
                    "started_s": self._offset(r.started_at), "ended_s": self._offset(r.ended_at)}
        if isinstance(event, RoundEvent):
            return {"round": event.round}
        if isinstance(event, ErrorEvent):
            self.errors.append(event.message)
            return {"message": event.message}
        if isinstance(event, DoneEvent):
            self.result = done = event.result
            return {"answer": done.answer, "rounds": list(done.rounds), "error": done.error,
                    "telemetry": dataclasses.asdict(done.telemetry), "usage": dataclasses.asdict(done.usage) if done.usage else None}
        return {}

    def _offset(self, stamp: float) -> Optional[float]:
        return round(stamp - self.t0, 4) if stamp else None


# --------------------------------------------------------------------------- engine from flags

def _models(args: argparse.Namespace) -> List[str]:
    raw = args.model or [os.environ.get("STREAMENGINE_MODEL", "")]
    models = [m.strip() for item in raw for m in item.split(",") if m.strip()]
    if not models:
        raise ConfigError("no model: pass --model NAME (repeat it for a failover list) or set STREAMENGINE_MODEL")
    return models


def _tools(specs: Sequence[str]) -> List[Any]:
    from .tools.loading import load_tools
    tools: List[Any] = []
    for spec in specs:
        tools.extend(load_tools(spec))
    return tools


def _build_engine(args: argparse.Namespace) -> Any:
    from .clients.openai import OpenAICompatibleClient
    from .engine import EngineConfig, StreamingEngine

    config: Dict[str, Any] = {"models": _models(args)}
    if getattr(args, "max_continuations", None) is not None:
        config["max_continuations"] = args.max_continuations
    if getattr(args, "tool_timeout", None) is not None:
        config["tool_timeout"] = args.tool_timeout
    engine_config = EngineConfig(**config)
    tools = _tools(args.tools)
    base_url = args.base_url or os.environ.get("STREAMENGINE_BASE_URL") or DEFAULT_BASE_URL
    api_key = args.api_key or os.environ.get("STREAMENGINE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    client = OpenAICompatibleClient(base_url, api_key)
    try:
        return StreamingEngine(client, tools, engine_config)
    except BaseException:
        client.close()
        raise


def _close_engine(engine: Any) -> None:
    try:
        engine.close()
    finally:
        engine.client.close()


# --------------------------------------------------------------------------- chat

def _cmd_chat(args: argparse.Namespace, hooks: "_Hooks") -> int:
    out, err = sys.stdout, sys.stderr
    if not args.prompt.strip():
        raise UsageError("the prompt is empty; pass the question as the argument: streamengine chat \"...\"")
    engine = _build_engine(args)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]
    t0 = time.monotonic()
    printer: Any = JsonEventPrinter(out, t0=t0) if args.json else \
        EventPrinter(out, err, color=_use_color(out, err), t0=t0)
    try:
        events = engine.run(messages)
        try:
            for event in events:
                printer.handle(event, time.monotonic() - t0)
        finally:
            events.close()  # on Ctrl-C: cancels the provider stream and the tools
    finally:
        _close_engine(engine)
    if not args.json and printer.summary() is not None and (printer.result.telemetry.tools_started or
                                                            printer.result.telemetry.rounds > 1):
        printer.note(printer.summary())
    if args.json and printer.errors:
        _error_line(err, printer.errors[-1])
    result = printer.result
    return 1 if result is None or result.error is not None or printer.errors else 0


# --------------------------------------------------------------------------- serve

def _cmd_serve(args: argparse.Namespace, hooks: "_Hooks") -> int:
    if args.threads < 1:
        raise UsageError("--threads must be at least 1 (each open stream holds one thread)")
    engine = _build_engine(args)
    try:
        from .serve import serve_app
        from .wsgi import make_wsgi_app
        app = make_wsgi_app(engine, allow_origin=args.allow_origin, heartbeat_s=args.heartbeat)
        banner = [f"  models {', '.join(engine.config.models)} at {engine.client.base_url}; "
                  f"tools: {', '.join(engine.registry.names) or 'none'}",
                  "  POST /v1/chat/stream (SSE), GET /healthz, GET / (a page)"]
        serve_app(app, host=args.host, port=args.port, threads=args.threads, out=sys.stdout, banner=banner,
                  stop=hooks.stop, ready=hooks.ready)
    finally:
        _close_engine(engine)
    return 0


# --------------------------------------------------------------------------- demo

def _cmd_demo(args: argparse.Namespace, hooks: "_Hooks") -> int:
    from . import demo

    out = sys.stdout
    if args.serve:
        from .serve import serve_app
        from .wsgi import make_wsgi_app
        engine = demo.DemoEngine(fast=args.fast)
        banner = ["  open the page and ask anything: the scripted model (no key, no network) plans a",
                  "  Lisbon weekend and calls two slow tools mid-answer; watch them start while it writes."]
        serve_app(make_wsgi_app(engine, heartbeat_s=15.0), host=args.host, port=args.port, threads=args.threads,
                  out=out, banner=banner, stop=hooks.stop, ready=hooks.ready)
        return 0
    color = _use_color(out)
    bold = (lambda s: f"{_BOLD}{s}{_RESET}") if color else (lambda s: s)
    _write(out, bold(f"{PROG} demo: a scripted model on a loopback FakeProvider (no key, no network)") + "\n")
    _write(out, f"Q: {demo.DEMO_QUESTION}\n\n")
    t0 = time.monotonic()
    printer = EventPrinter(out, out, color=color, spans=True, t0=t0, hide_llm_warning=False)
    report = demo.run_demo(fast=args.fast, on_event=lambda event, t: printer.handle(event, t))
    _write(out, "\n" + demo.format_summary(report) + "\n")
    return 0 if report.ok else 1


# --------------------------------------------------------------------------- harness

def _cmd_harness(args: argparse.Namespace, hooks: "_Hooks") -> int:
    from .testing.junit import write_junit
    from .testing.scenario import expand_paths, run_files

    out = sys.stdout
    paths = expand_paths(args.scenarios)
    if not paths:
        raise UsageError("no scenario files found in " + ", ".join(args.scenarios))
    started = time.monotonic()

    def report(result: Any) -> None:
        if result.passed:
            _write(out, f"PASS {result.name} ({result.duration_s:.2f}s)\n")
        else:
            _write(out, f"FAIL {result.name}: {_one_line(result.reason)}\n")

    results = run_files(paths, report)
    failed = sum(1 for r in results if not r.passed)
    _write(out, f"{len(results) - failed} passed, {failed} failed ({time.monotonic() - started:.2f}s)\n")
    if args.junit:
        try:
            write_junit(results, args.junit)
        except OSError as exc:
            raise OSError(f"cannot write --junit {args.junit}: {exc.strerror or exc}") from exc
    return 1 if failed else 0


# --------------------------------------------------------------------------- the parser

def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0 = any free port), got {value}")
    return value


def _add_provider_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", metavar="URL",
                   help="provider API root, e.g. http://127.0.0.1:8000/v1 "
                        "(env STREAMENGINE_BASE_URL; default https://api.openai.com/v1)")
    p.add_argument("--api-key", metavar="KEY", help="API key (env STREAMENGINE_API_KEY or OPENAI_API_KEY)")
    p.add_argument("--model", metavar="M", action="append",
                   help="model name; repeat for a failover list, first = primary "
                        "(env STREAMENGINE_MODEL, comma-separated)")
    p.add_argument("--tools", metavar="MODULE:ATTR", action="append", default=[],
                   help="tools to offer: a @tool function, a plain function, or a list/registry of them "
                        "(repeatable; the current directory is importable)")
    p.add_argument("--max-continuations", metavar="N", type=int,
                   help="revised-answer rounds after tool calls (default 3)")
    p.add_argument("--tool-timeout", metavar="S", type=_positive_float,
                   help="seconds a tool may run before it is abandoned (default 30)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Stream an LLM's answer while the tools it calls already run.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log to stderr (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser("chat", help="ask one question and stream the answer",
                          description="Stream one answer to the terminal; tool activity goes to stderr.")
    chat.add_argument("prompt", help="the question")
    _add_provider_flags(chat)
    chat.add_argument("--system", metavar="TEXT", help="a system message before the question")
    chat.add_argument("--json", action="store_true",
                      help="print one JSON object per event per line (done carries the telemetry)")
    chat.set_defaults(handler=_cmd_chat)

    serve = sub.add_parser("serve", help="serve the engine as SSE over HTTP (waitress)",
                           description="Serve POST /v1/chat/stream (SSE), GET /healthz and a page at /.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free port)")
    serve.add_argument("--threads", type=int, default=32,
                       help="waitress threads; must exceed the concurrent streams (default 32)")
    serve.add_argument("--allow-origin", metavar="ORIGIN", help="CORS: '*' or https://app.example")
    serve.add_argument("--heartbeat", metavar="S", type=_positive_float, default=15.0,
                       help="seconds of silence before a ': ping' frame (default 15)")
    _add_provider_flags(serve)
    serve.set_defaults(handler=_cmd_serve)

    demo = sub.add_parser("demo", help="a scripted run with tools mid-answer (no key, no network)",
                          description="Run a scripted model on a loopback FakeProvider: two slow tools start "
                                      "while it writes; a timing summary compares with waiting for the stream.")
    demo.add_argument("--serve", action="store_true", help="serve the demo on the web page instead")
    demo.add_argument("--host", default="127.0.0.1", help="with --serve: interface (default 127.0.0.1)")
    demo.add_argument("--port", type=_port, default=8000, help="with --serve: port (default 8000)")
    demo.add_argument("--threads", type=int, default=32, help=argparse.SUPPRESS)
    demo.add_argument("--fast", action="store_true", help="every delay 10x shorter")
    demo.set_defaults(handler=_cmd_demo)

    harness = sub.add_parser("harness", help="run scenario files against FakeProvider",
                             description="Run scripted scenarios (see streamengine.testing.scenario for the format) "
                                         "over real HTTP; PASS/FAIL per scenario.")
    harness.add_argument("scenarios", nargs="+", metavar="SCENARIO.json",
                         help="scenario files (a directory = its *.json files)")
    harness.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    harness.set_defaults(handler=_cmd_harness)
    return parser


# --------------------------------------------------------------------------- main

@dataclasses.dataclass
class _Hooks:
    stop: Optional[threading.Event] = None
    ready: Optional[Callable[[str], None]] = None


def main(argv: Optional[Sequence[str]] = None, *, stop: Optional[threading.Event] = None,
         ready: Optional[Callable[[str], None]] = None) -> int:
    """Run the command line; returns the exit status.

    ``stop`` and ``ready`` are for embedding and tests: ``serve`` and
    ``demo --serve`` call ``ready(url)`` once listening and return when
    ``stop`` is set.
    """
    err = sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        _error_line(err, str(exc))
        return 2
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else 0
    if not getattr(args, "handler", None):
        parser.print_help(err)
        return 2
    if args.verbose:
        from .logs import enable_logging
        enable_logging("DEBUG" if args.verbose > 1 else "INFO")
    try:
        return args.handler(args, _Hooks(stop, ready))
    except (UsageError, ConfigError) as exc:
        _error_line(err, str(exc))
        return 2
    except BrokenPipeError:  # `streamengine chat ... | head`: the reader left; nothing to say
        _silence_stdout()
        return 1
    except (StreamEngineError, OSError) as exc:
        _error_line(err, str(exc) or type(exc).__name__)
        return 1
    except KeyboardInterrupt:
        _write(err, f"\n{PROG}: interrupted\n")
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
