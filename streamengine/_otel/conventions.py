"""The OpenTelemetry GenAI semantic conventions this engine follows: names, values, and what is captured.

One home for every attribute name, so a span and a metric never spell one
differently.  The conventions are still marked *development*; the names here
are those of semantic-conventions 1.37+ (``gen_ai.provider.name`` rather than
the older ``gen_ai.system``).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlsplit

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_STREAM = "gen_ai.request.stream"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT = "gen_ai.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
USAGE_REASONING = "gen_ai.usage.reasoning.output_tokens"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOKEN_TYPE = "gen_ai.token.type"

#: The event the conventions give for content recorded as an event rather than on the span.
CONTENT_EVENT = "gen_ai.client.inference.operation.details"
#: The event marking the first meaningful chunk of a streamed call.
FIRST_CHUNK_EVENT = "gen_ai.first_chunk"

#: The conventions' metric names (histograms) and the engine's own, under ``streamengine.``.
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
METRIC_AGENT_DURATION = "gen_ai.invoke_agent.duration"
METRIC_TOOL_DURATION = "gen_ai.execute_tool.duration"
METRIC_TOOL_BEHIND_ANSWER = "streamengine.tool.time_behind_answer"
METRIC_TOOL_QUEUE_WAIT = "streamengine.tool.queue_wait"

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


class Capture:
    """Where message content goes: nowhere (the default), on the span, as an event, or both."""

    def __init__(self, on_span: bool, as_event: bool) -> None:
        self.on_span = on_span
        self.as_event = as_event

    @property
    def any(self) -> bool:
        return self.on_span or self.as_event

    @classmethod
    def resolve(cls, capture_content: Optional[bool], environ: Optional[Dict[str, str]] = None) -> Capture:
        """``capture_content=True/False`` wins; otherwise the environment variable, read as the conventions do.

        ``true`` (any case) means on the span, as opentelemetry-instrumentation-openai-v2
        reads it; the newer values ``SPAN_ONLY``, ``EVENT_ONLY``, ``SPAN_AND_EVENT``
        and ``NO_CONTENT`` are understood too; anything else captures nothing.
        """
        if capture_content is not None:
            return cls(bool(capture_content), False)
        value = (environ if environ is not None else os.environ).get(CAPTURE_ENV, "").strip().upper()
        return {"TRUE": cls(True, False), "SPAN_ONLY": cls(True, False), "EVENT_ONLY": cls(False, True),
                "SPAN_AND_EVENT": cls(True, True)}.get(value, cls(False, False))


def provider_of(client: Any) -> str:
    """``gen_ai.provider.name``: the client's own ``provider_name`` if it has one, else by its wire."""
    named = getattr(client, "provider_name", None)
    if isinstance(named, str) and named:
        return named
    kind = type(client).__name__
    if "Anthropic" in kind:
        return "anthropic"
    if "OpenAI" in kind:
        return "openai"
    return kind


def server_of(base_url: Optional[str]) -> Dict[str, Any]:
    """``server.address`` / ``server.port`` of a provider's base URL (the default port filled in)."""
    if not base_url:
        return {}
    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {SERVER_ADDRESS: parts.hostname, SERVER_PORT: port}


def error_type(exc: BaseException) -> str:
    """Low-cardinality, as the conventions ask: an HTTP status code, else the exception's class name."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return str(status)
    return type(exc).__name__


def request_attributes(options: Any) -> Dict[str, Any]:
    """The request settings the conventions name, when they are set."""
    out: Dict[str, Any] = {}
    for field, key in (("max_tokens", REQUEST_MAX_TOKENS), ("temperature", REQUEST_TEMPERATURE),
                       ("top_p", REQUEST_TOP_P)):
        value = getattr(options, field, None)
        if value is not None:
            out[key] = value
    return out


def usage_attributes(usage: Any) -> Dict[str, int]:
    """Token counts the provider sent; optional ones only when it sent them."""
    if usage is None:
        return {}
    out = {USAGE_INPUT: int(getattr(usage, "prompt_tokens", 0) or 0),
           USAGE_OUTPUT: int(getattr(usage, "completion_tokens", 0) or 0)}
    for field, key in (("cached_tokens", USAGE_CACHE_READ), ("reasoning_tokens", USAGE_REASONING)):
        value = getattr(usage, field, None)
        if value:
            out[key] = int(value)
    return out


def input_messages(messages: Iterable[Any]) -> str:
    """The conventions' JSON form of a conversation: ``[{"role": ..., "parts": [...]}]``."""
    out: List[Dict[str, Any]] = []
    for message in messages:
        parts: List[Dict[str, Any]] = []
        if getattr(message, "content", ""):
            kind = "tool_call_response" if message.role == "tool" else "text"
            part: Dict[str, Any] = {"type": kind, ("response" if kind != "text" else "content"): message.content}
            if kind != "text":
                part["id"] = message.tool_call_id
            parts.append(part)
        for call in getattr(message, "tool_calls", ()) or ():
            parts.append(_tool_call_part(call))
        out.append({"role": message.role, "parts": parts})
    return json.dumps(out, ensure_ascii=False)


def output_messages(text: str, calls: Iterable[Any], finish_reason: Optional[str]) -> str:
    parts: List[Dict[str, Any]] = [{"type": "text", "content": text}] if text else []
    parts += [_tool_call_part(call) for call in calls]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": finish_reason or "stop"}],
                      ensure_ascii=False)


def _tool_call_part(call: Any) -> Dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = call.arguments
    return {"type": "tool_call", "id": call.id, "name": call.name, "arguments": arguments}


def finish_reasons(reason: Optional[str]) -> Tuple[str, ...]:
    return (reason,) if reason else ()
