"""The OpenAI-compatible Chat Completions wire: the request, its errors, chunk parsing, the client.

One wire, one module: what the client sends (body, headers, query), what
went wrong in words a person acts on, how frames and answers become
Chunks and Responses, and :class:`OpenAICompatibleClient` over the shared
HTTP transport.

What the OpenAI-compatible client sends: the JSON body, the headers, the query.

Everything here is checked when the client is built or the call is made, so a
bad option is a ConfigError naming it; the key and extra headers are checked
in ``http/options.py``, for every provider alike.

What went wrong with a provider, in words a person acts on.

Every message starts with the cause ("could not connect to URL: connection
refused") and ends with what to do; the library exception underneath stays
chained for ``-v`` and tracebacks.

OpenAI chat-completion frames and answers -> Chunks and Responses.

Providers differ in the details, so parsing is lenient where it costs nothing
(a null or ``"0"`` choice index, arguments sent as an object, text sent as a
list of parts) and strict where a wrong guess would lose or invent an answer:
a stream is complete only with ``[DONE]`` or a finish reason -- a
close-delimited body cut mid-stream looks like a clean end -- and a frame that
is not a JSON object is a protocol error.

The OpenAI-compatible chat-completions client (OpenAI, Azure, vLLM, llama.cpp, Ollama, LM Studio...).

The transport (cancellable connection, bounded reads, SSE framing, error
translation, redaction) is ``transport.py``'s, shared with every provider.
What is sent lives in ``openai_request``, how answers are parsed in
``openai_parse``, how failures are worded in ``openai_errors``.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import ssl
import threading
from typing import Any, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

import requests

from .._errors import ConfigError, LlmError, LlmHttpError, LlmProtocolError
from .._logs import Redactor
from .._messages import (
    Chunk,
    CompletionOptions,
    MessageLike,
    Response,
    StopReason,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    as_messages,
    text_chunk,
)
from .._parts import FilePart, Part
from .._wait import Wait
from .http.connection import RequestTracker
from .http.errors import in_band_error, in_band_status, short_cause, status_error
from .http.options import check_headers, sdk_settings
from .http.sse_read import WAIT
from .http.transport import HttpProviderClient, SseStreamParser, Wire, content_headers, encode_body

#: The one default provider URL (the CLI and ``from_env`` use it too).
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def env_base_url(environ: Optional[Mapping[str, str]] = None) -> str:
    """``STREAMENGINE_BASE_URL``, else the openai SDK's ``OPENAI_BASE_URL``, else OpenAI's API."""
    env = os.environ if environ is None else environ
    return env.get("STREAMENGINE_BASE_URL") or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL


def env_api_key(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``STREAMENGINE_API_KEY``, else the openai SDK's ``OPENAI_API_KEY``."""
    env = os.environ if environ is None else environ
    return env.get("STREAMENGINE_API_KEY") or env.get("OPENAI_API_KEY") or None


def chat_body(messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
              options: Optional[CompletionOptions], *, stream: bool, stream_options: bool) -> Dict[str, Any]:
    """The chat-completions request; ``stream_options`` asks for the usage frame at the end.

    Servers that predate ``stream_options`` answer 400 to it (older Azure API
    versions, some proxies): ``stream_options=False`` leaves it out, and the
    run then simply reports no token usage.
    """
    body: Dict[str, Any] = {"messages": [m.to_openai() for m in as_messages(messages)]}
    if tools:
        body["tools"] = [t.to_openai() for t in tools]
    if stream:
        body["stream"] = True
        if stream_options:
            body["stream_options"] = {"include_usage": True}
    body.update((options or CompletionOptions()).to_body())
    return body


def request_headers(stream: bool, extra: Mapping[str, str], api_key: Optional[str],
                    api_key_header: str) -> Dict[str, str]:
    """Content negotiation, the caller's headers, then the key (``Bearer`` for ``Authorization``)."""
    headers = content_headers(stream)
    headers.update(extra)
    if api_key:
        if api_key_header.lower() == "authorization":
            headers["Authorization"] = f"Bearer {api_key}"
        else:  # Azure's ``api-key``, a gateway's ``x-api-key``: the bare key
            headers[api_key_header] = api_key
    return headers


def check_query(query: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Query parameters sent with every request (Azure's ``api-version``), as strings."""
    checked: Dict[str, str] = {}
    for name, value in (query or {}).items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ConfigError(f"query parameters must be text names and values, got {name!r}={value!r} "
                              f"(e.g. query={{'api-version': '2024-10-21'}})")
        checked[name] = value
    return checked


_HINTS = {
    400: "the provider rejected the request; check the model name, messages and options",
    401: "check the API key (STREAMENGINE_API_KEY or OPENAI_API_KEY)",
    403: "the API key is not allowed to use this model or endpoint",
    404: "check base_url and the model name",
    429: "rate limited by the provider; slow down or retry later",
}
NO_JINJA_HINT = ("the server cannot take native tools (llama-server without --jinja): start it with --jinja, "
                 "or call tools inline with EngineConfig(tool_mode='inline') (CLI: --tool-mode inline)")
NO_STREAM_OPTIONS_HINT = ("the server does not accept 'stream_options': turn it off with "
                          "OpenAICompatibleClient(..., stream_options=False) (CLI: --no-stream-options)")


def http_error(status: int, reason: str, url: str, text: str, headers: Mapping[str, str], *,
               base_url: str, sent_stream_options: bool) -> LlmHttpError:
    """The LlmHttpError for an error status: status, provider's message, then what to do."""
    detail = provider_message(text) or text[:300].strip() or "(empty body)"
    return status_error(status, reason, url, text, headers, detail=detail,
                        hint=_hint(status, text, base_url, sent_stream_options))


def _hint(status: int, text: str, base_url: str, sent_stream_options: bool) -> str:
    if sent_stream_options and 400 <= status < 500 and status not in (401, 403, 404, 429) \
            and "stream_options" in text:
        return NO_STREAM_OPTIONS_HINT
    if "--jinja" in text:
        return NO_JINJA_HINT
    if status == 404:
        suggestion = _with_v1(base_url)
        if suggestion:
            return f"the base URL has no /v1: did you mean {suggestion}?"
    return _hint_for_status(status)


def _with_v1(base_url: str) -> Optional[str]:
    """``base_url + "/v1"`` when the URL looks like a server root missing the API prefix."""
    path = urlsplit(base_url).path
    segments = [s for s in path.split("/") if s]
    if any(re.fullmatch(r"v\d+(?:beta|alpha)?\d*", s) for s in segments) or "deployments" in segments:
        return None
    return base_url.rstrip("/") + "/v1"


def connection_error_message(exc: BaseException, url: str, base_url: str, connect_timeout: float) -> str:
    """One line for a request that got no answer: where, the cause in plain words, what to check."""
    causes = list(_causes(exc))

    def found(*kinds: Any, names: Tuple[str, ...] = ()) -> Optional[BaseException]:
        return next((c for c in causes if isinstance(c, kinds) or type(c).__name__ in names), None)

    where = f"could not connect to {base_url}"
    if found(ConnectionRefusedError):
        return f"{where}: connection refused \u2014 is the server running?"
    if found(socket.gaierror, names=("NameResolutionError",)):
        host = urlsplit(base_url).hostname
        return f"{where}: cannot resolve the host name {host!r} \u2014 check the base URL and your network"
    tls = found(ssl.SSLError)
    if tls is not None:
        return (f"{where}: TLS handshake failed ({short_cause(tls)}) "
                f"\u2014 check http:// vs https:// and the server's certificate")
    # urllib3's NewConnectionError subclasses ConnectTimeoutError: it only counts with a real timeout.
    timeout = found(requests.ConnectTimeout, socket.timeout)
    if timeout is not None:
        return (f"{where}: no answer to the connection within {connect_timeout:g}s ({type(timeout).__name__}) "
                f"\u2014 is the host reachable (firewall, VPN, the port)?")
    dropped = found(ConnectionResetError, BrokenPipeError, names=("RemoteDisconnected",))
    if dropped is not None:
        return (f"the server at {base_url} closed the connection before answering ({short_cause(dropped)}) "
                f"\u2014 it may have crashed or be overloaded; retry, or check the URL (http vs https, the port)")
    deepest = causes[-1] if causes else exc
    return (f"no answer from {url}: {short_cause(deepest)} \u2014 check that the provider is running and base_url "
            f"is right")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then everything underneath it (cause, context, urllib3's ``reason``, args)."""
    seen = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
        todo.extend(e for e in linked if isinstance(e, BaseException))


def provider_message(text: str) -> Optional[str]:
    """The provider's own error message from a JSON error body, if there is one."""
    try:
        payload = json.loads(text)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload)
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        for key in ("message", "detail", "error"):
            said = error.get(key)
            if isinstance(said, str) and said:
                return said
    detail = payload.get("detail")
    return detail if isinstance(detail, str) else None


def raise_in_band_error(payload: Any, url: str, redact: Any, after: Optional[int] = None) -> None:
    """Raise for an ``{"error": ...}`` object in a 200 answer or stream; nothing otherwise.

    Classified by :func:`..http.errors.in_band_error` like every wire: the
    provider's status (``status``, ``status_code``, a numeric ``code``) or
    its type decides, so Groq's ``invalid_request_error`` with status 400 is
    as fatal as an HTTP 400.
    """
    if not isinstance(payload, dict) or not payload.get("error"):
        return
    error = payload["error"]
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind, code = error.get("type"), error.get("code")
        status = error.get("status_code", error.get("status", payload.get("status_code")))
    else:
        message, kind, code, status = str(error), None, None, payload.get("status_code")
    facts = ", ".join(f"{k}={v}" for k, v in (("type", kind), ("code", code)) if v is not None)
    where = f"in the stream after {after} events" if after is not None else "in its answer"
    described = f"provider at {url} sent an error {where}: {message}" + (f" ({facts})" if facts else "")
    raise in_band_error(described, in_band_status(status=status, kind=kind, code=code, message=message),
                        json.dumps(payload)[:1024], redact, _hint_for_status)


def _hint_for_status(status: int) -> str:
    return _HINTS.get(status) or ("the provider failed; retry later or fail over to another model"
                                  if status >= 500 else "the request was not accepted")


_scan_json: Callable[[str, int], Tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
# (obj, end) from a str and an index, in C; typeshed does not declare scan_once.


class StreamParser(SseStreamParser):
    """SSE events of one response -> Chunks, with the completion rule and error mapping."""

    end_marker = "a finish reason or [DONE]"

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Union[Chunk, Wait], None, Chunk]:
        # The per-event loop is the hot path (100k+ events/s): names are bound
        # to locals, and a plain ``data:`` JSON object without "error" goes
        # straight to _chunk_from_frame.
        chunk_of, from_frame, scan = self._chunk, self._chunk_from_frame, _scan_json
        with self.reading(resp, cancel, tracker) as (events, flag):
            for name, data in events:
                if name is WAIT:  # the body would block: the run waits for it, with everything else
                    yield data
                    continue
                if flag.cancelled:
                    break
                self.events += 1
                if data == "[DONE]":
                    self.ended = True
                    return self.completed()
                try:
                    frame, end = scan(data, 0)
                except (StopIteration, ValueError):
                    end = -1
                if end == len(data) and name == "message" and type(frame) is dict and "error" not in frame:
                    yield from_frame(frame)
                    continue
                chunk = chunk_of(name, data)
                if chunk is not None:
                    yield chunk
        return self.unfinished(cancel, tracker)

    def _chunk(self, event_name: str, data: str) -> Optional[Chunk]:
        if event_name == "ping":
            return None
        try:
            # The C scanner json.loads ends in, without its three Python frames;
            # anything unusual (whitespace around, trailing data, an error)
            # goes through json.loads for its exact result or message.
            frame, end = _scan_json(data, 0)
            if end != len(data):
                frame = json.loads(data)
        except (StopIteration, ValueError):
            try:
                frame = json.loads(data)
            except ValueError as exc:
                if event_name == "error":
                    frame = {"error": {"message": data}}
                else:
                    raise LlmProtocolError(
                        f"{self.url} sent a stream frame that is not JSON ({exc}): "
                        f"{self.redact(data[:200])!r}; the provider does not speak the OpenAI stream format"
                    ) from exc
        if type(frame) is not dict:
            raise LlmProtocolError(
                f"{self.url} sent a stream frame that is not a JSON object: {self.redact(data[:200])!r}"
            )
        if event_name == "error" and "error" not in frame:
            frame = {"error": frame}
        if frame.get("error"):
            raise_in_band_error(frame, self.url, self.redact, after=self.events - 1)
        return self._chunk_from_frame(frame)

    def _chunk_from_frame(self, frame: Dict[str, Any]) -> Chunk:
        """The Chunk of a JSON frame; the dominant shape directly, the same as :meth:`_chunk_of_any_frame`.

        That shape is a text delta: the first choice's index 0 (or none),
        a delta of only a non-empty string ``content``, no finish reason,
        no usage.  The subscripts succeed only on dicts and a list (json
        makes nothing else with them), so they are the type checks too.
        """
        try:
            choice = frame["choices"][0]
            delta = choice["delta"]
            content = delta["content"]
        except (KeyError, IndexError, TypeError):
            return self._chunk_of_any_frame(frame)
        index = choice.get("index", 0)
        if (len(delta) != 1 or type(content) is not str or not content or choice.get("finish_reason") is not None
                or index != 0 or type(index) is not int or frame.get("usage") is not None):
            return self._chunk_of_any_frame(frame)
        model = frame.get("model")
        if type(model) is str:
            self.model = model
        return text_chunk(content, self.model)

    def _chunk_of_any_frame(self, frame: Dict[str, Any]) -> Chunk:
        # Exact type checks are isinstance checks here: json makes exact types.  The answer's id is
        # read here, not in the text fast path: the role delta, the finish and the usage frames carry it too.
        get = frame.get
        model = get("model")
        if type(model) is str:
            self.model = model
        if self.response_id is None:
            response_id = get("id")
            if type(response_id) is str and response_id:
                self.response_id = response_id
        usage = get("usage")
        if usage is not None:
            usage = _usage(usage)
            if usage is not None:
                self.usage = usage
        choices = get("choices")
        choice = choices[0] if type(choices) is list and choices else None
        if type(choice) is dict:
            index = choice.get("index", 0)
            if index != 0 or type(index) is not int:
                choice = _first_choice(choices)
        else:
            choice = _first_choice(choices)
        delta = choice.get("delta")
        if type(delta) is not dict:
            delta = {}
        finish = choice.get("finish_reason")
        if finish and type(finish) is str:
            self.finish_reason = finish = StopReason.known(finish)
        else:
            finish = None
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning is not None:
            reasoning = _text_or_none(reasoning)
        refusal = delta.get("refusal")
        if refusal is not None:
            refusal = _text_or_none(refusal)
        if type(content) is list:
            content, reasoning, refusal = _typed_parts(content, reasoning, refusal)
        elif type(content) is not str or not content:
            content = None
        tool_calls = delta.get("tool_calls")
        return Chunk(content, reasoning, () if tool_calls is None else _tool_call_deltas(tool_calls),
                     False, usage, finish, self.model, refusal)


def _text_or_none(value: Any) -> Optional[str]:
    """Text: a string, or the text of a list of parts (``[{"type": "text", "text": ...}]``).

    Anything else (a number, an object) is not text and is ignored.
    """
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):
        return _typed_parts(value, None, None)[0]
    return None


#: Where each typed content part keeps its text, and what it is to the caller.
_PART_TEXT = {"text": ("text", 0), "output_text": ("text", 0), "thinking": ("thinking", 1),
              "reasoning": ("reasoning", 1), "refusal": ("refusal", 2)}


def _typed_parts(parts: List[Any], reasoning: Optional[str],
                 refusal: Optional[str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """``(content, reasoning, refusal)`` of a list of typed parts, read as the provider means them.

    ``text`` parts are the answer; ``thinking`` parts are reasoning --
    Magistral sends ``{"type": "thinking", "thinking": [{"type": "text",
    "text": ...}]}`` -- and ``refusal`` parts (OpenAI) are a refusal.
    Reasoning or a refusal the delta already carries comes first.  A part of
    an unknown type is ignored: guessing would show internals as the answer.
    """
    found: List[List[str]] = [[], [reasoning] if reasoning else [], [refusal] if refusal else []]
    for part in parts:
        if not isinstance(part, dict):
            continue
        key, slot = _PART_TEXT.get(part.get("type", "text"), (None, 0))
        if key is None:
            continue
        value = part.get(key)
        text = value if isinstance(value, str) else (_text_or_none(value) if isinstance(value, list) else None)
        if text:
            found[slot].append(text)
    content, thought, refused = ("".join(texts) or None for texts in found)
    return content, thought, refused


def _choice_index(choice: Dict[str, Any]) -> Optional[int]:
    index = choice.get("index", 0)
    if index is None:
        return 0  # some servers send null for the only choice
    if isinstance(index, bool):
        return None
    if isinstance(index, int):
        return index
    if isinstance(index, str) and index.strip().isdigit():
        return int(index)
    return None


def _first_choice(choices: Any) -> Dict[str, Any]:
    """The choice with index 0 (``n > 1`` is not supported: other choices are ignored).

    A missing, null or ``"0"`` index counts as 0: dropping the only choice of
    a sloppy server would silently lose the answer.
    """
    if not isinstance(choices, list):
        return {}
    for choice in choices:
        if isinstance(choice, dict) and _choice_index(choice) == 0:
            return choice
    return {}


def _token_count(value: Any) -> Optional[int]:
    """A token count: a non-negative integer (``3.0`` accepted); anything else is unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value < 1 << 53:
        return value
    return None


def _usage(raw: Any, prompt_key: str = "prompt_tokens", completion_key: str = "completion_tokens") -> Optional[Usage]:
    """Usage numbers; a frame with absurd ones (``1e400``, ``"x"``, ``-5``) carries no usage.

    The keys are Chat Completions'; the Responses wire passes its own
    (``input_tokens``, ``output_tokens``).  Both wires give the cached part
    of the prompt and the reasoning part of the completion in
    ``{key}_details`` (``prompt_tokens_details.cached_tokens``,
    ``input_tokens_details.cached_tokens``...); an absurd detail counts as 0.
    """
    if not isinstance(raw, dict):
        return None
    prompt = _token_count(raw.get(prompt_key) or 0)
    completion = _token_count(raw.get(completion_key) or 0)
    if prompt is None or completion is None:
        return None
    total = _token_count(raw.get("total_tokens") or (prompt + completion))
    if total is None:
        return None
    return Usage(prompt, completion, total, _detail(raw, f"{prompt_key}_details", "cached_tokens"),
                 _detail(raw, f"{completion_key}_details", "reasoning_tokens"))


def _detail(raw: Dict[str, Any], group: str, name: str) -> int:
    details = raw.get(group)
    return (_token_count(details.get(name) or 0) or 0) if isinstance(details, dict) else 0


def _arguments_text(raw: Any) -> Optional[str]:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    return json.dumps(raw)  # some servers send an object instead of JSON text


def _string_or_none(value: Any) -> Optional[str]:
    """Ids and names are strings; a number or a list there is garbage, not a name."""
    return value if isinstance(value, str) and value else None


def _tool_call_deltas(raw: Any) -> Tuple[ToolCallDelta, ...]:
    if not isinstance(raw, list):
        return ()
    deltas = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict):
            continue
        raw_function = item.get("function")
        function: Dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        index = item.get("index", position)
        # Empty strings are "not sent": an empty id would look like a new call.
        call_id = _string_or_none(item.get("id"))
        name = _string_or_none(function.get("name"))
        arguments = _arguments_text(function.get("arguments")) or None
        if call_id is None and name is None and arguments is None:
            continue
        valid_index = isinstance(index, int) and not isinstance(index, bool)
        deltas.append(ToolCallDelta(index=index if valid_index else position,
                                    id=call_id, name=name, arguments_fragment=arguments))
    return tuple(deltas)



def response_from_json(payload: Any, redact: Any) -> Response:
    if not isinstance(payload, dict):
        raise LlmProtocolError(f"a chat completion must be a JSON object, got {redact(str(payload)[:200])!r}")
    choice = _first_choice(payload.get("choices"))
    message = choice.get("message") if isinstance(choice.get("message"), dict) else None
    if message is None:
        raise LlmProtocolError(
            f"the chat completion has no choices[0].message: {redact(json.dumps(payload)[:300])}; "
            f"the provider does not speak the OpenAI format"
        )
    calls = []
    for position, item in enumerate(message.get("tool_calls") or ()):
        if not isinstance(item, dict):
            continue
        raw_function = item.get("function")
        function: Dict[str, Any] = raw_function if isinstance(raw_function, dict) else {}
        calls.append(ToolCall(id=_string_or_none(item.get("id")) or f"call_{position}",
                              name=_string_or_none(function.get("name")) or "",
                              arguments=_arguments_text(function.get("arguments")) or "{}"))
    finish = choice.get("finish_reason")
    raw_content = message.get("content")
    reasoning = _text_or_none(message.get("reasoning_content") or message.get("reasoning"))
    refusal = _text_or_none(message.get("refusal"))
    content: Optional[str] = raw_content if isinstance(raw_content, str) else None
    if isinstance(raw_content, list):
        content, reasoning, refusal = _typed_parts(raw_content, reasoning, refusal)
    return Response(
        content=content or "",
        reasoning=reasoning,
        refusal=refusal,
        tool_calls=tuple(calls),
        usage=_usage(payload.get("usage")),
        model=payload.get("model") if isinstance(payload.get("model"), str) else None,
        finish_reason=StopReason.known(finish) if isinstance(finish, str) else None,
        id=_string_or_none(payload.get("id")),
    )


def vectors_from_json(payload: Any, expected: int) -> List[List[float]]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        got = len(data) if isinstance(data, list) else "no"
        raise LlmProtocolError(
            f"the embeddings answer holds {got} vectors for {expected} inputs; "
            f"the provider does not speak the OpenAI embeddings format"
        )
    try:
        ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
        return [[float(x) for x in item["embedding"]] for item in ordered]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise LlmProtocolError(
            f"the embeddings answer is malformed ({exc}); expected data[i].embedding lists") from exc


class ChatCompletionsWire(Wire):
    """The Chat Completions API: ``POST {base_url}/chat/completions``, its SSE chunks, its errors."""

    chat_path = "/chat/completions"
    example_base_url = "http://127.0.0.1:8000/v1"
    api_root_hint = "is base_url an OpenAI-compatible API root (ending in /v1)?"
    key_source = "STREAMENGINE_API_KEY or OPENAI_API_KEY"
    log_name = "streamengine._clients.openai.OpenAICompatibleClient"
    parser_class = StreamParser
    name = "the Chat Completions API"

    def __init__(self, api_key_header: str, stream_options: bool) -> None:
        self.api_key_header = checked_key_header(api_key_header)
        self.stream_options = bool(stream_options)

    def cannot_carry(self, part: Part) -> Optional[str]:
        if isinstance(part, FilePart) and part.url is not None:
            return ("it takes a file as data (a data URL) or a file_id, not by URL; attach the file itself, "
                    "or use OpenAIResponsesClient, whose input_file takes a URL")
        return None

    def chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                  options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return chat_body(messages, tools, options, stream=stream, stream_options=stream and self.stream_options)

    def request_headers(self, stream: bool, headers: Mapping[str, str], api_key: Optional[str]) -> Dict[str, str]:
        return request_headers(stream, headers, api_key, self.api_key_header)

    def response_of(self, payload: Any, url: str, redact: Redactor) -> Response:
        return response_from_json(payload, redact)

    def status_error(self, resp: requests.Response, url: str, text: str, stream: bool, base_url: str) -> LlmError:
        return http_error(resp.status_code, resp.reason or "", url, text, resp.headers, base_url=base_url,
                          sent_stream_options=stream and self.stream_options)

    def no_answer(self, exc: BaseException, url: str, base_url: str, connect_timeout: float) -> str:
        return connection_error_message(exc, url, base_url, connect_timeout)

    def raise_in_band_error(self, payload: Any, url: str, redact: Redactor) -> None:
        raise_in_band_error(payload, url, redact)


def checked_key_header(name: Any) -> str:
    """The header the key goes in (``Authorization``, Azure's ``api-key``), refused now if it cannot be sent."""
    check_headers({name: "x"} if isinstance(name, str) else {None: "x"})  # type: ignore[dict-item]
    return str(name)


def embed(client: HttpProviderClient, texts: Sequence[str], model: str,
          cancel: Optional[threading.Event]) -> List[List[float]]:
    """``texts`` embedded in one request to ``{base_url}/embeddings``; vectors in input order."""
    if isinstance(texts, (str, bytes)):
        raise ConfigError(
            "embed() takes a list of texts, e.g. embed(['some text'], model), not one string")
    texts = list(texts)
    if not texts:
        return []
    payload = client._json("/embeddings", encode_body({"model": model, "input": texts}), cancel)
    return vectors_from_json(payload, len(texts))


class OpenAICompatibleClient(HttpProviderClient):
    """Chat completions (streamed or not) and embeddings over one ``requests.Session``.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1``; requests go
    to ``{base_url}/chat/completions`` and ``{base_url}/embeddings``.  A
    ``session`` you pass is used as is, except that a cancellable adapter is
    mounted for ``base_url`` (needed to abort a request before its headers);
    it is not closed by :meth:`close`.

    The API key is sent as ``Authorization: Bearer KEY``, or bare in the header
    named by ``api_key_header`` (Azure's ``api-key``).  It is never logged or
    shown in errors: surrounding whitespace (a key read from a file ends with
    a newline) is stripped, a key that cannot be a header value is refused
    without being shown, and the key -- and the values of credential-like
    ``headers`` -- are replaced by ``***`` in every message built from what
    the provider sent back.

    ``query`` (or a query string in ``base_url``) is sent with every request:
    Azure's ``api-version``.  ``stream_options=False`` stops asking for the
    usage frame (``stream_options``), for servers that refuse the field.

    As with the openai SDK: without ``base_url`` it is ``STREAMENGINE_BASE_URL``,
    else ``OPENAI_BASE_URL``, else OpenAI's (and the key
    ``STREAMENGINE_API_KEY``/``OPENAI_API_KEY``); ``default_headers=``,
    ``timeout=`` and ``max_retries=`` are taken, and ``extra_body``,
    ``extra_headers`` and ``extra_query`` in the options go where the SDK puts
    them (see :mod:`.http.options`).
    """

    wire: ChatCompletionsWire

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
        super().__init__(ChatCompletionsWire(api_key_header, stream_options), base_url, api_key, session=session,
                         headers=headers, connect_timeout=connect, query=check_query(query), max_retries=retries)

    @property
    def stream_options(self) -> bool:
        """Whether a streamed request asks for the usage frame (``stream_options``)."""
        return self.wire.stream_options

    @classmethod
    def from_env(cls, **kwargs: Any) -> OpenAICompatibleClient:
        """Build from the environment, the openai SDK's variables included.

        Base URL: ``STREAMENGINE_BASE_URL``, else ``OPENAI_BASE_URL``, else
        OpenAI's.  Key: ``STREAMENGINE_API_KEY``, else ``OPENAI_API_KEY``.
        """
        return cls(env_base_url(), env_api_key(), **kwargs)

    def embed(
        self, texts: Sequence[str], model: str, *, cancel: Optional[threading.Event] = None,
    ) -> List[List[float]]:
        """Embed ``texts`` in one request; vectors come back in input order."""
        return embed(self, texts, model, cancel)
