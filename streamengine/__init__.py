"""streamengine: stream an LLM's answer while the tools it calls already run.

The public face: everything a user needs is importable from here.  The web
pieces (``streamengine.wsgi``), the CLI and ``streamengine.testing`` (the
``FakeProvider``) are imported from their modules, so a plain script does not
pay for http.server or waitress.
"""
from loguru import logger as _logger

from .accumulate import ResponseAggregator, ToolCallAccumulator
from .calls import BufferedCallStrategy, CallStrategy, StreamingCallStrategy, make_call_strategy
from .cancel import CancelToken
from .clients import LlmClient, OpenAICompatibleClient, ScriptedClient, StreamingLlmClient
from .continuation import build_continuation_message
from .engine import EngineConfig, StreamingEngine
from .errors import (
    AllModelsFailedError, ConfigError, LlmCancelledError, LlmConnectionError, LlmError,
    LlmHttpError, LlmProtocolError, LlmStreamError, LlmTimeoutError, StreamEngineError, ToolError,
)
from .events import (
    DoneEvent, ErrorEvent, Event, EventEmitter, HeartbeatEvent, ModelChunkEvent, Observer,
    RoundEvent, TokenEvent, ToolResultEvent, ToolStartEvent,
)
from .failover import ErrorClass, ErrorClassifier, FailoverResult, ModelFailover
from .inline import FeedResult, XmlParseState
from .logs import enable_logging
from .messages import (
    Chunk, CompletionOptions, Message, Response, ToolCall, ToolCallDelta, ToolSpec, Usage,
)
from .rag import (
    Embedder, HashingEmbedder, Hit, OpenAIEmbedder, RagStore, SqliteRagStore, chunks_for_ingest,
)
from .result import EngineResult, Telemetry
from .tools import Tool, ToolContext, ToolExecutor, ToolHandle, ToolRegistry, ToolResult, tool

_logger.disable("streamengine")

__version__ = "0.1.0"

__all__ = [
    "AllModelsFailedError",
    "BufferedCallStrategy",
    "CallStrategy",
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
    "EventEmitter",
    "FailoverResult",
    "FeedResult",
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
    "ModelFailover",
    "Observer",
    "OpenAICompatibleClient",
    "OpenAIEmbedder",
    "RagStore",
    "Response",
    "ResponseAggregator",
    "RoundEvent",
    "ScriptedClient",
    "SqliteRagStore",
    "StreamEngineError",
    "StreamingCallStrategy",
    "StreamingEngine",
    "StreamingLlmClient",
    "Telemetry",
    "TokenEvent",
    "Tool",
    "ToolCall",
    "ToolCallAccumulator",
    "ToolCallDelta",
    "ToolContext",
    "ToolError",
    "ToolExecutor",
    "ToolHandle",
    "ToolRegistry",
    "ToolResult",
    "ToolResultEvent",
    "ToolSpec",
    "ToolStartEvent",
    "Usage",
    "XmlParseState",
    "build_continuation_message",
    "chunks_for_ingest",
    "enable_logging",
    "make_call_strategy",
    "tool",
]
