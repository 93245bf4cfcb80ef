"""OpenAI's Responses wire (``POST /v1/responses``): the request, answers and errors, stream events, the client.

One wire, one module; everything but the wire format is
:class:`OpenAICompatibleClient`'s.

What the Responses client sends: our chat-shaped messages, tools and options as a Responses request.

Pure data, no I/O.  The translation follows what the API enforces:

* system messages become ``instructions`` (joined), the rest ``input`` items;
* an assistant turn is its ``reasoning`` items (as the provider sent them;
  with ``store: false`` only those with ``encrypted_content``, as OpenAI
  keeps none to look up by id), its text (a ``message`` item) followed by one
  ``function_call`` item per call, with the call's id as ``call_id``; a tool
  result is a ``function_call_output`` item with that ``call_id``.  The API
  answers 400 to an output whose call it has not seen, so the calls are
  always re-sent before their outputs -- the conversation order guarantees it;
* tools are ``function`` tools with ``strict: false``: the Responses API
  makes functions strict by default, and strict mode refuses every schema
  that does not list all properties as required;
* options the API refuses under their Chat Completions names are renamed
  (``max_tokens`` -> ``max_output_tokens``, ``reasoning_effort`` ->
  ``reasoning.effort``, a chat-shaped ``tool_choice``), ``stream_options``
  loses ``include_usage`` (usage always comes with ``response.completed``),
  and those with no equivalent (``stop``, ``n``...) are refused with a
  :class:`ConfigError` naming the option, before anything is sent.

Responses answers and errors -> our Response, Usage, finish reasons and exceptions.

Shared by the stream parser (``response.completed`` / ``incomplete`` /
``failed`` carry a whole response object) and the buffered call (whose
answer is that object).  Errors are classified by the OpenAI wire's
in-band rule (``openai/errors.raise_in_band_error``), so failover sees the
same exception for the same error on either OpenAI wire.

Responses stream events -> :class:`Chunk`, with the completion rule and error mapping.

A streamed response is ``response.created``, ``response.in_progress``, then
per output item ``response.output_item.added``, its deltas and
``response.output_item.done``, and at the end ``response.completed`` (or
``response.incomplete``); ``response.failed`` and ``error`` end it badly.

* ``output_text.delta`` is content; ``reasoning_summary_text.delta`` and
  ``reasoning_text.delta`` (vLLM, Ollama) are reasoning (a summary's second
  part starts after a blank line); a finished ``reasoning`` item (with its
  ``encrypted_content`` when the request's ``include`` asked for it) is a
  :class:`ProviderItem`, sent back before the calls it led to as the API
  wants; ``refusal.delta``
  is the refusal (``Chunk.refusal``: model output, not the answer).  Structural events
  (``created``, ``in_progress``, ``content_part.*``, ``*.done`` texts) yield
  nothing, so they never reset the idle timer -- nor do SSE comments;
* a ``function_call`` item is one native call.  Its ToolCallDelta index is
  its position among the calls (0, 1, ...); its id is the item's
  ``call_id`` (the ``fc_...`` item id is not what a ``function_call_output``
  answers), its name comes with ``output_item.added``, its arguments with
  each ``function_call_arguments.delta`` keyed by the item.  A server that
  sends no deltas (LM Studio) gives them whole in ``arguments.done`` or
  ``output_item.done``;
* a call is complete at its ``output_item.done``: its last delta says
  ``done`` (with the item's own arguments when none were streamed), so the
  engine dispatches it then, not at ``response.completed``;
* hosted tools (web search, file search, code interpreter, image
  generation, MCP) stream only progress events: each is a chunk with
  nothing in it that still counts as the model working (``is_meaningful``);
* the answer is complete at ``response.completed`` or
  ``response.incomplete`` (whose reason is the finish reason: ``length``,
  ``content_filter``); both carry the usage.  Any other end is a broken
  stream.  ``event:`` lines are optional (OpenRouter and older OpenAI
  streams send none; the ``type`` field says it all), as is
  ``sequence_number``;
* the response's id (``response.id`` of ``response.created``, or of the
  final event) goes out once, on a chunk with nothing else in it.

The OpenAI Responses API client (``POST {base_url}/responses``), streamed or not.

The client is an ``HttpProviderClient`` holding a :class:`ResponsesWire`,
as every provider client is: the transport (cancel shuts the socket down
even before the headers, bounded reads, SSE framing), credentials and
redaction are the shared client's; the constructor's options, ``from_env``
and embeddings are :class:`OpenAICompatibleClient`'s, and so are the
headers, HTTP error wording, ``retry-after`` and connection-error messages
(the wire calls the same functions).  What differs is here: the request,
the answer and its errors, the stream events.
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import requests

from .._errors import ConfigError, LlmError, LlmProtocolError
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
)
from .._parts import AudioPart, FilePart, ImagePart, Part, TextPart
from .http.options import sdk_settings
from .http.transport import HttpProviderClient, TypedEventParser, Wire
from .openai import (
    _usage,
    check_query,
    checked_key_header,
    connection_error_message,
    embed,
    env_api_key,
    env_base_url,
    http_error,
    raise_in_band_error,
    request_headers,
)

#: Chat Completions option names -> their Responses names.
RENAMED_OPTIONS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}

#: Chat Completions options the Responses API has no equivalent for, and what to do instead.
REFUSED_OPTIONS = {
    "stop": "the Responses API has no stop sequences; stop on the text yourself, or use the "
            "Chat Completions client (OpenAICompatibleClient)",
    "n": "the Responses API answers with one output; make several calls instead",
    "response_format": "the Responses API takes the format as text={'format': {...}} "
                       "(CompletionOptions(extra={'text': {'format': {'type': 'json_object'}}}))",
    "messages": "messages are passed as the conversation, not as an option",
}

#: The ``ProviderItem.wire`` of this wire's items.
WIRE = "responses"

# A tool result without the id of its call: text the model can still read.
_TOOL_RESULT_TEXT = "Tool result: {}"


def responses_body(messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                   options: Optional[CompletionOptions], *, stream: bool) -> Dict[str, Any]:
    """The JSON body of ``POST {base_url}/responses``."""
    options = options or CompletionOptions()
    stored = (options.extra or {}).get("store") is not False
    instructions, items = _input(as_messages(messages), stored)
    body: Dict[str, Any] = {}
    if options.model is not None:
        body["model"] = options.model
    if instructions:
        body["instructions"] = instructions
    body["input"] = items
    if tools:
        body["tools"] = [_tool(spec) for spec in tools]
    if stream:
        body["stream"] = True
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.top_p is not None:
        body["top_p"] = options.top_p
    if options.max_tokens is not None:
        body["max_output_tokens"] = options.max_tokens
    if options.stop is not None:
        _refuse("stop", "CompletionOptions.stop")
    for given, value in (options.extra or {}).items():
        name, translated = _translated_option(given, value)
        if name is not None:
            body[name] = translated
    return body


def _input(messages: List[Message], stored: bool) -> Tuple[str, List[Dict[str, Any]]]:
    system = [m.content for m in messages if m.role == "system" and m.content]
    items: List[Dict[str, Any]] = []
    for message in messages:
        if message.role != "system":
            items.extend(_items(message, stored))
    return "\n\n".join(system), items


def _items(message: Message, stored: bool = True) -> List[Dict[str, Any]]:
    role = message.role
    if role == "user":
        content: Any = [input_part(p) for p in message.parts] if message.parts else message.content
        return [{"type": "message", "role": "user", "content": content}]
    if role == "assistant":
        text = [{"type": "message", "role": "assistant", "content": message.content}] if message.content else []
        calls = [{"type": "function_call", "call_id": call.id, "name": call.name,
                  "arguments": call.arguments or "{}"} for call in message.tool_calls]
        return _reasoning_items(message, stored) + text + calls
    if role == "tool":
        if not message.tool_call_id:  # nothing to attach it to: keep it as text the model can read
            return [{"type": "message", "role": "user", "content": _TOOL_RESULT_TEXT.format(message.content)}]
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}]
    if role == "developer":
        return [{"type": "message", "role": "developer", "content": message.content}]
    raise ConfigError(f"message role {role!r} has no Responses form; use 'system', 'user', 'assistant' or 'tool'")


def cannot_carry(part: Part) -> Optional[str]:
    """Why the Responses API cannot take ``part`` in a message; None when it can."""
    if isinstance(part, AudioPart):
        return ("its messages take no audio; send a transcript as text, or use the Chat Completions client "
                "(OpenAICompatibleClient), whose input_audio parts carry it")
    return None


def input_part(part: Part) -> Dict[str, Any]:
    """A content part as a Responses input: ``input_text``, ``input_image`` or ``input_file``."""
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):  # detail is required here; "auto" is what Chat Completions assumes
        return {"type": "input_image", "image_url": part.url, "detail": part.detail or "auto"}
    if isinstance(part, FilePart):
        item: Dict[str, Any] = {"type": "input_file"}
        for key, value in (("file_data", part.data), ("file_id", part.file_id), ("file_url", part.url),
                           ("filename", part.filename)):
            if value is not None:
                item[key] = value
        return item
    raise ConfigError(f"the {part.describe()} has no Responses form: {cannot_carry(part)}")


def _reasoning_items(message: Message, stored: bool) -> List[Dict[str, Any]]:
    """The turn's reasoning items to send back: all of them, but with ``store: false`` only those that carry
    their ``encrypted_content`` (OpenAI kept none of them to find by id: it would answer 404)."""
    items = items_for(WIRE, message.provider_items)
    return items if stored else [item for item in items if item.get("encrypted_content")]


def _tool(spec: ToolSpec) -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": "function", "name": spec.name, "parameters": dict(spec.parameters),
                           "strict": False}
    if spec.description:
        out["description"] = spec.description
    return out


def _translated_option(name: str, value: Any) -> Tuple[Optional[str], Any]:
    """``(name, value)`` as the Responses API takes it; ``(None, _)`` to leave it out."""
    if name in REFUSED_OPTIONS:
        _refuse(name, f"the option {name!r}")
    if name in RENAMED_OPTIONS:
        return RENAMED_OPTIONS[name], value
    if name == "reasoning_effort":
        return "reasoning", {"effort": value}
    if name == "stream_options":
        kept = {k: v for k, v in value.items() if k != "include_usage"} if isinstance(value, Mapping) else value
        return ("stream_options", kept) if kept else (None, None)
    if name == "tool_choice":
        return name, _tool_choice(value)
    return name, value


def _tool_choice(value: Any) -> Any:
    """Chat's ``{"type": "function", "function": {"name": X}}`` is ``{"type": "function", "name": X}`` here."""
    if isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        return {"type": "function", "name": value["function"].get("name")}
    return value


def _refuse(name: str, what: str) -> None:
    raise ConfigError(f"{what} cannot be sent to the Responses API: {REFUSED_OPTIONS[name]}")


#: ``incomplete_details.reason`` -> the finish reasons the engine knows (Chat Completions' names).
INCOMPLETE_REASONS = {"max_output_tokens": StopReason.LENGTH, "content_filter": StopReason.CONTENT_FILTER}

Redact = Callable[[str], str]


def usage_of(raw: Any) -> Optional[Usage]:
    """A Responses ``usage`` object as :class:`Usage` (cached and reasoning tokens from its ``*_details``);
    absurd counts (``-5``, ``"x"``) mean no usage."""
    return _usage(raw, "input_tokens", "output_tokens")


def finish_reason_of(response: Mapping[str, Any], made_calls: bool, incomplete: bool = False) -> str:
    """The finish reason of a finished response: ``length``, ``content_filter``, ``tool_calls`` or ``stop``.

    ``incomplete`` says it came with ``response.incomplete``: cut off even
    when the object does not say why (``length``, the usual reason).
    """
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    if incomplete or response.get("status") == "incomplete" or reason:
        return INCOMPLETE_REASONS.get(reason, reason) if isinstance(reason, str) and reason else StopReason.LENGTH
    return StopReason.TOOL_CALLS if made_calls else StopReason.STOP


def raise_error(error: Any, url: str, redact: Redact, after: Optional[int] = None) -> None:
    """Raise for a Responses error object: an ``error`` event (flat or nested) or ``response.error``.

    Flat: ``{"type": "error", "code": ..., "message": ...}``; nested:
    ``{"type": "error", "error": {"type": ..., "code": ..., "message": ...}}``;
    a failed response's ``error`` is ``{"code": ..., "message": ...}``.
    """
    if isinstance(error, Mapping) and isinstance(error.get("error"), Mapping):
        error = error["error"]
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    kind = error.get("type") if error.get("type") != "error" else None
    fields = {"message": error.get("message") or json.dumps(dict(error))[:300], "type": kind,
              "code": error.get("code")}
    fields.update((key, error[key]) for key in ("status", "status_code", "param") if error.get(key) is not None)
    raise_in_band_error({"error": {k: v for k, v in fields.items() if v is not None}}, url, redact, after=after)
    raise AssertionError("raise_in_band_error raises for every error")  # pragma: no cover


def response_from_json(payload: Any, url: str, redact: Redact) -> Response:
    """A non-streamed response object as a :class:`Response`; a failed one raises as the stream would."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("output"), list):
        raise LlmProtocolError(
            f"a Responses answer must be a JSON object with an 'output' list, got "
            f"{redact(json.dumps(payload)[:300])}; is base_url an API root that serves /responses (ending in /v1)?")
    if payload.get("status") == "failed" or payload.get("error"):
        raise_error(payload.get("error") or {"message": "the response failed"}, url, redact)
    found = output_of(payload["output"])
    return Response(content=found.text, tool_calls=tuple(found.calls), usage=usage_of(payload.get("usage")),
                    model=_text(payload.get("model")), finish_reason=finish_reason_of(payload, bool(found.calls)),
                    refusal=found.refusal or None, reasoning=found.reasoning or None, id=_text(payload.get("id")),
                    provider_items=found.items)


class Output(NamedTuple):
    """What a response's ``output`` items hold, by kind."""

    text: str
    refusal: str
    reasoning: str
    calls: List[ToolCall]
    items: Tuple[ProviderItem, ...] = ()


def output_of(items: List[Any]) -> Output:
    """The ``message`` items' text and refusals, the ``reasoning`` items' summaries (or text), the calls."""
    parts: Dict[str, List[str]] = {"output_text": [], "refusal": [], "reasoning": []}
    calls: List[ToolCall] = []
    kept: List[ProviderItem] = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") in ("output_text", "refusal"):
                    _add_text(parts[part["type"]], part.get("text" if part["type"] == "output_text" else "refusal"))
        elif kind == "reasoning":
            kept.append(ProviderItem(WIRE, item))
            for part in (item.get("summary") or item.get("content") or ()):
                if isinstance(part, Mapping):
                    _add_text(parts["reasoning"], part.get("text"))
        elif kind == "function_call":
            calls.append(call_of(item, position))
    return Output("".join(parts["output_text"]), "".join(parts["refusal"]), "".join(parts["reasoning"]), calls,
                  tuple(kept))


def _add_text(into: List[str], value: Any) -> None:
    if isinstance(value, str):
        into.append(value)


def call_of(item: Mapping[str, Any], position: int) -> ToolCall:
    """A ``function_call`` item as a call: its ``call_id`` (not the ``fc_`` item id) is the call's id."""
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments) if isinstance(arguments, dict) else "{}"
    return ToolCall(id=_text(item.get("call_id")) or _text(item.get("id")) or f"call_{position}",
                    name=_text(item.get("name")) or "", arguments=arguments or "{}")


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


# Hosted tools' progress: response.web_search_call.searching, response.code_interpreter_call_code.delta...
_HOSTED_PROGRESS = re.compile(r"response\.(?!function_call_arguments\.)(?:\w+_call(?:_\w+)?|mcp_list_tools)\.\w+")
_HOSTED_ITEM = re.compile(r"\w+_call|mcp_list_tools")
_REASONING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
_PARAGRAPH = "\n\n"
_LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})


class ProgressChunk(Chunk):
    """Nothing to show, yet the provider is working (a hosted tool's progress): resets the idle timer."""

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["is_meaningful"] = True


_PROGRESS = ProgressChunk()


class _Call:
    __slots__ = ("argued", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.argued = False  # some argument text was sent


class ResponsesStreamParser(TypedEventParser):
    """The events of one streamed response -> chunks; ``run`` returns the completing chunk."""

    end_marker = "response.completed or response.incomplete"
    wire_name = "the Responses"

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        super().__init__(url, redact, max_event_bytes)
        self._calls: Dict[Any, _Call] = {}  # item id and ("output", index) -> its call
        self._call_count = 0
        self._shown = False  # text or a call was streamed (else response.completed's output is the answer)
        # reasoning text, and reasoning items, were streamed: the final object's are not taken again
        self._thought_text = False
        self._thought_items = False
        self._response_id: Optional[str] = None  # the id told so far

    def plain_error(self, text: str) -> Dict[str, Any]:
        return {"type": "error", "message": text}

    # -- one event ---------------------------------------------------------------------

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        kind = frame.get("type")
        if not isinstance(kind, str):
            kind = name
        if kind == "response.output_text.delta":
            return self._text(frame.get("delta"), None)
        if kind in _REASONING_DELTAS:
            return self._text(None, frame.get("delta"))
        if kind == "response.reasoning_summary_part.added":
            return self._summary_part(frame.get("summary_index"))
        if kind == "response.refusal.delta":
            return self._refusal(frame.get("delta"))
        if kind == "response.function_call_arguments.delta":
            return self._arguments(frame, frame.get("delta"), whole=False)
        if kind == "response.function_call_arguments.done":
            return self._arguments(frame, frame.get("arguments"), whole=True)
        if kind == "response.output_item.added":
            return self._item_added(frame)
        if kind == "response.output_item.done":
            return self._item_done(frame)
        if kind in _LIFECYCLE:
            return self._note_response(frame.get("response"))
        if kind in ("response.completed", "response.incomplete"):
            told = self._note_response(frame.get("response"))
            return self._finished(frame.get("response"), incomplete=kind == "response.incomplete") or told
        if kind == "response.failed":
            response = frame.get("response")
            error = response.get("error") if isinstance(response, Mapping) else None
            raise_error(error or {"message": "the response failed"}, self.url, self.redact, after=self.events - 1)
        if kind == "error" or name == "error":
            raise_error(frame, self.url, self.redact, after=self.events - 1)
        if _HOSTED_PROGRESS.fullmatch(kind):
            return _PROGRESS
        return None  # content_part.*, *.done texts, keep-alives, event types this client does not know yet

    def _text(self, content: Any, reasoning: Any) -> Optional[Chunk]:
        content = content if isinstance(content, str) and content else None
        reasoning = reasoning if isinstance(reasoning, str) and reasoning else None
        if content is None and reasoning is None:
            return None
        self._shown = self._shown or content is not None
        self._thought_text = self._thought_text or reasoning is not None
        return Chunk(content=content, reasoning=reasoning)

    def _summary_part(self, index: Any) -> Optional[Chunk]:
        """A summary's parts are paragraphs: the second and later start after a blank line."""
        return Chunk(reasoning=_PARAGRAPH) if _is_index(index) and index > 0 else None

    def _refusal(self, text: Any) -> Optional[Chunk]:
        if not isinstance(text, str) or not text:
            return None
        self._shown = True
        return Chunk(refusal=text)

    def _note_response(self, response: Any) -> Optional[Chunk]:
        """Note the response's model; a chunk with its id the first time that id is seen, else None."""
        if not isinstance(response, Mapping):
            return None
        if isinstance(response.get("model"), str) and response["model"]:
            self.model = response["model"]
        response_id = response.get("id")
        if not isinstance(response_id, str) or not response_id or response_id == self._response_id:
            return None
        self._response_id = response_id
        return Chunk(response_id=response_id)

    # -- function calls ----------------------------------------------------------------

    def _item_added(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        item = frame.get("item")
        if not isinstance(item, Mapping):
            return None
        kind = item.get("type")
        if kind == "function_call":
            call, deltas = self._start(frame, item)
            arguments = item.get("arguments")
            if isinstance(arguments, str) and arguments:
                call.argued = True
                deltas[0] = ToolCallDelta(call.index, deltas[0].id, deltas[0].name, arguments)
            return Chunk(tool_calls=tuple(deltas))
        if isinstance(kind, str) and _HOSTED_ITEM.fullmatch(kind):
            return _PROGRESS
        return None

    def _start(self, frame: Mapping[str, Any], item: Mapping[str, Any]) -> Tuple[_Call, List[ToolCallDelta]]:
        """A new call for a ``function_call`` item, findable by its item id and output index."""
        call = _Call(self._call_count)
        self._call_count += 1
        self._shown = True
        if isinstance(item.get("id"), str):
            self._calls[item["id"]] = call
        if _is_index(frame.get("output_index")):
            self._calls[("output", frame["output_index"])] = call
        found = call_of(item, call.index)
        name = found.name or None
        call_id = found.id if item.get("call_id") or item.get("id") else None
        return call, [ToolCallDelta(call.index, call_id, name)]

    def _call_at(self, frame: Mapping[str, Any]) -> Optional[_Call]:
        item_id = frame.get("item_id")
        if isinstance(item_id, str) and item_id in self._calls:
            return self._calls[item_id]
        index = frame.get("output_index")
        return self._calls.get(("output", index)) if _is_index(index) else None

    def _arguments(self, frame: Mapping[str, Any], text: Any, whole: bool) -> Optional[Chunk]:
        call = self._call_at(frame)
        if call is None or not isinstance(text, str) or not text or (whole and call.argued):
            return None
        call.argued = True
        return Chunk(tool_calls=(ToolCallDelta(call.index, arguments_fragment=text),))

    def _item_done(self, frame: Dict[str, Any]) -> Optional[Chunk]:
        item = frame.get("item")
        if not isinstance(item, Mapping):
            return None
        kind = item.get("type")
        if kind == "reasoning":
            self._thought_items = True
            return Chunk(provider_items=(ProviderItem(WIRE, item),))
        if kind != "function_call":
            return _PROGRESS if isinstance(kind, str) and _HOSTED_ITEM.fullmatch(kind) else None
        call = self._call_at({"item_id": item.get("id"), "output_index": frame.get("output_index")})
        deltas: List[ToolCallDelta] = []
        if call is None:  # a server that announces the call only when it is done
            call, deltas = self._start(frame, item)
        self._forget(call)
        text = None
        if not call.argued:  # no arguments streamed: the item's own, or none
            arguments = item.get("arguments")
            text = arguments if isinstance(arguments, str) and arguments else (
                json.dumps(arguments) if isinstance(arguments, dict) else "{}")
        deltas.append(ToolCallDelta(call.index, arguments_fragment=text, done=True))
        return Chunk(tool_calls=tuple(deltas))

    def _forget(self, call: _Call) -> None:
        for key in [key for key, known in self._calls.items() if known is call]:
            del self._calls[key]

    # -- the end -----------------------------------------------------------------------

    def _finished(self, response: Any, incomplete: bool) -> Optional[Chunk]:
        response = response if isinstance(response, Mapping) else {}
        self.usage = usage_of(response.get("usage")) or self.usage
        self.ended = True
        output = response.get("output")
        if self._shown or not isinstance(output, list):
            self.finish_reason = finish_reason_of(response, self._call_count > 0, incomplete)
            return None
        # Nothing was streamed: a server that sends the answer only in the final object.
        found = output_of(output)
        self.finish_reason = finish_reason_of(response, bool(found.calls), incomplete)
        deltas = tuple(ToolCallDelta(i, call.id, call.name, call.arguments) for i, call in enumerate(found.calls))
        reasoning = "" if self._thought_text else found.reasoning
        items = () if self._thought_items else found.items
        if not (found.text or deltas or found.refusal or reasoning or items):
            return None
        return Chunk(content=found.text or None, tool_calls=deltas, refusal=found.refusal or None,
                     response_id=self._response_id, reasoning=reasoning or None, provider_items=items)


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ResponsesWire(Wire):
    """The Responses API: ``POST {base_url}/responses``, its typed events; OpenAI's headers and errors."""

    chat_path = "/responses"
    example_base_url = "http://127.0.0.1:8000/v1"
    api_root_hint = "is base_url an API root that serves the Responses API (ending in /v1)?"
    key_source = "STREAMENGINE_API_KEY or OPENAI_API_KEY"
    log_name = "streamengine._clients.responses.OpenAIResponsesClient"
    parser_class = ResponsesStreamParser
    name = "the OpenAI Responses API"

    def __init__(self, api_key_header: str) -> None:
        self.api_key_header = checked_key_header(api_key_header)

    def cannot_carry(self, part: Part) -> Optional[str]:
        return cannot_carry(part)

    def chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                  options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return responses_body(messages, tools, options, stream=stream)

    def request_headers(self, stream: bool, headers: Mapping[str, str], api_key: Optional[str]) -> Dict[str, str]:
        return request_headers(stream, headers, api_key, self.api_key_header)

    def response_of(self, payload: Any, url: str, redact: Redactor) -> Response:
        return response_from_json(payload, url, redact)

    def status_error(self, resp: requests.Response, url: str, text: str, stream: bool, base_url: str) -> LlmError:
        # No stream_options is sent here: no hint about turning it off.
        return http_error(resp.status_code, resp.reason or "", url, text, resp.headers, base_url=base_url,
                          sent_stream_options=False)

    def no_answer(self, exc: BaseException, url: str, base_url: str, connect_timeout: float) -> str:
        return connection_error_message(exc, url, base_url, connect_timeout)

    def raise_in_band_error(self, payload: Any, url: str, redact: Redactor) -> None:
        raise_in_band_error(payload, url, redact)


class OpenAIResponsesClient(HttpProviderClient):
    """OpenAI's Responses API (and the servers that speak it: vLLM, Ollama, llama.cpp, LM Studio, OpenRouter, Azure).

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1`` (without
    one: ``STREAMENGINE_BASE_URL``, ``OPENAI_BASE_URL`` or OpenAI's); requests
    go to ``{base_url}/responses``.  The options are
    :class:`OpenAICompatibleClient`'s (``extra_body``/``extra_headers``/
    ``extra_query``, ``timeout=``, ``max_retries=`` included); ``stream_options`` is accepted for the
    same signature and ignored: this API always reports usage with
    ``response.completed`` and refuses ``stream_options.include_usage``.

    Conversations are sent whole (stateless, like Chat Completions): the
    engine's messages become ``instructions`` and ``input`` items, tool calls
    ``function_call`` items and tool results ``function_call_output`` items.
    Pass ``CompletionOptions(extra={"store": False})`` to keep OpenAI from
    storing the responses.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: Optional[float] = None,
        query: Optional[Mapping[str, str]] = None,
        api_key_header: str = "Authorization",
        stream_options: bool = True,
        default_headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> None:
        headers, connect, retries = sdk_settings(headers, default_headers, connect_timeout, timeout, max_retries)
        if base_url is None:
            base_url, api_key = env_base_url(), api_key if api_key is not None else env_api_key()
        super().__init__(ResponsesWire(api_key_header), base_url, api_key, session=session, headers=headers,
                         connect_timeout=connect, query=check_query(query), max_retries=retries)

    #: Accepted for the Chat Completions client's signature; this API reports usage unasked.
    stream_options = False

    @classmethod
    def from_env(cls, **kwargs: Any) -> OpenAIResponsesClient:
        """Build from the environment, as :meth:`OpenAICompatibleClient.from_env` does."""
        return cls(env_base_url(), env_api_key(), **kwargs)

    def embed(
        self, texts: Sequence[str], model: str, *, cancel: Optional[threading.Event] = None,
    ) -> List[List[float]]:
        """Embed ``texts`` in one request to the same API's ``/embeddings``; vectors in input order."""
        return embed(self, texts, model, cancel)
