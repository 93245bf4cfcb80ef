"""The Anthropic Messages format: our messages in, its answers and errors out.

Kept apart from the transport (``anthropic.py``) and the stream parser
(``anthropic_stream.py``) because it is pure data: no I/O, easy to test.

Requests differ from the OpenAI shape in ways the API enforces:

* system messages go to the top-level ``system`` field;
* an assistant's tool calls are ``tool_use`` content blocks, and the answers
  (``tool`` role messages) are ``tool_result`` blocks in a *user* message;
* roles must alternate, so consecutive messages of one role are merged into
  one message of content blocks (tool results stay first, as required);
* empty text blocks are refused by the API, so empty texts are left out;
* ``max_tokens`` is required: the client's default is sent when the options
  give none.
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..._errors import ConfigError, LlmHttpError, LlmProtocolError
from ..._messages import CompletionOptions, Message, MessageLike, Response, ToolCall, ToolSpec, Usage, as_messages
from ..http.errors import in_band_error, in_band_status, status_error

#: Anthropic ``stop_reason`` -> the finish reasons the engine knows (OpenAI's names).
#: ``length`` and ``content_filter`` mark an answer cut off; others pass through as they are.
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

# Tool results the engine failed to produce start with this (continuation.result_content).
_ERROR_RESULT_PREFIX = "ERROR: "


# -- requests --------------------------------------------------------------------------

def chat_body(messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
              options: Optional[CompletionOptions], default_max_tokens: int, stream: bool) -> Dict[str, Any]:
    """The JSON body of ``POST /v1/messages``; a missing model is refused before anything is sent."""
    options = options or CompletionOptions()
    if not options.model:
        raise ConfigError("an Anthropic request needs a model, e.g. CompletionOptions(model='claude-sonnet-4-5') "
                          "or EngineConfig(models=['claude-sonnet-4-5'])")
    system, turns = _split_system(as_messages(messages))
    body: Dict[str, Any] = {"model": options.model,
                            "max_tokens": options.max_tokens if options.max_tokens is not None
                            else default_max_tokens,
                            "messages": _merged(turns)}
    if system:
        body["system"] = system
    if tools:
        body["tools"] = [_tool(spec) for spec in tools]
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.top_p is not None:
        body["top_p"] = options.top_p
    if options.stop is not None:
        body["stop_sequences"] = list(options.stop)
    if stream:
        body["stream"] = True
    if options.extra:
        body.update(options.extra)
    return body


def _split_system(messages: List[Message]) -> Tuple[str, List[Message]]:
    system = [m.content for m in messages if m.role == "system" and m.content]
    return "\n\n".join(system), [m for m in messages if m.role != "system"]


def _tool(spec: ToolSpec) -> Dict[str, Any]:
    out: Dict[str, Any] = {"name": spec.name, "input_schema": dict(spec.parameters)}
    if spec.description:
        out["description"] = spec.description
    return out


def _merged(messages: List[Message]) -> List[Dict[str, Any]]:
    """One wire message per run of same-role messages (the API wants roles to alternate)."""
    out: List[Dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for wire in out:  # tool results must open a user message, before any text
        wire["content"].sort(key=lambda block: block["type"] != "tool_result")
    return out


def _blocks(message: Message) -> Tuple[str, List[Dict[str, Any]]]:
    text = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        return "assistant", text + [_tool_use(call) for call in message.tool_calls]
    if message.role == "tool":
        if not message.tool_call_id:  # nothing to attach it to: keep it as text the model can read
            return "user", [{"type": "text", "text": f"Tool result: {message.content}"}]
        result: Dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id,
                                  "content": message.content}
        if message.content.startswith(_ERROR_RESULT_PREFIX):
            result["is_error"] = True
        return "user", [result]
    if message.role == "user":
        return "user", text
    raise ConfigError(f"message role {message.role!r} has no Anthropic form; use 'system', 'user', "
                      f"'assistant' or 'tool'")


def _tool_use(call: ToolCall) -> Dict[str, Any]:
    """A call as the model made it; ``input`` must be an object, so unparsable arguments become ``{}``."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except (ValueError, RecursionError):
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name,
            "input": arguments if isinstance(arguments, dict) else {}}


# -- answers ---------------------------------------------------------------------------

def finish_reason(stop_reason: Any) -> Optional[str]:
    if not isinstance(stop_reason, str) or not stop_reason:
        return None
    return FINISH_REASONS.get(stop_reason, stop_reason)


def _tokens(value: Any) -> int:
    """A token count; absent or absurd (``"x"``, ``-5``, ``1e400``) counts as 0."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53:
        return value
    return 0


_PROMPT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def merge_usage(counts: Dict[str, int], raw: Any) -> Dict[str, int]:
    """``counts`` updated with the counts an Anthropic ``usage`` object gives.

    A ``message_delta`` carries cumulative counts, so they replace, never
    add; a count it leaves out (or sends as null) keeps ``message_start``'s.
    """
    if isinstance(raw, dict):
        for key in _PROMPT_KEYS + ("output_tokens",):
            if raw.get(key) is not None:
                counts[key] = _tokens(raw[key])
    return counts


def usage_of(counts: Dict[str, int]) -> Optional[Usage]:
    """The usage the counts add up to (cached prompt tokens are prompt tokens too, and ``cached_tokens``
    the part read from the cache); None without any."""
    if not counts:
        return None
    prompt = sum(counts.get(key, 0) for key in _PROMPT_KEYS)
    completion = counts.get("output_tokens", 0)
    return Usage(prompt, completion, prompt + completion, cached_tokens=counts.get("cache_read_input_tokens", 0))


def response_from_json(payload: Any, redact: Any) -> Response:
    """A non-streamed ``message`` object as a :class:`Response`."""
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        raise LlmProtocolError(
            f"an Anthropic answer must be a JSON object with a 'content' list, got "
            f"{redact(json.dumps(payload)[:300])}; is base_url the Anthropic API root (https://api.anthropic.com)?")
    text: List[str] = []
    calls: List[ToolCall] = []
    for position, block in enumerate(payload["content"]):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            arguments = block.get("input")
            calls.append(ToolCall(id=_text(block.get("id")) or f"toolu_{position}",
                                  name=_text(block.get("name")) or "",
                                  arguments=json.dumps(arguments if isinstance(arguments, dict) else {})))
    return Response(content="".join(text), tool_calls=tuple(calls), usage=usage_of(merge_usage({}, payload.get("usage"))),
                    model=_text(payload.get("model")), finish_reason=finish_reason(payload.get("stop_reason")),
                    id=_text(payload.get("id")))


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


# -- errors ----------------------------------------------------------------------------

def error_details(payload: Any) -> Tuple[Optional[str], Optional[str]]:
    """``(type, message)`` of an ``{"type": "error", "error": {"type": ..., "message": ...}}`` body."""
    if not isinstance(payload, Mapping):
        return None, None
    error = payload.get("error")
    if isinstance(error, str):
        return None, error
    if not isinstance(error, Mapping):
        return None, None
    kind, message = error.get("type"), error.get("message")
    return (kind if isinstance(kind, str) else None), (message if isinstance(message, str) else None)


def http_error(status: int, reason: str, url: str, text: str, headers: Mapping[str, str]) -> LlmHttpError:
    """The LlmHttpError for an error status: status, the API's error type and message, then what to do."""
    try:
        kind, message = error_details(json.loads(text))
    except ValueError:
        kind, message = None, None
    detail = (f"{kind}: " if kind else "") + (message or text[:300].strip() or "(empty body)")
    return status_error(status, reason, url, text, headers, detail=detail, hint=hint(status))


def error_from_payload(payload: Any, where: str, redact: Any) -> Exception:
    """The exception for an in-band error event, classified like the HTTP status it stands for.

    The one rule for every wire (:func:`..http.errors.in_band_error`): a
    request-side type keeps its status in an :class:`LlmHttpError`
    (``invalid_request_error`` is fatal as a 400 is; ``rate_limit_error`` is
    retried as a 429 is); a server-side type (``overloaded_error``,
    ``api_error``) or an unknown one is a broken stream: fail over.
    """
    kind, message = error_details(payload)
    described = f"{where}: {kind or 'error'}: {message or json.dumps(payload)[:300]}"
    return in_band_error(described, in_band_status(kind=kind, message=message or ""), json.dumps(payload),
                         redact, hint)


_HINTS = {
    400: "the provider rejected the request; check the model name, messages and options",
    401: "check the API key (ANTHROPIC_API_KEY)",
    402: "check the billing of the Anthropic account",
    403: "the API key is not allowed to use this model or endpoint",
    404: "check base_url (https://api.anthropic.com) and the model name",
    413: "the request is too large; send a shorter conversation",
    429: "rate limited by the provider; slow down or retry later",
    529: "the provider is overloaded; retry later or fail over to another model",
}


def hint(status: int) -> str:
    """What to do about an HTTP status from the Messages API."""
    return _HINTS.get(status) or ("the provider failed; retry later or fail over to another model"
                                  if status >= 500 else "the request was not accepted")
