"""The streaming engine: answers stream to the caller while their tools already run.

Thread layout of one run (see DESIGN.md)::

    producer thread   client.stream() -> chunks            (calls.StreamingCallStrategy)
    run thread        idle timer + cap, parse, dispatch  -> EventChannel
                      after the stream: join tools, continue with the next round
    caller's thread   the ``run()`` generator: yields events, heartbeats when idle

The run thread, not the caller, parses and dispatches, so a slow consumer
(a browser on a bad line) never delays a tool's start.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Sequence

from .cancel import CancelToken, on_cancel
from .calls import make_call_strategy
from .channel import EventChannel
from .clients.base import LlmClient
from .errors import ConfigError
from .events import DoneEvent, Event, HeartbeatEvent
from .failover import ModelFailover
from .logs import component_logger
from .messages import CompletionOptions, Message, MessageLike, as_messages
from .result import EngineResult, Telemetry
from .tools import ToolExecutor, ToolRegistry, ToolResult
from .round import RoundRunner, RunState

__all__ = ["EngineConfig", "EngineResult", "StreamingEngine", "Telemetry"]

TOOL_MODES = ("auto", "xml", "native")


@dataclass(frozen=True)
class EngineConfig:
    """Limits and settings for every run of an engine; validated on construction."""

    models: Sequence[str] = ()
    max_continuations: int = 3
    max_tools_per_round: int = 3
    max_tools_total: int = 5
    tool_timeout: float = 30.0
    idle_timeout: float = 30.0
    completion_timeout: float = 60.0
    allowed_tools: Optional[Iterable[str]] = None
    tool_mode: str = "auto"
    options: Optional[CompletionOptions] = None
    max_block_chars: int = 16384
    pool_size: int = 8
    max_retries: int = 2
    chunk_size: int = 800
    chunk_overlap: int = 100
    embed_model: Optional[str] = None
    ingest_tool_results: bool = True

    def __post_init__(self) -> None:
        models = [self.models] if isinstance(self.models, str) else list(self.models)
        if not models or not all(isinstance(m, str) and m.strip() for m in models):
            raise ConfigError(
                f"EngineConfig.models must be a non-empty list of model names (first = primary), "
                f"got {self.models!r}; e.g. EngineConfig(models=['gpt-4o-mini'])"
            )
        object.__setattr__(self, "models", tuple(models))
        for name in ("max_continuations", "max_tools_per_round", "max_tools_total", "max_retries"):
            _require_int(name, getattr(self, name), minimum=0)
        for name in ("max_block_chars", "pool_size", "chunk_size"):
            _require_int(name, getattr(self, name), minimum=1)
        _require_int("chunk_overlap", self.chunk_overlap, minimum=0)
        if self.chunk_overlap >= self.chunk_size:
            raise ConfigError(f"EngineConfig.chunk_overlap ({self.chunk_overlap}) must be smaller "
                              f"than chunk_size ({self.chunk_size})")
        for name in ("tool_timeout", "idle_timeout", "completion_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or value == float("inf"):
                raise ConfigError(f"EngineConfig.{name} must be a positive number of seconds, got {value!r}")
        if self.tool_mode not in TOOL_MODES:
            raise ConfigError(f"EngineConfig.tool_mode must be one of {', '.join(TOOL_MODES)}, "
                              f"got {self.tool_mode!r}")
        if self.options is not None and not isinstance(self.options, CompletionOptions):
            raise ConfigError(f"EngineConfig.options must be a CompletionOptions, got {type(self.options).__name__}")
        if self.allowed_tools is not None:
            if isinstance(self.allowed_tools, str):
                raise ConfigError("EngineConfig.allowed_tools must be a collection of tool names, "
                                  f"not one string ({self.allowed_tools!r}); use [{self.allowed_tools!r}]")
            object.__setattr__(self, "allowed_tools", frozenset(self.allowed_tools))

    @classmethod
    def from_env(cls, environ: Optional[dict] = None, **overrides: Any) -> "EngineConfig":
        """``STREAMENGINE_MODEL`` (comma-separated failover list) plus keyword overrides."""
        env = os.environ if environ is None else environ
        raw = env.get("STREAMENGINE_MODEL", "")
        models = [m.strip() for m in raw.split(",") if m.strip()]
        if not models and "models" not in overrides:
            raise ConfigError("no model configured: set STREAMENGINE_MODEL (e.g. 'gpt-4o-mini' or "
                              "'primary,fallback') or pass EngineConfig(models=[...])")
        overrides.setdefault("models", models)
        return cls(**overrides)


def _require_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"EngineConfig.{name} must be an integer >= {minimum}, got {value!r}")


class StreamingEngine:
    """Runs conversations round by round; one engine serves many runs, from many threads.

    The engine owns a tool pool shared by its runs; ``close()`` (or leaving a
    ``with`` block) stops it.
    """

    def __init__(self, client: LlmClient, tools: Iterable[Any] = (), config: Optional[EngineConfig] = None,
                 *, rag: Any = None, observers: Sequence[Any] = (), logger: Any = None) -> None:
        if not isinstance(client, LlmClient):
            raise ConfigError(f"StreamingEngine needs an LlmClient (e.g. OpenAICompatibleClient(base_url)), "
                              f"got {type(client).__name__}")
        self.config = config if config is not None else EngineConfig.from_env()
        if not isinstance(self.config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(self.config).__name__}")
        self.client = client
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.rag = rag
        if rag is not None:
            self._register_rag_search(rag)
        self._log = component_logger("streamengine.engine.StreamingEngine", logger)
        self._executor = ToolExecutor(max_workers=self.config.pool_size, logger=logger)
        strategy = make_call_strategy(client, idle_timeout=self.config.idle_timeout,
                                      completion_timeout=self.config.completion_timeout,
                                      observers=observers, logger=logger)
        self._failover = ModelFailover(strategy, list(self.config.models),
                                       max_retries=self.config.max_retries, logger=logger)
        self._closed = False

    def _register_rag_search(self, rag: Any) -> None:
        from .rag.search_tool import make_rag_search_tool
        if "rag_search" not in self.registry:
            self.registry.register(make_rag_search_tool(rag))

    # --- public API --------------------------------------------------------------
    def run(self, messages: Sequence[MessageLike], cancel: Optional[threading.Event] = None, *,
            heartbeat_s: Optional[float] = None) -> Iterator[Event]:
        """Yield events as they happen; ``DoneEvent`` is always last.

        Stopping iteration early (``break``, ``close()``, garbage collection) or
        setting ``cancel`` shuts the provider stream down, cancels the tools and
        ends every thread the run started.  With ``heartbeat_s``, a
        ``HeartbeatEvent`` is yielded whenever nothing happened for that long.
        """
        if self._closed:
            raise ConfigError("this StreamingEngine is closed; create a new one")
        if heartbeat_s is not None and not heartbeat_s > 0:
            raise ConfigError(f"heartbeat_s must be a positive number of seconds, got {heartbeat_s!r}")
        conversation = as_messages(messages)
        if not conversation:
            raise ConfigError("messages is empty; pass at least one message, e.g. "
                              "[{'role': 'user', 'content': 'hi'}]")
        return self._events(conversation, cancel, heartbeat_s)

    def complete(self, messages: Sequence[MessageLike], cancel: Optional[threading.Event] = None) -> EngineResult:
        """Run to the end and return the result (no events)."""
        # run() always ends with DoneEvent; a deque of length 1 keeps it and
        # consumes the rest in C, not one Python loop step per token.
        last = collections.deque(self.run(messages, cancel), maxlen=1)
        assert last and isinstance(last[0], DoneEvent)
        return last[0].result

    def close(self) -> None:
        """Stop the tool pool; runs still going get their tools cancelled."""
        self._closed = True
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "StreamingEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- one run -------------------------------------------------------------------
    def _events(self, conversation: List[Message], cancel: Optional[threading.Event],
                heartbeat_s: Optional[float]) -> Iterator[Event]:
        # The run's own token: the caller's event cancels it, never the other way round.
        token = CancelToken()
        stop_watch = on_cancel(cancel, token.set)
        channel = EventChannel(cancel=token)
        state = RunState(conversation=conversation, cancel=token, emit=channel.put, started=time.monotonic())
        runner = RoundRunner(self, state)
        worker = threading.Thread(target=self._drive, args=(runner, channel), name="streamengine-run",
                                  daemon=True)
        worker.start()
        finished = False
        try:
            while True:
                items = channel.drain(heartbeat_s)
                if not items:
                    if channel.closed:
                        return
                    yield HeartbeatEvent()
                    continue
                # DoneEvent is the last event a run puts: only the last item can be one.
                yield from items
                if isinstance(items[-1], DoneEvent):
                    finished = True
                    return
        finally:
            if not finished:
                token.set()
            stop_watch()
            worker.join(timeout=self.config.completion_timeout)

    def _drive(self, runner: "RoundRunner", channel: EventChannel) -> None:
        try:
            runner.run()
        except BaseException as exc:  # never leave the caller without a DoneEvent
            self._log.opt(exception=True).error("run failed unexpectedly: {}", exc)
            runner.fail_unexpectedly(exc)
        finally:
            channel.close()

    def ingest(self, result: ToolResult) -> None:
        """File a successful tool result in the RAG store (runs on the tool's worker thread)."""
        if self.rag is None or not self.config.ingest_tool_results or not result.ok or not result.text:
            return
        if result.name == "rag_search":
            return  # re-filing search hits would only duplicate what the store already has
        from .rag import chunks_for_ingest
        try:
            chunks = chunks_for_ingest(result.text, self.config.chunk_size, self.config.chunk_overlap)
            self.rag.add_chunks(f"tool:{result.name}:{result.call_id}", chunks, self.config.embed_model)
        except Exception as exc:  # the store is an aid: a failure never fails the request
            self._log.opt(exception=True).warning("could not ingest result of tool {!r}: {}", result.name, exc)

    # used by RoundRunner
    @property
    def executor(self) -> ToolExecutor:
        return self._executor

    @property
    def failover(self) -> ModelFailover:
        return self._failover

    @property
    def log(self) -> Any:
        return self._log
