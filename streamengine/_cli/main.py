"""The ``streamengine`` command: the argv habits it accepts, ``chat``, ``serve``, ``models``, ``demo``, ``harness``,
``logs``, ``mcp list``.

The command line as ``llm`` users type it, rewritten into what argparse takes.

Kept apart from the parser: these are habits (two-word ``-o``, a bare
prompt), not flags, and each rewrite is a plain function of the words.

``streamengine serve``: the engine as SSE over HTTP, under waitress.

By default a server refuses every side-effect call; ``--approve ask`` (with
``--runs``) asks the client, whose answer reaches the run through its log;
``--approve all`` lets every one run for every client and says so in a
WARNING at start.

``main(argv) -> int`` never lets a traceback reach the terminal for a user's
mistake or an unreachable provider: those end as a line on stderr,
``streamengine: error: CAUSE``, and an exit status --

* 0: success;
* 1: the run ended with an LLM error, a scenario failed, or the OS refused
  something (a port in use);
* 2: a usage error (bad flags, no model configured, ``--tools`` that does not
  import);
* 3: the answer is not whole: cut off by the token limit or a content filter
  (finish reason ``length`` / ``content_filter``), or the model refused;
* 130: interrupted (Ctrl-C).

As ``llm`` users expect: a bare ``streamengine "prompt"`` runs ``chat``;
``-o KEY VALUE`` works as well as ``-o KEY=VALUE``; flags are never
abbreviated (``--no-stream`` is not ``--no-stream-options``).

``-v`` adds the library's log lines and, for an error, the chain of causes
underneath it.  Options may come before or after the command
(``streamengine chat hi -v``).  ``chat`` lives in ``chat.py``, the flags that
build an engine in ``build.py``, the printers in ``output.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, NoReturn, Optional, Sequence, TextIO

from .. import __version__
from .._errors import AllModelsFailedError, ConfigError, LlmError, LlmHttpError, StreamEngineError
from .._messages import PROG
from .._validation import one_line as _one_line
from .attach import add_attachment_flags
from .build import (
    UsageError,
    add_endpoint_flags,
    add_mcp_flags,
    add_provider_flags,
    build_client,
    build_engine,
    close_engine,
    close_mcp_servers,
    connect_timeout_of,
    mcp_tools,
    open_mcp_servers,
    positive_seconds,
    refuse,
)
from .chat import add_approval_flags, cmd_chat
from .log import ConversationLogError, cmd_logs
from .output import (
    BOLD,
    RESET,
    EventPrinter,
    attempt_lines,
    error_lines,
    use_color,
    write,
    write_error,
    write_error_lines,
)

if TYPE_CHECKING:
    from .._engine.events import Event
    from .._engine.run import StreamingEngine
    from .._messages import ToolCall
    from ..runs import RunLog
    from ..testing._scenario import ScenarioResult
    from ..web import PartsPolicy

COMMANDS = ("chat", "serve", "models", "demo", "harness", "logs", "mcp")
_TOP_LEVEL = ("-h", "--help", "--version")


def llm_style(argv: List[str]) -> List[str]:
    """The command line as argparse takes it: ``-o KEY VALUE`` as ``-o KEY=VALUE``, a bare prompt as chat.

    ``-o`` takes one word; ``llm`` users write two (``-o temperature 0.5``).
    A first word that is no command (``streamengine "why?"``,
    ``streamengine -m gpt-4o "why?"``) starts a ``chat``, as ``llm "why?"`` does.
    """
    out: List[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in ("-o", "--option") and i + 2 < len(argv) and "=" not in argv[i + 1] \
                and (not argv[i + 2].startswith("-") or _is_number(argv[i + 2])):
            out += [word, f"{argv[i + 1]}={argv[i + 2]}"]
            i += 3
            continue
        out.append(word)
        i += 1
    first = next((n for n, word in enumerate(out) if not _is_verbosity(word)), None)
    if first is None or out[first] in COMMANDS or out[first] in _TOP_LEVEL:
        return out
    return out[:first] + ["chat"] + out[first:]


def _is_verbosity(word: str) -> bool:
    return word == "--verbose" or (len(word) > 1 and word[0] == "-" and set(word[1:]) == {"v"})


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def approve_all(call: ToolCall) -> bool:
    """``serve --approve all``: every side-effect call runs."""
    return True


def cmd_serve(args: argparse.Namespace, hooks: _Hooks) -> int:
    if args.threads < 1:
        raise UsageError("--threads must be at least 1 (each open stream holds one thread)")
    if args.max_connections_per_client < 0:
        raise UsageError("--max-connections-per-client must be 0 (no cap) or more")
    everything = args.approve == "all"
    if args.approve == "ask" and args.runs is None:
        raise UsageError("--approve ask needs --runs URL: the page's answer reaches the run through its log "
                         "(one process: --runs memory:)")
    runs: Optional[RunLog] = None
    engine = build_engine(args, approve=approve_all if everything else refuse)
    try:
        from ..web import make_wsgi_app
        from ..web._serve import serve_app
        _say_what_happens_to_side_effects(engine, args.approve)
        # Streams beyond threads - 4 get a 429, so health checks and the page always find a thread.
        runs = _run_log(args)
        app = make_wsgi_app(engine, system_prompt=args.system or None, allow_origin=args.allow_origin,
                            heartbeat_s=args.heartbeat, allowed_hosts=args.allowed_host or None,
                            max_streams=max(1, args.threads - 4), expose_errors=args.expose_errors,
                            runs=runs, detach_grace_s=args.detach_grace, approvals=args.approve == "ask",
                            parts=_parts_policy(args), ai_sdk_version=args.ai_sdk_version,
                            take_over=False if args.no_take_over else None)
        banner = [f"  models {', '.join(engine.config.models)} at {getattr(engine.client, 'base_url', '?')}; "
                  f"tools: {', '.join(engine.registry.names) or 'none'}"
                  + ("; with a system prompt" if args.system else ""),
                  "  POST /v1/chat/stream (SSE), GET /healthz, GET / (a page)"
                  + (f"; runs resume from {args.runs.split('://')[0]} (GET /v1/runs/<id>/events)" if runs else "")]
        serve_app(app, host=args.host, port=args.port, threads=args.threads, out=sys.stdout, banner=banner,
                  stop=hooks.stop, ready=hooks.ready,
                  max_connections_per_client=args.max_connections_per_client or None)
    finally:
        close_engine(engine)
        if runs is not None:
            runs.close()
    return 0


def _parts_policy(args: argparse.Namespace) -> Optional[PartsPolicy]:
    """``--parts image,file`` (``--part-urls``): which attachments a request may bring (None: text only)."""
    if not args.parts:
        if args.part_urls:
            raise UsageError("--part-urls needs --parts KINDS (which attachments a request may bring)")
        return None
    from ..web import PartsPolicy
    kinds = tuple(kind.strip() for kind in args.parts.split(",") if kind.strip())
    try:
        return PartsPolicy(allow=kinds, urls=args.part_urls)
    except ConfigError as exc:
        raise UsageError(f"--parts {args.parts}: {exc}") from exc


def _run_log(args: argparse.Namespace) -> Optional[RunLog]:
    """``--runs URL``: the log runs resume from (None: runs live and die with their connection)."""
    if args.runs is None:
        return None
    from ..runs import open_run_log
    return open_run_log(args.runs)


def side_effect_tools(engine: StreamingEngine) -> List[str]:
    return [name for name in engine.registry.names if getattr(engine.registry.get(name), "side_effects", False)]


def _say_what_happens_to_side_effects(engine: StreamingEngine, approve: str) -> None:
    """On stderr at start: which tools are refused or asked about, or a WARNING that every call runs unasked."""
    names = side_effect_tools(engine)
    if approve == "ask":
        if names:
            write(sys.stderr, f"{PROG}: tools with side effects wait for the client's Approve or Deny (the page, "
                              f"POST /v1/runs/<id>/approvals/<call id>): {', '.join(names)}\n")
    elif approve == "all":
        which = f" ({', '.join(names)})" if names else " (none registered now)"
        write(sys.stderr, f"{PROG}: WARNING: --approve all: every call of a tool with side effects{which} "
                          f"runs without anyone approving it, for every client of this server\n")
    elif names:
        write(sys.stderr, f"{PROG}: tools with side effects are refused: {', '.join(names)}; --approve ask "
                          f"(with --runs) lets the client decide, --approve all lets them all run\n")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, and no flag is ever abbreviated.

    ``allow_abbrev`` would take ``--no-stream`` (or even ``--no``) for
    ``--no-stream-options``: a typo must be an error, not another flag.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# --------------------------------------------------------------------------- demo

def _cmd_demo(args: argparse.Namespace, hooks: _Hooks) -> int:
    from . import demo

    out = sys.stdout
    if args.serve:
        from ..web import make_wsgi_app
        from ..web._serve import serve_app
        engine = demo.DemoEngine(fast=args.fast)
        banner = ["  open the page and ask anything: the scripted model (no key, no network) plans a",
                  "  Lisbon weekend and calls two slow tools mid-answer; watch them start while it writes."]
        serve_app(make_wsgi_app(engine, heartbeat_s=15.0), host=args.host, port=args.port, threads=args.threads,
                  out=out, banner=banner, stop=hooks.stop, ready=hooks.ready)
        return 0
    color = use_color(out)
    bold = (lambda s: f"{BOLD}{s}{RESET}") if color else (lambda s: s)
    write(out, bold(f"{PROG} demo: a scripted model on a loopback FakeProvider (no key, no network)") + "\n")
    write(out, f"Q: {demo.DEMO_QUESTION}\n\n")
    printer = EventPrinter(out, out, color=color, spans=True, hide_llm_warning=False)
    clock_set: List[bool] = []

    def show(event: Event, t: float) -> None:
        if not clock_set:  # the tools' "ran +a .. +b" on the demo's clock: from the request, not from here
            printer.t0 = time.monotonic() - t
            clock_set.append(True)
        printer.handle(event, t)

    report = demo.run_demo(fast=args.fast, on_event=show)
    write(out, "\n" + demo.format_summary(report) + "\n")
    return 0 if report.ok else 1


# --------------------------------------------------------------------------- harness

def _cmd_harness(args: argparse.Namespace, hooks: _Hooks) -> int:
    from ..testing import _scenario
    from ..testing._junit import write_junit
    from ..testing._scenario import expand_paths, run_files

    out = sys.stdout
    if args.format:
        write(out, inspect.cleandoc(_scenario.__doc__ or "") + "\n")  # the format's one home
        return 0
    if not args.scenarios:
        raise UsageError("harness needs scenario files (SCENARIO.json or a directory); --format shows what one holds")
    paths = expand_paths(args.scenarios)
    if not paths:
        raise UsageError("no scenario files found in " + ", ".join(args.scenarios))
    started = time.monotonic()

    def report(result: ScenarioResult) -> None:
        if result.passed:
            write(out, f"PASS {result.name} ({result.duration_s:.2f}s)\n")
        else:
            write(out, f"FAIL {result.name}: {_one_line(result.reason)}\n")

    servers = open_mcp_servers(args)
    try:
        results = run_files(paths, report, extra_tools=mcp_tools(servers, args))
    finally:
        close_mcp_servers(servers)
    failed = sum(1 for r in results if not r.passed)
    write(out, f"{len(results) - failed} passed, {failed} failed ({time.monotonic() - started:.2f}s)\n")
    if args.junit:
        try:
            write_junit(results, args.junit)
        except OSError as exc:
            raise OSError(f"cannot write --junit {args.junit}: {exc.strerror or exc}") from exc
    return 1 if failed else 0


# --------------------------------------------------------------------------- models

#: Statuses of a server that has no model list (it serves the one model it loaded).
_NO_MODELS_ROUTE = (404, 405, 501)


def _cmd_models(args: argparse.Namespace, hooks: _Hooks) -> int:
    """``streamengine models``: the provider's model ids, one per line (as ``llm models``)."""
    from .._clients.http.transport import HttpProviderClient

    client = build_client(args, os.environ, connect_timeout_of(args, os.environ))
    try:
        if not isinstance(client, HttpProviderClient):
            raise ConfigError(f"--provider {args.provider} has no model list in this installation")
        where = f"{client.base_url}{client.wire.models_path}"
        try:
            ids = client.list_models(timeout=args.timeout)
        except LlmHttpError as exc:
            if exc.status_code not in _NO_MODELS_ROUTE:
                raise
            raise LlmError(f"{where} answered HTTP {exc.status_code}: this server does not list its models; "
                           f"name the model it serves with -m (or check --base-url)") from exc
    finally:
        client.close()
    if not ids:
        raise LlmError(f"{where} lists no models: the server has none loaded, or this key may use none; "
                       f"check the server (or --base-url and the key), or name a model with -m")
    for model in ids:
        write(sys.stdout, (json.dumps({"id": model}) if args.json else model) + "\n")
    return 0


# --------------------------------------------------------------------------- mcp list

def _cmd_mcp_list(args: argparse.Namespace, hooks: _Hooks) -> int:
    try:
        from ..mcp._cli import cmd_list
    except ImportError as exc:
        raise ConfigError(f"streamengine mcp: {exc}") from exc
    return cmd_list(args, sys.stdout)


# --------------------------------------------------------------------------- the parser

def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0 = any free port), got {value}")
    return value


def _common_flags() -> _Parser:
    """Flags every command accepts, before or after its name."""
    common = _Parser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="log to stderr and show an error's causes (-v info, -vv debug)")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Stream an LLM's answer while the tools it calls already run.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log to stderr and show an error's causes (-v info, -vv debug)")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    common = _common_flags()
    provider = _Parser(add_help=False)
    add_provider_flags(provider)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    chat = sub.add_parser("chat", parents=[common, provider], help="ask a question and stream the answer",
                          description="Stream an answer: stdout gets the final answer, stderr the tool activity "
                                      "(and each round's text when stdout is not a terminal). The prompt is the "
                                      "argument, or stdin when piped or '-'; with neither, a conversation "
                                      "at the terminal (Ctrl-D ends it).")
    chat.add_argument("prompt", nargs="?", help="the question ('-' or omitted with a pipe: read stdin)")
    chat.add_argument("--json", action="store_true",
                      help="print one JSON object per event per line (done carries the telemetry)")
    chat.add_argument("-c", "--continue", dest="continue_", action="store_true",
                      help="continue the last conversation in the run log (with its model unless -m names one)")
    chat.add_argument("--no-reasoning", action="store_true",
                      help="do not show a thinking model's reasoning (shown dimmed on stderr at a terminal)")
    chat.add_argument("--no-log", action="store_true",
                      help="do not record this run in the run log (env STREAMENGINE_LOG=0 turns it off)")
    add_approval_flags(chat)
    add_attachment_flags(chat)
    chat.set_defaults(handler=cmd_chat)

    logs = sub.add_parser("logs", parents=[common], help="list past runs from the run log",
                          description="The last runs of chat from the local SQLite run log "
                                      "($XDG_DATA_HOME/streamengine/logs.db, else ~/.local/share/streamengine/"
                                      "logs.db).")
    logs.add_argument("-n", "--count", type=int, default=3, help="how many runs (default 3)")
    logs.add_argument("--path", action="store_true", help="print where the log is and stop")
    logs.add_argument("--json", action="store_true", help="one JSON object per run per line")
    logs.set_defaults(handler=cmd_logs)

    serve = sub.add_parser("serve", parents=[common, provider], help="serve the engine as SSE over HTTP (waitress)",
                           description="Serve POST /v1/chat/stream (SSE), GET /healthz and a page at /.")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free port)")
    serve.add_argument("--threads", type=int, default=32,
                       help="waitress threads; must exceed the concurrent streams (default 32)")
    serve.add_argument("--allow-origin", metavar="ORIGIN", help="CORS: '*' or https://app.example")
    serve.add_argument("--allowed-host", metavar="HOST", action="append",
                       help="a Host name the server answers to (repeatable; default: loopback names and the "
                            "bound address); needed behind a proxy or with --host 0.0.0.0")
    serve.add_argument("--heartbeat", metavar="S", type=positive_seconds, default=15.0,
                       help="seconds of silence before a ': ping' frame (default 15)")
    serve.add_argument("--expose-errors", action="store_true",
                       help="send error details to the browser, not only to the log (development only)")
    serve.add_argument("--approve", choices=("never", "ask", "all"), default="never",
                       help="tools with side effects: refuse every call (default), ask the client (the page's "
                            "Approve/Deny, useChat with --ai-sdk-version 6 or 7; needs --runs), or run every "
                            "call for every client, unasked (a WARNING at start says so)")
    serve.add_argument("--parts", metavar="KINDS",
                       help="attachments a request may bring: a comma list of image, audio, file (default: text "
                            "only); inline data only unless --part-urls")
    serve.add_argument("--part-urls", action="store_true",
                       help="with --parts: a part may also point at an http(s) URL (the provider fetches it)")
    serve.add_argument("--ai-sdk-version", type=int, choices=(5, 6, 7), default=5,
                       help="the 'ai' major version of a useChat frontend on POST /api/chat (default 5)")
    serve.add_argument("--max-connections-per-client", metavar="N", type=int, default=64,
                       help="open connections one address (an IPv6 /64) may hold; 429 past it (default 64; "
                            "0 = no cap, behind a proxy where every client has the proxy's address)")
    serve.add_argument("--runs", metavar="URL",
                       help="keep each run in a log so clients resume it (Last-Event-ID) and stop it: memory:, "
                            "sqlite:///runs.sqlite, redis://host:6379/0 or postgresql://user@host/db")
    serve.add_argument("--detach-grace", metavar="S", type=positive_seconds, default=60.0,
                       help="with --runs: how long a run whose client went away goes on waiting for it to come "
                            "back (default 60; memory: cancels at once)")
    serve.add_argument("--no-take-over", action="store_true",
                       help="with a shared --runs log: close a run whose server died as producer_lost instead of "
                            "going on with it here from its last round checkpoint (docs/runs.md, Takeover)")
    serve.set_defaults(handler=cmd_serve)

    models = sub.add_parser("models", parents=[common], help="list the models the provider offers",
                            description="The model ids the provider lists (GET /models; Anthropic's /v1/models), "
                                        "one per line: what -m takes.")
    add_endpoint_flags(models.add_argument_group("provider"))
    models.add_argument("--connect-timeout", metavar="S", type=positive_seconds,
                        help="TCP/TLS connect (env STREAMENGINE_CONNECT_TIMEOUT; default 10)")
    models.add_argument("--timeout", metavar="S", type=positive_seconds, default=30.0,
                        help="longest wait for the server's answer (default 30)")
    models.add_argument("--json", action="store_true", help="one JSON object per model per line")
    models.set_defaults(handler=_cmd_models, stream_options=None)

    demo = sub.add_parser("demo", parents=[common], help="a scripted run with tools mid-answer (no key, no network)",
                          description="Run a scripted model on a loopback FakeProvider: two slow tools start "
                                      "while it writes; a timing summary compares with waiting for the stream.")
    demo.add_argument("--serve", action="store_true", help="serve the demo on the web page instead")
    demo.add_argument("--host", default="127.0.0.1", help="with --serve: interface (default 127.0.0.1)")
    demo.add_argument("--port", type=_port, default=8000, help="with --serve: port (default 8000)")
    demo.add_argument("--threads", type=int, default=32, help=argparse.SUPPRESS)
    demo.add_argument("--fast", action="store_true", help="the model writes 10x faster (tools still get time to start)")
    demo.set_defaults(handler=_cmd_demo)

    harness = sub.add_parser("harness", parents=[common], help="run scenario files against FakeProvider",
                             description="Run scripted scenarios over real HTTP; PASS/FAIL per scenario "
                                         "(--format shows what a scenario file holds).")
    harness.add_argument("scenarios", nargs="*", metavar="SCENARIO.json",
                         help="scenario files (a directory = its *.json files)")
    harness.add_argument("--format", action="store_true", help="print the scenario file format and exit")
    harness.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    add_mcp_flags(harness)
    harness.set_defaults(handler=_cmd_harness)

    mcp = sub.add_parser("mcp", help="inspect MCP servers").add_subparsers(dest="mcp_command", metavar="ACTION",
                                                                          parser_class=_Parser, required=True)
    listing = mcp.add_parser("list", parents=[common], help="print a server's tools and their JSON schemas",
                             description="Start an MCP server (COMMAND ARGS..., or --mcp-url URL) and print its "
                                         "tools: name, whether it starts mid-stream, description, schema.")
    listing.add_argument("server", nargs=argparse.REMAINDER, metavar="COMMAND ...", help="the stdio server to start")
    listing.add_argument("--json", action="store_true", help="print the raw tools/list entries as JSON")
    add_mcp_flags(listing)
    listing.set_defaults(handler=_cmd_mcp_list)
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
        args = parser.parse_args(llm_style(list(sys.argv[1:] if argv is None else argv)))
    except UsageError as exc:
        write_error(err, str(exc))
        return 2
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else 0
    if not getattr(args, "handler", None):
        parser.print_help(err)
        return 2
    # serve logs warnings and errors (with their request id) without -v: the page says
    # "details are in the server log", so there must be one.
    log_handler = _start_logging(args.verbose, floor="WARNING" if args.command == "serve" else None)
    try:
        return _run(args, _Hooks(stop, ready), err)
    finally:
        if log_handler is not None:
            _stop_logging(log_handler)


def _run(args: argparse.Namespace, hooks: _Hooks, err: TextIO) -> int:
    try:
        handler: Callable[[argparse.Namespace, _Hooks], int] = args.handler
        return handler(args, hooks)
    except (UsageError, ConfigError) as exc:
        _report(err, exc, args)  # with -v its cause too: a --tools file that fails to import says why
        return 2
    except BrokenPipeError:  # `streamengine chat ... | head`: the reader left; nothing to say
        _silence_stdout()
        return 1
    except (StreamEngineError, OSError, ConversationLogError) as exc:
        _report(err, exc, args)
        return 1
    except KeyboardInterrupt:
        write(err, f"\n{PROG}: interrupted\n")
        return 130


def _start_logging(verbose: int, floor: Optional[str] = None) -> Optional[int]:
    """Logging for this command: ``-v`` info, ``-vv`` debug, else ``floor`` (None: silent)."""
    level = "DEBUG" if verbose > 1 else "INFO" if verbose else floor
    if level is None:
        return None
    from .._logs import enable_logging
    return enable_logging(level)


def _stop_logging(handler: int) -> None:
    """``-v`` lasts one command: ``main()`` embedded in a program leaves its logging as it was."""
    from loguru import logger

    try:
        logger.remove(handler)
    except ValueError:
        pass
    logger.disable("streamengine")


def _report(err: TextIO, exc: BaseException, args: argparse.Namespace) -> None:
    """The error's cause first; with ``-v`` the chain of exceptions underneath it."""
    if isinstance(exc, AllModelsFailedError) and exc.attempts:
        lines = attempt_lines([(model, str(cause)) for model, cause in exc.attempts])
    else:
        lines = error_lines(str(exc) or type(exc).__name__)
    if args.verbose:
        lines += [f"caused by {type(cause).__name__}: {_one_line(cause)}" for cause in _chain(exc)]
    write_error_lines(err, lines)


def _chain(exc: BaseException) -> List[BaseException]:
    causes: List[BaseException] = []
    current = exc.__cause__ or exc.__context__
    while current is not None and current not in causes and len(causes) < 8:
        causes.append(current)
        current = current.__cause__ or current.__context__
    return causes


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
