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
    **dict.fromkeys(["StreamingEngine"], "._engine.run"),
    **dict.fromkeys(["EngineConfig"], "._config"),
    **dict.fromkeys(["EngineResult", "Telemetry"], "._engine.result"),
    **dict.fromkeys(["DoneEvent", "ErrorEvent", "Event", "HeartbeatEvent", "RefusalEvent", "ResetEvent", "RoundEvent",
                     "TokenEvent", "ToolResultEvent", "ToolStartEvent"], "._engine.events"),
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
                     "StreamEngineError", "ToolError"], "._errors"),
    **dict.fromkeys(["LLM_WARNING", "Chunk", "CompletionOptions", "Message", "Response", "ToolCall",
                     "ToolCallDelta", "ToolResult", "ToolSpec", "Usage"], "._messages"),
    **dict.fromkeys(["ToolContext"], "._messages"),
    **dict.fromkeys(["RunFailedError"], "._engine.run"),
    **dict.fromkeys(["Tool", "ToolRegistry", "tool"], ".tools._tool"),
    **dict.fromkeys(["PostgresRagStore"], ".rag._postgres"),
    **dict.fromkeys(["SqliteRagStore"], ".rag._sqlite"),
    **dict.fromkeys(["OpenAIEmbedder", "HashingEmbedder"], ".rag._chunking"),
    **dict.fromkeys(["CancelToken"], "._cancel"),
    **dict.fromkeys(["enable_logging"], "._logs"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:  # type checkers and IDEs see ordinary imports
    from ._calls.failover import ErrorClass, ErrorClassifier
    from ._calls.hooks import ModelChunkEvent, Observer
    from ._cancel import CancelToken
    from ._clients.anthropic import AnthropicClient
    from ._clients.base import LlmClient, StreamingLlmClient
    from ._clients.http.connection import CancellableAdapter
    from ._clients.openai import OpenAICompatibleClient
    from ._clients.responses import OpenAIResponsesClient
    from ._clients.routed import RoutedClient
    from ._clients.scripted import ScriptedClient
    from ._config import EngineConfig
    from ._engine.events import (
        DoneEvent,
        ErrorEvent,
        Event,
        HeartbeatEvent,
        RefusalEvent,
        ResetEvent,
        RoundEvent,
        TokenEvent,
        ToolResultEvent,
        ToolStartEvent,
    )
    from ._engine.result import EngineResult, Telemetry
    from ._engine.run import RunFailedError, StreamingEngine
    from ._errors import (
        AllModelsFailedError,
        ConfigError,
        LlmCancelledError,
        LlmConnectionError,
        LlmError,
        LlmHttpError,
        LlmOutputLimitError,
        LlmProtocolError,
        LlmStreamError,
        LlmTimeoutError,
        StreamEngineError,
        ToolError,
    )
    from ._logs import enable_logging
    from ._messages import (
        LLM_WARNING,
        Chunk,
        CompletionOptions,
        Message,
        Response,
        ToolCall,
        ToolCallDelta,
        ToolContext,
        ToolResult,
        ToolSpec,
        Usage,
    )
    from .rag._chunking import HashingEmbedder, OpenAIEmbedder
    from .rag._postgres import PostgresRagStore
    from .rag._sqlite import SqliteRagStore
    from .tools._tool import Tool, ToolRegistry, tool


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
