"""Anthropic's Messages wire (``POST /v1/messages``): the request format, typed stream events, the client.

One wire, one module, over the shared HTTP transport.

The Anthropic Messages format: our messages in, its answers and errors out.

The format is pure data (no I/O, easy to test); the stream parser and the
client below it use it.

Requests differ from the OpenAI shape in ways the API enforces:

* system messages go to the top-level ``system`` field;
* an assistant's tool calls are ``tool_use`` content blocks, and the answers
  (``tool`` role messages) are ``tool_result`` blocks in a *user* message;
* roles must alternate, so consecutive messages of one role are merged into
  one message of content blocks (tool results stay first, as required);
* empty text blocks are refused by the API, so empty texts are left out;
* ``max_tokens`` is required: the client's default is sent when the options
  give none.

Anthropic stream events -> :class:`Chunk`, with the completion rule and error mapping.

A streamed message is ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``... / ``content_block_stop``,
then ``message_delta`` (stop reason, final usage) and ``message_stop``;
``ping`` may come anywhere and an ``error`` event may replace the rest.

* text deltas become ``content``, thinking deltas ``reasoning`` (meaningful:
  a model that thinks is not idle); ``ping`` and the structural events yield
  nothing, so they never reset the idle timer;
* a ``thinking`` block, at its stop, becomes a :class:`ProviderItem` with its
  text and its ``signature`` (its ``signature_delta`` events joined, at most
  ``max_event_bytes``); a ``redacted_thinking`` block is one as it starts.
  The API wants them back, first and verbatim, in the assistant turn that
  goes on after a tool call, so the request puts them there;
* each ``tool_use`` block becomes one native call.  Its ToolCallDelta index
  is the block's position among the tool blocks (0, 1, ...), not the content
  block index, so calls are numbered as OpenAI numbers them; id and name
  come with ``content_block_start``, the arguments with each
  ``input_json_delta``;
* a block's ``content_block_stop`` is the moment its call is complete: its
  last delta says ``done`` (with the arguments the block started with,
  ``{}`` for none, when no input was streamed), so a call is dispatched at
  its block's stop, not at the end of the message;
* the answer is complete at ``message_stop``, or when the body ends after a
  ``message_delta`` with a stop reason (everything has arrived); any other
  end is a broken stream.  Usage is input tokens from ``message_start`` and
  output tokens from the last ``message_delta``;
* ``message_start`` gives the message's id: a chunk with nothing else in it
  (not model output, so it neither resets the idle timer nor counts as the
  first chunk).

The Anthropic Messages API client (``POST {base_url}/v1/messages``), streamed or not.

The same guarantees as :class:`OpenAICompatibleClient`, from the same
transport (``transport.py``): the socket is shut down on cancel even before
the response headers, the body is read with ``read1`` through the SSE
framer, and every HTTP, urllib3 or parse error leaves as a streamengine
error, chained.  A stream is complete only at ``message_stop`` or a stop
reason.  HTTP errors are the same :class:`LlmHttpError` (``retry-after``
parsed alike), so failover treats both providers alike; an ``error`` event
inside a 200 stream is classified as its HTTP status would be
(``error_from_payload``).
"""
from __future__ import annotations

import binascii
import json
import math
import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import requests

from .. import _validation as validation
from .._errors import ConfigError, LlmError, LlmHttpError, LlmProtocolError
from .._logs import Redactor
from .._messages import (
    Chunk,
    CompletionOptions,
    Message,
    MessageLike,
    ProviderItem,
    Response,
    StopReason,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    as_messages,
    items_for,
    text_chunk,
)
from .._parts import AudioPart, FilePart, ImagePart, Part, TextPart
from .http.errors import in_band_error, in_band_status, status_error
from .http.options import sdk_settings
from .http.transport import HttpProviderClient, TypedEventParser, Wire, content_headers

if TYPE_CHECKING:  # typing.TypeGuard is Python 3.10+
    from typing_extensions import TypeGuard

#: Anthropic ``stop_reason`` -> the finish reasons the engine knows (OpenAI's names).
#: ``length`` and ``content_filter`` mark an answer cut off; others pass through as they are.
FINISH_REASONS = {
    "end_turn": StopReason.STOP,
    "stop_sequence": StopReason.STOP,
    "tool_use": StopReason.TOOL_CALLS,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "refusal": StopReason.CONTENT_FILTER,
}

#: The ``ProviderItem.wire`` of this wire's items.
WIRE = "anthropic"
#: Content blocks the API wants back as they came: the thinking that led to a tool call.
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})

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
    if message.role == "assistant":  # thinking blocks first, as the API wants them
        thinking = items_for(WIRE, message.provider_items)
        return "assistant", thinking + text + [_tool_use(call) for call in message.tool_calls]
    if message.role == "tool":
        if not message.tool_call_id:  # nothing to attach it to: keep it as text the model can read
            return "user", [{"type": "text", "text": f"Tool result: {message.content}"}]
        result: Dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id,
                                  "content": message.content}
        if message.content.startswith(_ERROR_RESULT_PREFIX):
            result["is_error"] = True
        return "user", [result]
    if message.role == "user":
        return "user", [part_block(p) for p in message.parts if not isinstance(p, TextPart) or p.text] \
            if message.parts else text
    raise ConfigError(f"message role {message.role!r} has no Anthropic form; use 'system', 'user', "
                      f"'assistant' or 'tool'")


#: The image types the Messages API reads.
IMAGE_TYPES = ("image/gif", "image/jpeg", "image/png", "image/webp")


def cannot_carry(part: Part) -> Optional[str]:
    """Why the Messages API cannot take ``part``, and what to do instead; None when it can."""
    if isinstance(part, AudioPart):
        return ("it takes no audio; send a transcript as text, or a model that hears audio over Chat "
                "Completions (OpenAICompatibleClient)")
    if isinstance(part, ImagePart) and part.inline is not None and part.inline[0] not in IMAGE_TYPES:
        return f"it reads images of type {', '.join(IMAGE_TYPES)}, not {part.inline[0]}; convert the image"
    if isinstance(part, FilePart):
        return _document_refused(part)
    return None


def _document_refused(part: FilePart) -> Optional[str]:
    if part.file_id is not None:
        return "a file_id names a file stored with another provider; send the file's data (a data URL) instead"
    media = part.media_type or "an unknown type"
    if part.url is not None:
        return None if media == "application/pdf" else \
            f"a document by URL must be a PDF, not {media}; send the file's data (a data URL) instead"
    if media == "application/pdf":
        return None
    if not media.startswith("text/"):
        return f"its documents are PDFs or plain text, not {media}"
    try:
        _document_text(part)
    except (UnicodeDecodeError, binascii.Error):
        return f"a {media} document must be UTF-8 text"
    return None


def part_block(part: Part) -> Dict[str, Any]:
    """A content part as a Messages API block: ``text``, ``image`` or ``document``, data as base64 or URL sources."""
    if isinstance(part, ImagePart):
        inline = part.inline
        return {"type": "image", "source": {"type": "base64", "media_type": inline[0], "data": inline[1]}
                if inline else {"type": "url", "url": part.url}}
    if isinstance(part, FilePart):
        block: Dict[str, Any] = {"type": "document", "source": _document_source(part)}
        if part.filename:
            block["title"] = part.filename
        return block
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    raise ConfigError(f"the {part.describe()} has no Anthropic form: {cannot_carry(part)}")


def _document_source(part: FilePart) -> Dict[str, Any]:
    inline = part.inline
    if inline is None:
        return {"type": "url", "url": part.url}
    if inline[0] == "application/pdf":
        return {"type": "base64", "media_type": inline[0], "data": inline[1]}
    return {"type": "text", "media_type": "text/plain", "data": _document_text(part)}


def _document_text(part: FilePart) -> str:
    inline = part.inline
    assert inline is not None
    return binascii.a2b_base64(inline[1]).decode("utf-8")


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
    thinking: List[str] = []
    items: List[ProviderItem] = []
    calls: List[ToolCall] = []
    for position, block in enumerate(payload["content"]):
        if not isinstance(block, dict):
            continue
        if block.get("type") in THINKING_BLOCKS:
            items.append(ProviderItem(WIRE, block))
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif block.get("type") == "tool_use":
            arguments = block.get("input")
            calls.append(ToolCall(id=_text(block.get("id")) or f"toolu_{position}",
                                  name=_text(block.get("name")) or "",
                                  arguments=json.dumps(arguments if isinstance(arguments, dict) else {})))
    return Response(content="".join(text), tool_calls=tuple(calls),
                    usage=usage_of(merge_usage({}, payload.get("usage"))), model=_text(payload.get("model")),
                    finish_reason=finish_reason(payload.get("stop_reason")), id=_text(payload.get("id")),
                    reasoning="".join(thinking) or None, provider_items=tuple(items))


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


class _ToolBlock:
    __slots__ = ("argued", "index", "start_input")

    def __init__(self, index: int, start_input: Any) -> None:
        self.index = index
        self.argued = False  # some non-blank argument text was sent
        self.start_input = start_input


class _ThinkingBlock:
    """A ``thinking`` block as it streams: its text and signature, sent back whole after a tool call."""

    __slots__ = ("signature", "thinking")

    def __init__(self, start: Dict[str, Any]) -> None:
        self.thinking = [start["thinking"]] if isinstance(start.get("thinking"), str) else []
        self.signature = [start["signature"]] if isinstance(start.get("signature"), str) else []

    def item(self) -> ProviderItem:
        return ProviderItem(WIRE, {"type": "thinking", "thinking": "".join(self.thinking),
                                      "signature": "".join(self.signature)})


class AnthropicStreamParser(TypedEventParser):
    """The events of one streamed response -> chunks; ``run`` returns the completing chunk."""

    end_marker = "message_stop or a stop reason"
    wire_name = "the Anthropic"

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        super().__init__(url, redact, max_event_bytes)
        self._counts: Dict[str, int] = {}  # token counts so far, by the API's names
        self._tools: Dict[int, _ToolBlock] = {}  # content block index -> its tool call
        self._tool_count = 0
        self._thinking: Dict[int, _ThinkingBlock] = {}  # content block index -> its thinking block
        self._signature_chars = 0

    def plain_error(self, text: str) -> Dict[str, Any]:
        return {"type": "error", "error": {"type": None, "message": text}}

    # -- one event ---------------------------------------------------------------------

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        kind = frame.get("type") if isinstance(frame.get("type"), str) else name
        if kind == "content_block_delta":
            return self._delta(frame)
        if kind == "content_block_start":
            return self._block_start(frame)
        if kind == "content_block_stop":
            return self._block_stop(frame)
        if kind == "message_start":
            return self._message_start(frame)
        if kind == "message_delta":
            delta = frame.get("delta")
            if not isinstance(delta, dict):
                delta = {}
            self.finish_reason = finish_reason(delta.get("stop_reason")) or self.finish_reason
            self.usage = usage_of(merge_usage(self._counts, frame.get("usage")))
        elif kind == "message_stop":
            self.ended = True
        elif kind == "error" or name == "error":
            raise error_from_payload(frame, f"{self.url} sent an error in the stream after {self.events - 1} "
                                            f"events", self.redact)
        return None  # ping, and event types this client does not know yet

    def _message_start(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        message = frame.get("message")
        if not isinstance(message, dict):
            message = {}
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
        self.usage = usage_of(merge_usage(self._counts, message.get("usage")))
        message_id = message.get("id")
        return Chunk(response_id=message_id) if isinstance(message_id, str) and message_id else None

    def _block_start(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        block = frame.get("content_block")
        index = frame.get("index")
        if not isinstance(block, dict) or not _is_index(index):
            return None
        kind = block.get("type")
        if kind == "text":
            return _text_chunk(block.get("text"), None)
        if kind == "thinking":
            self._thinking[index] = _ThinkingBlock(block)
            return _text_chunk(None, block.get("thinking"))
        if kind == "redacted_thinking":
            return Chunk(provider_items=(ProviderItem(WIRE, block),))
        if kind != "tool_use":
            return None
        tool = self._tools[index] = _ToolBlock(self._tool_count, block.get("input"))
        self._tool_count += 1
        call_id, name = block.get("id"), block.get("name")
        return Chunk(tool_calls=(ToolCallDelta(tool.index, call_id if isinstance(call_id, str) and call_id else None,
                                               name if isinstance(name, str) and name else None),))

    def _delta(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        delta = frame.get("delta")
        if not isinstance(delta, dict):
            return None
        kind = delta.get("type")
        if kind == "text_delta":
            return _text_chunk(delta.get("text"), None)
        if kind == "thinking_delta":
            return self._thought(frame, delta.get("thinking"))
        if kind == "signature_delta":
            self._signed(frame, delta.get("signature"))
            return None
        if kind != "input_json_delta":
            return None  # citations_delta...: nothing the caller reads
        tool = self._tool_at(frame)
        fragment = delta.get("partial_json")
        if tool is None or not isinstance(fragment, str) or not fragment:
            return None
        tool.argued = tool.argued or bool(fragment.strip())
        return Chunk(tool_calls=(ToolCallDelta(tool.index, arguments_fragment=fragment),))

    def _thought(self, frame: Dict[str, Any], text: Any) -> Optional[Chunk]:
        block = self._thinking.get(frame["index"]) if _is_index(frame.get("index")) else None
        if block is not None and isinstance(text, str):
            block.thinking.append(text)  # bounded: the same text is counted as reasoning as it flows
        return _text_chunk(None, text)

    def _signed(self, frame: Dict[str, Any], signature: Any) -> None:
        """Keep a thinking block's signature, within ``max_event_bytes`` (nothing else counts it yet)."""
        block = self._thinking.get(frame["index"]) if _is_index(frame.get("index")) else None
        if block is None or not isinstance(signature, str):
            return
        self._signature_chars += len(signature)
        if self._signature_chars > self.max_event_bytes:
            raise LlmProtocolError(
                f"{self.url} sent thinking signatures of over {self.max_event_bytes} characters; a signature "
                f"is a few hundred, so this is not the Anthropic API (or raise max_event_bytes)")
        block.signature.append(signature)

    def _tool_at(self, frame: Dict[str, Any]) -> Optional[_ToolBlock]:
        index = frame.get("index")
        return self._tools.get(index) if _is_index(index) else None

    def _block_stop(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        thinking = self._thinking.pop(frame["index"], None) if _is_index(frame.get("index")) else None
        if thinking is not None:
            return Chunk(provider_items=(thinking.item(),))
        tool = self._tool_at(frame)
        if tool is None:
            return None
        del self._tools[frame["index"]]
        arguments = None
        if not tool.argued:  # no input streamed: the call's input is the one it started with
            arguments = json.dumps(tool.start_input if isinstance(tool.start_input, dict) else {})
        return Chunk(tool_calls=(ToolCallDelta(tool.index, arguments_fragment=arguments, done=True),))


def _is_index(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_chunk(content: Any, reasoning: Any) -> Optional[Chunk]:
    content = content if isinstance(content, str) and content else None
    reasoning = reasoning if isinstance(reasoning, str) and reasoning else None
    if reasoning is None:
        return None if content is None else text_chunk(content, None)  # a text delta: nearly every event
    return Chunk(content=content, reasoning=reasoning)


DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
#: Sent as ``max_tokens`` when the call's options give none (the API requires one).
DEFAULT_MAX_TOKENS = 4096


class MessagesWire(Wire):
    """The Messages API: ``POST {base_url}/v1/messages``, its typed events, its errors and ``x-api-key``."""

    chat_path = "/v1/messages"
    models_path = "/v1/models"
    example_base_url = DEFAULT_BASE_URL
    api_root_hint = "is base_url the Anthropic API root (https://api.anthropic.com)?"
    key_source = "ANTHROPIC_API_KEY"
    log_name = "streamengine._clients.anthropic.AnthropicClient"
    parser_class = AnthropicStreamParser
    name = "the Anthropic Messages API"

    def __init__(self, anthropic_version: str, default_max_tokens: int) -> None:
        validation.count(default_max_tokens, "default_max_tokens", minimum=1)
        if not isinstance(anthropic_version, str) or not re.fullmatch(r"[0-9A-Za-z.-]+", anthropic_version):
            raise ConfigError(f"anthropic_version must look like {DEFAULT_VERSION!r}, got {anthropic_version!r}")
        self.anthropic_version = anthropic_version
        self.default_max_tokens = default_max_tokens

    def api_root(self, base_url: str) -> str:
        # An OpenAI habit; the chat path adds /v1 itself.
        return base_url[:-3] if base_url.endswith("/v1") else base_url

    def chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                  options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return chat_body(messages, tools, options, self.default_max_tokens, stream=stream)

    def cannot_carry(self, part: Part) -> Optional[str]:
        return cannot_carry(part)

    def request_headers(self, stream: bool, headers: Mapping[str, str], api_key: Optional[str]) -> Dict[str, str]:
        sent = content_headers(stream)
        sent["anthropic-version"] = self.anthropic_version
        sent.update(headers)
        if api_key:
            sent["x-api-key"] = api_key
        return sent

    def response_of(self, payload: Any, url: str, redact: Redactor) -> Response:
        return response_from_json(payload, redact)

    def models_query(self, after: Optional[str]) -> Dict[str, str]:
        return {"limit": "1000", **({"after_id": after} if after else {})}

    def status_error(self, resp: requests.Response, url: str, text: str, stream: bool, base_url: str) -> LlmError:
        return http_error(resp.status_code, resp.reason or "", url, text, resp.headers)

    def raise_in_band_error(self, payload: Any, url: str, redact: Redactor) -> None:
        if isinstance(payload, dict) and payload.get("type") == "error":
            raise error_from_payload(payload, f"{url} answered with an error", redact)


class AnthropicClient(HttpProviderClient):
    """Claude through the Messages API, over one ``requests.Session``.

    ``base_url`` is the API root without ``/v1`` (``https://api.anthropic.com``,
    or a proxy's root); ``api_key`` defaults to ``ANTHROPIC_API_KEY`` and goes
    out as ``x-api-key``, never shown in errors or logs.  ``default_max_tokens``
    is sent when ``CompletionOptions.max_tokens`` is not set.  A ``session``
    you pass is used as is (a cancellable adapter is mounted for ``base_url``)
    and not closed by :meth:`close`.  The anthropic SDK's ``default_headers=``,
    ``timeout=`` and ``max_retries=`` and the options' ``extra_body``,
    ``extra_headers`` and ``extra_query`` are understood (:mod:`.http.options`).
    """

    wire: MessagesWire

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: Optional[str] = None,
        *,
        anthropic_version: str = DEFAULT_VERSION,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: Optional[float] = None,
        default_headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> None:
        headers, connect, retries = sdk_settings(headers, default_headers, connect_timeout, timeout, max_retries)
        super().__init__(MessagesWire(anthropic_version, default_max_tokens), base_url,
                         api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY"), session=session,
                         headers=headers, connect_timeout=connect, max_retries=retries)

    @property
    def anthropic_version(self) -> str:
        """The ``anthropic-version`` header sent with every request."""
        return self.wire.anthropic_version

    @property
    def default_max_tokens(self) -> int:
        """The ``max_tokens`` sent when a call's options give none."""
        return self.wire.default_max_tokens
