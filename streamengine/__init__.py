"""streamengine: stream an LLM's answer while the tools it calls already run.

The public face.  ``__all__`` holds what a user of the engine needs: the
engine, its config and result, the events a caller handles, the clients,
tools, errors, stores and logging.  The web pieces live in
``streamengine.web`` (``streamengine.wsgi`` is their stable import path),
the test kit in ``streamengine.testing``, tools in ``streamengine.tools``
and the RAG stores in ``streamengine.rag``.  Every other module is private
(its name starts with ``_``) and may change without notice.

Names are imported on first use, not here: ``import streamengine`` costs a
few milliseconds, and a script that never builds a client never imports
``requests``, one that never files a result never imports ``sqlite3``.
"""
from __future__ import annotations

import importlib as _importlib
import sys as _sys
from typing import TYPE_CHECKING
from typing import Any as _Any
from typing import Dict as _Dict
from typing import List as _List

__version__ = "0.1.0"

#: Each public name and the private module that defines it.
_HOMES: _Dict[str, str] = {
    **dict.fromkeys(["Run", "StreamingEngine"], "._engine.run"),
    **dict.fromkeys(["EngineConfig"], "._config"),
    **dict.fromkeys(["EngineResult", "Telemetry"], "._engine.result"),
    **dict.fromkeys(["Checkpoint", "InterruptedCall"], "._engine.checkpoint"),
    **dict.fromkeys(["DoneEvent", "ErrorEvent", "Event", "HeartbeatEvent", "ReasoningEvent", "RefusalEvent",
                     "ResetEvent", "RoundEvent", "TokenEvent", "ToolResultEvent", "ToolStartEvent"], "._engine.events"),
    **dict.fromkeys(["ModelChunkEvent", "Observer"], "._calls.hooks"),
    **dict.fromkeys(["ErrorClass", "ErrorClassifier"], "._calls.failover"),
    **dict.fromkeys(["LlmClient", "StreamingLlmClient"], "._clients.base"),
    **dict.fromkeys(["OpenAICompatibleClient"], "._clients.openai"),
    **dict.fromkeys(["OpenAIResponsesClient"], "._clients.responses"),
    **dict.fromkeys(["AnthropicClient"], "._clients.anthropic"),
    **dict.fromkeys(["RoutedClient"], "._clients.routed"),
    **dict.fromkeys(["ScriptedClient"], "._clients.scripted"),
    **dict.fromkeys(["CancellableAdapter"], "._clients.http.connection"),
    **dict.fromkeys(["AllModelsFailedError", "ConfigError", "LlmCancelledError", "LlmConnectionError", "LlmError",
                     "LlmHttpError", "LlmOutputLimitError", "LlmProtocolError", "LlmStreamError", "LlmTimeoutError",
                     "PartNotCarriedError", "RunFailedError", "StreamEngineError", "ToolError"], "._errors"),
    **dict.fromkeys(["LLM_WARNING", "Chunk", "CompletionOptions", "Message", "ProviderItem", "Response",
                     "StopReason", "ToolCall", "ToolCallDelta", "ToolResult", "ToolSpec", "Usage"], "._messages"),
    **dict.fromkeys(["ToolContext"], "._messages"),
    **dict.fromkeys(["AudioPart", "FilePart", "ImagePart", "TextPart"], "._parts"),
    **dict.fromkeys(["Tool", "ToolRegistry", "tool"], ".tools._tool"),
    **dict.fromkeys(["PostgresRagStore"], ".rag._postgres"),
    **dict.fromkeys(["SqliteRagStore"], ".rag._sqlite"),
    **dict.fromkeys(["OpenAIEmbedder", "HashingEmbedder"], ".rag._chunking"),
    **dict.fromkeys(["CancelToken"], "._cancel"),
    **dict.fromkeys(["enable_logging"], "._logs"),
}

#: Literal, so type checkers and IDEs read it; tests/test_public_api.py checks it against ``_HOMES``.
__all__ = [
    "AllModelsFailedError", "AnthropicClient", "AudioPart", "CancelToken", "CancellableAdapter", "Checkpoint",
    "Chunk", "CompletionOptions", "ConfigError", "DoneEvent", "EngineConfig", "EngineResult", "ErrorClass",
    "ErrorClassifier", "ErrorEvent", "Event", "FilePart", "HashingEmbedder", "HeartbeatEvent", "ImagePart",
    "InterruptedCall", "LLM_WARNING",
    "LlmCancelledError", "LlmClient", "LlmConnectionError", "LlmError", "LlmHttpError", "LlmOutputLimitError",
    "LlmProtocolError", "LlmStreamError", "LlmTimeoutError", "Message", "ModelChunkEvent", "Observer",
    "OpenAICompatibleClient", "OpenAIEmbedder", "OpenAIResponsesClient", "PartNotCarriedError", "PostgresRagStore",
    "ProviderItem",
    "ReasoningEvent", "RefusalEvent", "ResetEvent", "Response", "RoundEvent", "RoutedClient", "Run", "RunFailedError",
    "ScriptedClient", "SqliteRagStore", "StopReason", "StreamEngineError", "StreamingEngine", "StreamingLlmClient",
    "Telemetry", "TextPart", "TokenEvent", "Tool", "ToolCall", "ToolCallDelta", "ToolContext", "ToolError",
    "ToolRegistry", "ToolResult", "ToolResultEvent", "ToolSpec", "ToolStartEvent", "Usage", "enable_logging", "tool",
]

if TYPE_CHECKING:  # type checkers and IDEs see ordinary imports
    from ._calls.failover import ErrorClass as ErrorClass
    from ._calls.failover import ErrorClassifier as ErrorClassifier
    from ._calls.hooks import ModelChunkEvent as ModelChunkEvent
    from ._calls.hooks import Observer as Observer
    from ._cancel import CancelToken as CancelToken
    from ._clients.anthropic import AnthropicClient as AnthropicClient
    from ._clients.base import LlmClient as LlmClient
    from ._clients.base import StreamingLlmClient as StreamingLlmClient
    from ._clients.http.connection import CancellableAdapter as CancellableAdapter
    from ._clients.openai import OpenAICompatibleClient as OpenAICompatibleClient
    from ._clients.responses import OpenAIResponsesClient as OpenAIResponsesClient
    from ._clients.routed import RoutedClient as RoutedClient
    from ._clients.scripted import ScriptedClient as ScriptedClient
    from ._config import EngineConfig as EngineConfig
    from ._engine.checkpoint import Checkpoint as Checkpoint
    from ._engine.checkpoint import InterruptedCall as InterruptedCall
    from ._engine.events import DoneEvent as DoneEvent
    from ._engine.events import ErrorEvent as ErrorEvent
    from ._engine.events import Event as Event
    from ._engine.events import HeartbeatEvent as HeartbeatEvent
    from ._engine.events import ReasoningEvent as ReasoningEvent
    from ._engine.events import RefusalEvent as RefusalEvent
    from ._engine.events import ResetEvent as ResetEvent
    from ._engine.events import RoundEvent as RoundEvent
    from ._engine.events import TokenEvent as TokenEvent
    from ._engine.events import ToolResultEvent as ToolResultEvent
    from ._engine.events import ToolStartEvent as ToolStartEvent
    from ._engine.result import EngineResult as EngineResult
    from ._engine.result import Telemetry as Telemetry
    from ._engine.run import Run as Run
    from ._engine.run import StreamingEngine as StreamingEngine
    from ._errors import AllModelsFailedError as AllModelsFailedError
    from ._errors import ConfigError as ConfigError
    from ._errors import LlmCancelledError as LlmCancelledError
    from ._errors import LlmConnectionError as LlmConnectionError
    from ._errors import LlmError as LlmError
    from ._errors import LlmHttpError as LlmHttpError
    from ._errors import LlmOutputLimitError as LlmOutputLimitError
    from ._errors import LlmProtocolError as LlmProtocolError
    from ._errors import LlmStreamError as LlmStreamError
    from ._errors import LlmTimeoutError as LlmTimeoutError
    from ._errors import PartNotCarriedError as PartNotCarriedError
    from ._errors import RunFailedError as RunFailedError
    from ._errors import StreamEngineError as StreamEngineError
    from ._errors import ToolError as ToolError
    from ._logs import enable_logging as enable_logging
    from ._messages import LLM_WARNING as LLM_WARNING
    from ._messages import Chunk as Chunk
    from ._messages import CompletionOptions as CompletionOptions
    from ._messages import Message as Message
    from ._messages import ProviderItem as ProviderItem
    from ._messages import Response as Response
    from ._messages import StopReason as StopReason
    from ._messages import ToolCall as ToolCall
    from ._messages import ToolCallDelta as ToolCallDelta
    from ._messages import ToolContext as ToolContext
    from ._messages import ToolResult as ToolResult
    from ._messages import ToolSpec as ToolSpec
    from ._messages import Usage as Usage
    from ._parts import AudioPart as AudioPart
    from ._parts import FilePart as FilePart
    from ._parts import ImagePart as ImagePart
    from ._parts import TextPart as TextPart
    from .rag._chunking import HashingEmbedder as HashingEmbedder
    from .rag._chunking import OpenAIEmbedder as OpenAIEmbedder
    from .rag._postgres import PostgresRagStore as PostgresRagStore
    from .rag._sqlite import SqliteRagStore as SqliteRagStore
    from .tools._tool import Tool as Tool
    from .tools._tool import ToolRegistry as ToolRegistry
    from .tools._tool import tool as tool


if "loguru" in _sys.modules:  # a host that logs with loguru: be silent in it from the start (costs nothing)
    from ._logs import loguru_logger as _loguru_logger
    _loguru_logger()


def __getattr__(name: str) -> _Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'streamengine' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> _List[str]:
    return sorted(set(globals()) | set(__all__))
