"""From command-line flags and environment variables to a client and an engine.

Every flag has its environment variable where people expect one (the openai
SDK's ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` included); a flag wins over its
variable.  A value that cannot be used is a :class:`ConfigError` naming the
flag or variable, so the command line answers with one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .._clients.base import LlmClient
from .._config import DEFAULT_COMPLETION_TIMEOUT_S, TOOL_MODES
from .._errors import ConfigError, StreamEngineError

if TYPE_CHECKING:
    from .._engine.run import StreamingEngine
    from .._messages import CompletionOptions, MessageLike, Response, ToolCall, ToolSpec
    from ..mcp import McpServer, McpTool
    from ..tools import Tool

#: ``--timeout 0`` (no cap) becomes this many seconds: the engine wants a finite number, and
#: thirty days stays under every platform's thread-wait limit (Windows: ~49 days).
NO_CAP_S = 30 * 86400.0
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
PROVIDERS = ("openai", "anthropic", "openai-responses")


class UsageError(StreamEngineError):
    """A command line that cannot be run as written (exit status 2)."""


# --------------------------------------------------------------------------- value parsers

def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from exc
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _cap_seconds(text: str) -> float:
    """``--timeout``: seconds, or 0 for no cap."""
    try:
        if float(text) == 0:
            return 0.0
    except ValueError:
        pass
    return positive_seconds(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value}")
    return value


def _key_value(separator: str) -> Callable[[str], Tuple[str, str]]:
    def parse(text: str) -> Tuple[str, str]:
        key, found, value = text.partition(separator)
        if not found or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY{separator}VALUE, got {text!r}")
        return key.strip(), value.strip() if separator == ":" else value
    return parse


def _option_value(text: str) -> Any:
    """``--option`` values are JSON when they parse (``true``, ``0.5``, ``["a"]``), else text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


# --------------------------------------------------------------------------- flags

def add_endpoint_flags(g: argparse._ActionsContainer) -> None:
    """Which API and how to reach it: every command that talks to a provider (chat, serve, models)."""
    g.add_argument("--provider", choices=PROVIDERS,
                   help="API dialect (default openai: any OpenAI-compatible server; openai-responses: "
                        "the Responses API, /v1/responses)")
    g.add_argument("--base-url", metavar="URL",
                   help="API root, e.g. http://127.0.0.1:8080/v1 (env STREAMENGINE_BASE_URL or OPENAI_BASE_URL; "
                        "default https://api.openai.com/v1; anthropic: ANTHROPIC_BASE_URL, https://api.anthropic.com)")
    g.add_argument("--api-key", "--key", metavar="KEY",
                   help="API key (env STREAMENGINE_API_KEY or OPENAI_API_KEY; anthropic: ANTHROPIC_API_KEY)")
    g.add_argument("--header", metavar="NAME:VALUE", action="append", default=[], type=_key_value(":"),
                   help="an extra HTTP header for every request (repeatable)")
    g.add_argument("--api-key-header", metavar="NAME",
                   help="send the key bare in this header instead of 'Authorization: Bearer' (Azure: api-key)")
    g.add_argument("--query", metavar="KEY=VALUE", action="append", default=[], type=_key_value("="),
                   help="a query parameter for every request (Azure: api-version=2024-10-21)")


def add_provider_flags(p: argparse.ArgumentParser) -> None:
    """Where the model is, which model, how long to wait, what to send: chat and serve share them."""
    g = p.add_argument_group("provider")
    add_endpoint_flags(g)
    g.add_argument("-m", "--model", metavar="M", action="append",
                   help="model name; repeat for a failover list, first = primary "
                        "(env STREAMENGINE_MODEL, comma-separated)")
    g.add_argument("--no-stream-options", dest="stream_options", action="store_false", default=None,
                   help="do not send stream_options (for servers that refuse it; usage is then not reported)")
    g.add_argument("--no-stream", dest="stream", action="store_false", default=True,
                   help="ask for the whole answer at once instead of a stream (tools run after it arrives)")

    t = p.add_argument_group("timeouts (seconds)")
    t.add_argument("--idle-timeout", metavar="S", type=positive_seconds,
                   help="longest silence between meaningful chunks (env STREAMENGINE_IDLE_TIMEOUT; default 30)")
    t.add_argument("--timeout", metavar="S", type=_cap_seconds,
                   help="cap on one model call, 0 = none "
                        f"(env STREAMENGINE_TIMEOUT; default {DEFAULT_COMPLETION_TIMEOUT_S:g})")
    t.add_argument("--connect-timeout", metavar="S", type=positive_seconds,
                   help="TCP/TLS connect (env STREAMENGINE_CONNECT_TIMEOUT; default 10)")
    t.add_argument("--tool-timeout", metavar="S", type=positive_seconds,
                   help="seconds a tool may run before it is abandoned (default 30)")

    m = p.add_argument_group("model and tools")
    m.add_argument("-s", "--system", metavar="TEXT", help="a system message before the conversation")
    m.add_argument("--temperature", metavar="T", type=float, help="sampling temperature")
    m.add_argument("--max-tokens", metavar="N", type=_positive_int, help="cap on tokens per answer")
    m.add_argument("-o", "--option", metavar="KEY=VALUE", action="append", default=[], type=_key_value("="),
                   help="any other request field, as KEY=VALUE or KEY VALUE; VALUE is JSON if it parses "
                        "(-o top_p=0.9 -o seed 7)")
    m.add_argument("--tools", metavar="MODULE:ATTR", action="append", default=[],
                   help="tools to offer: a @tool function, a plain function, or a list/registry of them; "
                        "a bare file.py offers every @tool it defines (repeatable; the current directory "
                        "is importable)")
    m.add_argument("--tool-mode", choices=TOOL_MODES,
                   help="how the model calls tools: inline <tool> blocks in the text (works on any server, "
                        "e.g. llama-server without --jinja), the provider's native tool API, or auto: both "
                        "(default auto)")
    m.add_argument("--max-continuations", metavar="N", type=int,
                   help="revised-answer rounds after tool calls (default 3)")
    m.add_argument("--failover-after-tokens", action="store_true",
                   help="when a model fails mid-answer and another -m model is left, restart the round on it "
                        "(a marker on stderr says to discard the text shown)")
    add_mcp_flags(p)


def add_mcp_flags(p: argparse.ArgumentParser) -> None:
    """``--mcp``/``--mcp-url``/``--mcp-header``: MCP servers' tools (chat, serve, harness, mcp list)."""
    g = p.add_argument_group("MCP servers (tools; needs pip install 'streamengine[mcp]')")
    g.add_argument("--mcp", metavar='"COMMAND ARGS..."', action="append", default=[],
                   help="an MCP server to start over stdio, as one quoted argument (repeatable), "
                        "e.g. --mcp \"mcp-server-time --local-timezone UTC\"")
    g.add_argument("--mcp-url", metavar="URL", action="append", default=[],
                   help="a streamable-HTTP MCP server, e.g. http://127.0.0.1:8931/mcp (repeatable)")
    g.add_argument("--mcp-header", metavar="NAME:VALUE", action="append", default=[], type=_key_value(":"),
                   help="a header for the --mcp-url servers (repeatable); --header and the API key never go there")
    g.add_argument("--mcp-trust", action="store_true",
                   help="trust the servers' tool annotations: a tool marked read-only (and not destructive) "
                        "starts mid-stream without approval; by default every MCP tool counts as one with "
                        "side effects")


def open_mcp_servers(args: argparse.Namespace) -> List[McpServer]:
    """The started ``--mcp``/``--mcp-url`` servers (none without those flags); close with ``close_mcp_servers``."""
    if not (getattr(args, "mcp", None) or getattr(args, "mcp_url", None) or getattr(args, "mcp_header", None)):
        return []
    try:
        from ..mcp._cli import open_servers
    except ImportError as exc:
        raise ConfigError(f"--mcp/--mcp-url: {exc}") from exc
    return open_servers(args.mcp, args.mcp_url, dict(args.mcp_header), trust=getattr(args, "mcp_trust", False))


def mcp_tools(servers: Sequence[McpServer], args: argparse.Namespace) -> List[McpTool]:
    """The started servers' tools, their annotations trusted only with ``--mcp-trust``."""
    if not servers:
        return []
    from ..mcp._cli import server_tools

    return server_tools(servers, trust=getattr(args, "mcp_trust", False))


def close_mcp_servers(servers: Sequence[McpServer]) -> None:
    for server in servers:
        server.close()


# --------------------------------------------------------------------------- engine from flags

def models_from(args: argparse.Namespace, environ: Mapping[str, str]) -> List[str]:
    raw = args.model or [environ.get("STREAMENGINE_MODEL", "")]
    models = [m.strip() for item in raw for m in item.split(",") if m.strip()]
    if not models:
        raise ConfigError("no model: pass -m/--model NAME (repeat it for a failover list) or set STREAMENGINE_MODEL")
    return models


def _env_seconds(environ: Mapping[str, str], name: str, parse: Callable[[str], float]) -> Optional[float]:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def connect_timeout_of(args: argparse.Namespace, environ: Mapping[str, str]) -> Optional[float]:
    """``--connect-timeout``, else ``STREAMENGINE_CONNECT_TIMEOUT``, else None (the client's default)."""
    return args.connect_timeout or _env_seconds(environ, "STREAMENGINE_CONNECT_TIMEOUT", positive_seconds)


def _seconds(args: argparse.Namespace, environ: Mapping[str, str]) -> Dict[str, float]:
    idle = args.idle_timeout or _env_seconds(environ, "STREAMENGINE_IDLE_TIMEOUT", positive_seconds)
    cap = args.timeout if args.timeout is not None else _env_seconds(environ, "STREAMENGINE_TIMEOUT", _cap_seconds)
    connect = connect_timeout_of(args, environ)
    seconds: Dict[str, float] = {"completion_timeout": NO_CAP_S if cap == 0 else (cap or DEFAULT_COMPLETION_TIMEOUT_S)}
    if idle is not None:
        seconds["idle_timeout"] = idle
    if connect is not None:
        seconds["connect_timeout"] = connect
    return seconds


#: Request fields a flag owns: ``-o`` may not set them behind the flag's back.
_FLAG_OWNED = {"model": "-m/--model", "stream": "--no-stream", "stream_options": "--no-stream-options",
               "messages": "the prompt", "tools": "--tools"}
#: Fields ``-o`` may set when their flag is not given (``-o temperature 0.5``, as ``llm`` takes it).
_FLAG_FIELDS = {"temperature": "--temperature", "max_tokens": "--max-tokens"}


def _completion_options(args: argparse.Namespace) -> Optional[CompletionOptions]:
    from .._config import completion_options

    extra = {key: _option_value(value) for key, value in args.option}
    for key in extra:
        if key in _FLAG_OWNED:
            raise ConfigError(f"-o {key} is not an option here: use {_FLAG_OWNED[key]} instead")
        if key in _FLAG_FIELDS and getattr(args, key) is not None:
            raise ConfigError(f"-o {key} and {_FLAG_FIELDS[key]} both set {key}; pass one of them")
    fields = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    fields = {key: value for key, value in fields.items() if value is not None}
    if not fields and not extra:
        return None
    return completion_options({**extra, **fields}, "-o/--option")


def _tools(specs: Sequence[str]) -> List[Tool]:
    from ..tools._tool import load_tools

    tools: List[Tool] = []
    for spec in specs:
        tools.extend(load_tools(spec))
    return tools


def refuse(call: ToolCall) -> bool:
    """The command line's answer when nobody was asked: no."""
    return False


def build_engine(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None, *,
                 approve: Callable[[ToolCall], bool] = refuse) -> StreamingEngine:
    """The engine the flags describe; its client is closed again if anything after it fails.

    ``approve`` answers for side-effect tool calls (chat's question, serve's
    ``--approve all``); without one they are refused, whatever the library's
    own default.
    """
    from .._config import EngineConfig
    from .._engine.run import StreamingEngine

    env = os.environ if environ is None else environ
    seconds = _seconds(args, env)
    connect = seconds.pop("connect_timeout", None)
    config: Dict[str, Any] = {"models": models_from(args, env), **seconds}
    if args.max_continuations is not None:
        config["max_continuations"] = args.max_continuations
    if args.tool_timeout is not None:
        config["tool_timeout"] = args.tool_timeout
    if getattr(args, "failover_after_tokens", False):
        config["failover_after_tokens"] = True
    if getattr(args, "tool_mode", None):
        config["tool_mode"] = args.tool_mode
    options = _completion_options(args)
    if options is not None:
        config["options"] = options
    engine_config = EngineConfig(**config)
    tools = _tools(args.tools)
    servers = open_mcp_servers(args)
    try:
        client = build_client(args, env, connect)
        if getattr(args, "stream", True) is False:
            client = WholeAnswers(client)
        try:
            if options is not None and args.provider == "openai-responses":
                from .._clients.responses import responses_body

                responses_body([], None, options, stream=True)  # options it has no equivalent for: refused now
            engine = StreamingEngine(client, [*tools, *mcp_tools(servers, args)], engine_config, approve=approve)
        except BaseException:
            client.close()
            raise
    except BaseException:
        close_mcp_servers(servers)
        raise
    _ENGINE_SERVERS[engine] = servers  # close_engine closes them after the engine
    return engine


def build_client(args: argparse.Namespace, environ: Mapping[str, str],
                 connect_timeout: Optional[float]) -> LlmClient:
    provider = args.provider or "openai"
    headers = dict(args.header)
    if provider == "anthropic":
        return _anthropic_client(args, environ, headers, connect_timeout)
    from .._clients.openai import env_api_key, env_base_url

    kwargs: Dict[str, Any] = {"headers": headers, "query": dict(args.query)}
    if connect_timeout is not None:
        kwargs["connect_timeout"] = connect_timeout
    if args.api_key_header:
        kwargs["api_key_header"] = args.api_key_header
    if args.stream_options is False:
        if provider == "openai-responses":
            raise ConfigError("--no-stream-options only applies to --provider openai "
                              "(the Responses API reports usage without being asked)")
        kwargs["stream_options"] = False
    client_class: Callable[..., LlmClient]
    if provider == "openai-responses":
        from .._clients.responses import OpenAIResponsesClient
        client_class = OpenAIResponsesClient
    else:
        from .._clients.openai import OpenAICompatibleClient
        client_class = OpenAICompatibleClient

    return client_class(args.base_url or env_base_url(environ), args.api_key or env_api_key(environ), **kwargs)


def _anthropic_client(args: argparse.Namespace, environ: Mapping[str, str], headers: Dict[str, str],
                      connect_timeout: Optional[float]) -> LlmClient:
    """``streamengine._clients.anthropic.AnthropicClient``, imported only when asked for."""
    openai_only = [flag for flag, used in (("--no-stream-options", args.stream_options is False),
                                           ("--query", bool(args.query)),
                                           ("--api-key-header", bool(args.api_key_header))) if used]
    if openai_only:
        raise ConfigError(f"{', '.join(openai_only)} only apply to --provider openai and openai-responses")
    try:
        module = importlib.import_module("streamengine._clients.anthropic")
    except ModuleNotFoundError as exc:
        if exc.name not in ("streamengine._clients.anthropic", "streamengine._clients"):
            raise
        raise ConfigError("--provider anthropic needs streamengine._clients.anthropic, which this installation "
                          "does not include; upgrade streamengine, or reach the model through an "
                          "OpenAI-compatible endpoint with --provider openai") from exc
    client_class: Callable[..., LlmClient] = module.AnthropicClient
    accepted = inspect.signature(client_class).parameters
    kwargs: Dict[str, Any] = {}
    if headers:
        if "headers" not in accepted:
            raise ConfigError("--header is not supported by this AnthropicClient")
        kwargs["headers"] = headers
    if connect_timeout is not None and "connect_timeout" in accepted:
        kwargs["connect_timeout"] = connect_timeout
    base_url = args.base_url or environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE_URL
    api_key = args.api_key or environ.get("ANTHROPIC_API_KEY") or None
    return client_class(base_url=base_url, api_key=api_key, **kwargs)


class WholeAnswers(LlmClient):
    """``--no-stream``: the client without its stream, so the engine asks for whole answers.

    The engine picks the buffered call path for a client that cannot stream;
    wrapping is the one switch that needs no flag in every layer below.
    """

    def __init__(self, client: LlmClient) -> None:
        self.inner = client
        self.base_url = getattr(client, "base_url", None)

    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None) -> Response:
        return self.inner.complete(messages, tools=tools, options=options, cancel=cancel)

    def close(self) -> None:
        self.inner.close()


#: The MCP servers ``build_engine`` opened for each engine it made, closed by ``close_engine``.
_ENGINE_SERVERS: weakref.WeakKeyDictionary[StreamingEngine, List[McpServer]] = weakref.WeakKeyDictionary()


def close_engine(engine: StreamingEngine) -> None:
    try:
        engine.close()
    finally:
        try:
            engine.client.close()
        finally:
            close_mcp_servers(_ENGINE_SERVERS.pop(engine, []))
