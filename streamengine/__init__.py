"""streamengine: stream an LLM's answer while the tools it calls already run."""
from loguru import logger as _logger

from .errors import (
    AllModelsFailedError, ConfigError, LlmCancelledError, LlmConnectionError, LlmError,
    LlmHttpError, LlmProtocolError, LlmStreamError, LlmTimeoutError, StreamEngineError, ToolError,
)
from .messages import (
    Chunk, CompletionOptions, Message, Response, ToolCall, ToolCallDelta, ToolSpec, Usage,
)
from .clients import LlmClient, StreamingLlmClient
from .logs import enable_logging

_logger.disable("streamengine")

__all__ = sorted([
    "AllModelsFailedError", "Chunk", "CompletionOptions", "ConfigError", "LlmCancelledError",
    "LlmClient", "LlmConnectionError", "LlmError", "LlmHttpError", "LlmProtocolError",
    "LlmStreamError", "LlmTimeoutError", "Message", "Response", "StreamEngineError",
    "StreamingLlmClient", "ToolCall", "ToolCallDelta", "ToolError", "ToolSpec", "Usage",
    "enable_logging",
])
