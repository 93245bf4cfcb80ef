"""streamengine: stream an LLM's answer while the tools it calls already run.

The public face: ``__all__`` holds what a user of the engine needs — the
engine and its config and result, the events a caller handles, clients,
tools, errors, stores and logging.  Building blocks (call strategies,
accumulators, the inline scanner, the tool executor, failover) are imported
from their modules, e.g. ``from streamengine.calls import make_call_strategy``.
The web pieces (``streamengine.wsgi``), the CLI and ``streamengine.testing``
(the ``FakeProvider``) are imported from their modules too, so a plain
script does not pay for http.server or waitress.
"""
import importlib as _importlib
from typing import Any as _Any

from loguru import logger as _logger

from ._cancel import CancelToken
from ._clients.anthropic.client import AnthropicClient
from ._clients.base import LlmClient, StreamingLlmClient
from ._clients.openai.client import OpenAICompatibleClient
from ._clients.routed import RoutedClient
from ._clients.scripted import ScriptedClient
from ._config import EngineConfig
from ._engine.run import StreamingEngine
from ._errors import (
    AllModelsFailedError, ConfigError, LlmCancelledError, LlmConnectionError, LlmError, LlmHttpError,
    LlmProtocolError, LlmStreamError, LlmTimeoutError, StreamEngineError, ToolError,
)
from ._engine.events import (
    DoneEvent, ErrorEvent, Event, HeartbeatEvent, ResetEvent, RoundEvent, TokenEvent, ToolResultEvent,
    ToolStartEvent,
)
from ._calls.hooks import ModelChunkEvent, Observer
from ._calls.failover import ErrorClass, ErrorClassifier
from ._logs import enable_logging
from ._messages import Chunk, CompletionOptions, Message, Response, ToolCall, ToolCallDelta, ToolSpec, Usage
from .rag import Embedder, HashingEmbedder, Hit, OpenAIEmbedder, PostgresRagStore, RagStore, SqliteRagStore
from ._engine.result import EngineResult, Telemetry
from .tools import Tool, ToolContext, ToolRegistry, ToolResult, tool

_logger.disable("streamengine")

__version__ = "0.1.0"

__all__ = [
    "AllModelsFailedError",
    "AnthropicClient",
    "CancelToken",
    "Chunk",
    "CompletionOptions",
    "ConfigError",
    "DoneEvent",
    "Embedder",
    "EngineConfig",
    "EngineResult",
    "ErrorClass",
    "ErrorClassifier",
    "ErrorEvent",
    "Event",
    "HashingEmbedder",
    "HeartbeatEvent",
    "Hit",
    "LlmCancelledError",
    "LlmClient",
    "LlmConnectionError",
    "LlmError",
    "LlmHttpError",
    "LlmProtocolError",
    "LlmStreamError",
    "LlmTimeoutError",
    "Message",
    "ModelChunkEvent",
    "Observer",
    "OpenAICompatibleClient",
    "OpenAIEmbedder",
    "PostgresRagStore",
    "RagStore",
    "ResetEvent",
    "Response",
    "RoundEvent",
    "RoutedClient",
    "ScriptedClient",
    "SqliteRagStore",
    "StreamEngineError",
    "StreamingEngine",
    "StreamingLlmClient",
    "Telemetry",
    "TokenEvent",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "ToolResultEvent",
    "ToolSpec",
    "ToolStartEvent",
    "Usage",
    "enable_logging",
    "tool",
]

#: Building blocks that used to be exported here; still importable from the
#: package (resolved on first use), but their home is the module named.
_BUILDING_BLOCKS = {
    "BufferedCallStrategy": "calls", "CallStrategy": "calls", "StreamingCallStrategy": "calls",
    "make_call_strategy": "calls", "ResponseAggregator": "accumulate", "ToolCallAccumulator": "accumulate",
    "build_continuation_message": "continuation", "EventEmitter": "events", "FailoverResult": "failover",
    "ModelFailover": "failover", "FeedResult": "inline", "XmlParseState": "inline",
    "InlineToolScanner": "inline", "chunks_for_ingest": "rag", "ToolExecutor": "tools", "ToolHandle": "tools",
}


def __getattr__(name: str) -> _Any:
    module = _BUILDING_BLOCKS.get(name)
    if module is None:
        raise AttributeError(f"module 'streamengine' has no attribute {name!r}")
    return getattr(_importlib.import_module(f".{module}", __name__), name)
