"""The OpenAI-compatible chat-completions client (OpenAI, vLLM, llama.cpp, Ollama ``/v1``...).

This is the one boundary where HTTP, urllib3 and sseclient-py errors become
streamengine errors (``raise ... from exc``), so nothing above it needs to
know which library spoke to the provider.

Design points, each measured (``FACTS.md``):

* the body is read with ``resp.raw.read1(65536)``: it returns whatever has
  arrived, on chunked, close-delimited and Content-Length bodies alike, where
  ``iter_content(n)`` would wait to fill ``n`` bytes;
* cancelling shuts the socket down (``connection.py``): closing a response
  from another thread does not unblock a read;
* a close-delimited body cut mid-stream looks like a clean end, so a stream
  is complete only with ``[DONE]`` or a finish reason, never by the mere
  absence of an exception;
* the only timeout here is the connect timeout (and a 50 ms budget to read
  the few bytes after ``[DONE]``, so a chunked connection can be reused).
  Idle and total timeouts live in the call strategies, where only
  meaningful chunks count.
"""
from __future__ import annotations

import email.utils
import http.client
import itertools
import json
import math
import os
import re
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Tuple

import requests
import urllib3.exceptions

from .._sse_read import MAX_EVENT_BYTES, SseEventTooLarge, SseFramer, iter_event_batches, read1_iter
from ..cancel import on_cancel
from ..errors import (
    ConfigError, LlmCancelledError, LlmConnectionError, LlmError, LlmHttpError, LlmProtocolError,
    LlmStreamError,
)
from ..logs import component_logger
from ..messages import (
    Chunk, CompletionOptions, MessageLike, Response, ToolCall, ToolCallDelta, ToolSpec, Usage,
    as_messages,
)
from .base import StreamingLlmClient
from .connection import RequestTracker, mount_cancellable, tracking

__all__ = ["OpenAICompatibleClient", "parse_retry_after"]

_chain = itertools.chain.from_iterable
_scan_json = json.JSONDecoder().scan_once  # (obj, end) from a str and an index, in C

DEFAULT_BASE_URL = "https://api.openai.com/v1"
READ_SIZE = 65536
ERROR_BODY_LIMIT = 64 * 1024  # read this much of an error body; LlmHttpError keeps 1 KB
JSON_BODY_LIMIT = 64 * 1024 * 1024
MAX_RETRY_AFTER_S = 86400.0

# "rate" alone would match "generate"; these are the words providers use.
_OVERLOAD = re.compile(r"overload|rate[ _-]?limit|too many requests|capacity|\b(?:429|503|529)\b", re.I)
_STREAM_ERRORS = (
    requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
)
_HINTS = {
    400: "the provider rejected the request; check the model name, messages and options",
    401: "check the API key (STREAMENGINE_API_KEY or OPENAI_API_KEY)",
    403: "the API key is not allowed to use this model or endpoint",
    404: "check base_url and the model name",
    429: "rate limited by the provider; slow down or retry later",
}


class OpenAICompatibleClient(StreamingLlmClient):
    """Chat completions (streamed or not) and embeddings over one ``requests.Session``.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1``; requests go
    to ``{base_url}/chat/completions`` and ``{base_url}/embeddings``.  A
    ``session`` you pass is used as is, except that a cancellable adapter is
    mounted for ``base_url`` (needed to abort a request before its headers);
    it is not closed by :meth:`close`.  The API key is sent as a bearer token
    and never logged or shown in errors: surrounding whitespace (a key read
    from a file ends with a newline) is stripped, a key that cannot be a
    header value is refused without being shown, and the key -- and the
    values of credential-like ``headers`` such as ``api-key`` -- are replaced
    by ``***`` in every message built from what the provider sent back.
    """

    #: An SSE event larger than this is refused (LlmProtocolError), bounding memory.
    max_event_bytes: int = MAX_EVENT_BYTES

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str] = None,
        *,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/]", base_url):
            raise ConfigError(
                f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', got {base_url!r}"
            )
        if not (isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < math.inf):
            raise ConfigError(
                f"connect_timeout must be a positive number of seconds, got {connect_timeout!r}")
        self.base_url = base_url.rstrip("/")
        self._api_key = _check_api_key(api_key)
        self._headers = _check_headers(headers)
        # Everything an error message or log line must never show: the key and
        # the values of credential-like headers (Azure's ``api-key``...).
        self._secrets = _secret_forms(
            [self._api_key] + [v for k, v in self._headers.items() if _SENSITIVE_HEADER.search(k)])
        self.connect_timeout = float(connect_timeout)
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        if self._owns_session:
            mount_cancellable(self._session)
        else:
            mount_cancellable(self._session, (self.base_url + "/",))
        self._log = component_logger("streamengine.clients.openai.OpenAICompatibleClient")

    @classmethod
    def from_env(cls, **kwargs: Any) -> "OpenAICompatibleClient":
        """Build from ``STREAMENGINE_BASE_URL`` and ``STREAMENGINE_API_KEY`` / ``OPENAI_API_KEY``."""
        base_url = os.environ.get("STREAMENGINE_BASE_URL") or DEFAULT_BASE_URL
        api_key = os.environ.get("STREAMENGINE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        return cls(base_url, api_key, **kwargs)

    def __repr__(self) -> str:
        key = "***" if self._api_key else None
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={key!r})"

    def close(self) -> None:
        """Close pooled connections (only if this client created the session)."""
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> "OpenAICompatibleClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- public calls ----------------------------------------------------------

    def stream(
        self,
        messages: Sequence[MessageLike],
        tools: Optional[Sequence[ToolSpec]] = None,
        options: Optional[CompletionOptions] = None,
        cancel: Optional[threading.Event] = None,
    ) -> Iterator[Chunk]:
        """Yield chunks as they arrive; the last one has ``is_completed=True``.

        Arguments are checked now; the request is sent on the first ``next()``.
        """
        body = self._chat_body(messages, tools, options, stream=True)
        return self._stream(_encode(body), cancel)

    def complete(
        self,
        messages: Sequence[MessageLike],
        tools: Optional[Sequence[ToolSpec]] = None,
        options: Optional[CompletionOptions] = None,
        cancel: Optional[threading.Event] = None,
    ) -> Response:
        """One non-streamed chat completion."""
        body = self._chat_body(messages, tools, options, stream=False)
        payload = self._post_json("/chat/completions", _encode(body), cancel)
        return _response_from_json(payload, self._redact)

    def embed(
        self, texts: Sequence[str], model: str, *, cancel: Optional[threading.Event] = None,
    ) -> List[List[float]]:
        """Embed ``texts`` in one request; vectors come back in input order."""
        if isinstance(texts, (str, bytes)):
            raise ConfigError(
                "embed() takes a list of texts, e.g. embed(['some text'], model), not one string")
        texts = list(texts)
        if not texts:
            return []
        payload = self._post_json("/embeddings", _encode({"model": model, "input": texts}), cancel)
        return _vectors_from_json(payload, len(texts))

    # -- request building ------------------------------------------------------

    def _chat_body(
        self,
        messages: Sequence[MessageLike],
        tools: Optional[Sequence[ToolSpec]],
        options: Optional[CompletionOptions],
        stream: bool,
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {"messages": [m.to_openai() for m in as_messages(messages)]}
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update((options or CompletionOptions()).to_body())
        return body

    def _request_headers(self, stream: bool) -> Dict[str, str]:
        headers = {"Content-Type": "application/json",
                   "Accept": "text/event-stream" if stream else "application/json"}
        if stream:
            # A compressed event stream is buffered by some proxies; ask for none.
            headers["Accept-Encoding"] = "identity"
        headers.update(self._headers)
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text

    # -- transport -------------------------------------------------------------

    def _send(self, path: str, data: bytes, stream: bool, tracker: RequestTracker,
              cancel: Optional[threading.Event]) -> requests.Response:
        """POST and return the response with its body unread; the status is checked."""
        url = self.base_url + path
        self._log.debug("POST {} stream={} ({} bytes)", url, stream, len(data))
        if _cancelled(cancel, tracker):
            raise LlmCancelledError(f"call to {url} was cancelled before it was sent")
        try:
            with tracking(tracker):
                resp = self._session.post(
                    url, data=data, headers=self._request_headers(stream), stream=True,
                    timeout=(self.connect_timeout, None),
                )
        except _STREAM_ERRORS as exc:
            if _cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled while waiting for the answer") from exc
            raise LlmConnectionError(self._redact(
                f"could not get an answer from {url}: {type(exc).__name__}: {exc}; "
                f"check that the provider is running and base_url is right"
            )) from exc
        except UnicodeEncodeError as exc:
            # http.client encodes header values as latin-1; the only headers
            # not checked at construction are a user session's own.
            raise ConfigError(
                f"a request header for {url} cannot be sent: {exc}; HTTP header values must be "
                f"latin-1 text (check the headers of the requests.Session you passed)"
            ) from None
        try:
            if resp.status_code >= 400:
                raise self._http_error(resp, url, cancel, tracker)
        except BaseException:
            resp.close()
            raise
        return resp

    def _http_error(self, resp: requests.Response, url: str, cancel: Optional[threading.Event],
                    tracker: RequestTracker) -> LlmError:
        try:
            raw = _read_limited(resp, ERROR_BODY_LIMIT, truncate=True)
        except _STREAM_ERRORS as exc:
            if _cancelled(cancel, tracker):
                return LlmCancelledError(f"call to {url} was cancelled while reading an error answer")
            raw = f"<error body unreadable: {exc}>".encode()
        text = self._redact(raw.decode("utf-8", errors="replace"))
        retry_after = parse_retry_after(resp.headers)
        detail = _provider_message(text) or text[:300].strip() or "(empty body)"
        hint = _HINTS.get(resp.status_code) or (
            "the provider failed; retry later or fail over to another model"
            if resp.status_code >= 500 else "the request was not accepted")
        when = f"; retry after {retry_after:g}s" if retry_after is not None else ""
        message = (f"provider answered HTTP {resp.status_code} {resp.reason or ''}".rstrip()
                   + f" for {url}: {detail} ({hint}{when})")
        self._log.debug("HTTP {} from {}: {}", resp.status_code, url, detail)
        return LlmHttpError(resp.status_code, text, retry_after, message=message)

    def _post_json(self, path: str, data: bytes, cancel: Optional[threading.Event]) -> Any:
        url = self.base_url + path
        tracker = RequestTracker()
        stop_watch = on_cancel(cancel, tracker.abort)
        resp: Optional[requests.Response] = None
        try:
            resp = self._send(path, data, False, tracker, cancel)
            try:
                raw = _read_limited(resp, JSON_BODY_LIMIT, truncate=False)
            except _STREAM_ERRORS as exc:
                if _cancelled(cancel, tracker):
                    raise LlmCancelledError(f"call to {url} was cancelled while reading the answer") from exc
                raise LlmConnectionError(
                    f"the answer from {url} broke off: {type(exc).__name__}: {exc}; retry or fail over"
                ) from exc
            if _cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled")
            try:
                payload = json.loads(raw.decode("utf-8", errors="replace"))
            except ValueError as exc:
                raise LlmProtocolError(
                    f"{url} answered HTTP {resp.status_code} with a body that is not JSON "
                    f"(content type {resp.headers.get('Content-Type')!r}): "
                    f"{self._redact(raw[:200].decode('utf-8', errors='replace'))!r}; "
                    f"is base_url an OpenAI-compatible API root (ending in /v1)?"
                ) from exc
            _raise_in_band_error(payload, url, self._redact)
            return payload
        finally:
            stop_watch()
            tracker.release()
            if resp is not None:
                resp.close()

    def _stream(self, data: bytes, cancel: Optional[threading.Event]) -> Iterator[Chunk]:
        url = self.base_url + "/chat/completions"
        tracker = RequestTracker()
        stop_watch = on_cancel(cancel, tracker.abort)
        resp: Optional[requests.Response] = None

        def release() -> None:
            # Tracker first: a cancel arriving now must not reach a socket
            # that is being closed (its descriptor number may be reused).
            stop_watch()
            tracker.release()
            if resp is not None:
                resp.close()

        try:
            resp = self._send("/chat/completions", data, True, tracker, cancel)
            content_type = resp.headers.get("Content-Type", "")
            if not content_type.lower().startswith("text/event-stream"):
                raise LlmProtocolError(
                    f"{url} answered a streaming request with content type {content_type!r}, "
                    f"not 'text/event-stream': {self._redact(_excerpt(resp))!r}; is base_url an "
                    f"OpenAI-compatible API root (ending in /v1)?"
                )
            parser = _StreamParser(url, self._redact, self.max_event_bytes)
            completed = yield from parser.run(resp, cancel, tracker)
            if parser.saw_done:
                _drain_after_done(resp, tracker)
        finally:
            release()
        # Released before the last chunk goes out: a caller that stops at the
        # completed chunk and never closes the iterator holds no connection.
        self._log.debug("stream from {} completed after {} events (finish={})",
                        url, parser.events, completed.finish_reason)
        yield completed


class _StreamParser:
    """SSE events of one response -> Chunks, with the completion rule and error mapping."""

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        self.url = url
        self.max_event_bytes = max_event_bytes
        self.redact = redact
        self.events = 0
        self.saw_done = False
        self.finish_reason: Optional[str] = None
        self.usage: Optional[Usage] = None
        self.model: Optional[str] = None

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Chunk, None, Chunk]:
        """Yield the chunks of the stream; return the completed chunk (not yielded)."""
        framer = SseFramer(self.max_event_bytes, 8 * self.max_event_bytes)
        reads = read1_iter(_read1_of(resp), READ_SIZE)
        # The per-event loop is the hot path (100k+ events/s): events come in
        # one list per read (flattened in C), names are bound to locals.
        # The tracker is only ever aborted by ``cancel`` (on_cancel), so the
        # event's flag alone says "cancelled" here; a plain ``data:`` JSON
        # object without "error" goes straight to _chunk_from_frame.
        chunk_of, from_frame, scan = self._chunk, self._chunk_from_frame, _scan_json
        is_set = cancel.is_set if cancel is not None else bool
        try:
            for name, data in _chain(iter_event_batches(reads, framer)):
                if is_set():
                    break
                self.events += 1
                if data == "[DONE]":
                    self.saw_done = True
                    return self._completed()
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
        except SseEventTooLarge as exc:
            raise LlmProtocolError(f"{self.url}: {exc}") from exc
        except _STREAM_ERRORS as exc:
            if _cancelled(cancel, tracker):
                raise LlmCancelledError(f"stream from {self.url} was cancelled") from exc
            raise LlmStreamError(
                f"stream from {self.url} broke after {self.events} events: {type(exc).__name__}: "
                f"{exc}; the provider dropped the connection mid-answer, retry or fail over"
            ) from exc
        if _cancelled(cancel, tracker):
            raise LlmCancelledError(f"stream from {self.url} was cancelled")
        if self.finish_reason is not None:
            return self._completed()
        cut = (f" ({framer.dropped_bytes} bytes of an unfinished event were dropped)"
               if framer.dropped_bytes else "")
        raise LlmStreamError(
            f"stream from {self.url} ended without a finish reason or [DONE] after "
            f"{self.events} events{cut}; the answer is incomplete, retry or fail over"
        )

    def _completed(self) -> Chunk:
        return Chunk(is_completed=True, finish_reason=self.finish_reason, usage=self.usage, model=self.model)

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
            _raise_in_band_error(frame, self.url, self.redact, after=self.events - 1)
        return self._chunk_from_frame(frame)

    def _chunk_from_frame(self, frame: Dict[str, Any]) -> Chunk:
        # Exact type checks are isinstance checks here: json makes exact types.
        get = frame.get
        model = get("model")
        if type(model) is str:
            self.model = model
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
            self.finish_reason = finish
        else:
            finish = None
        content = delta.get("content")
        if type(content) is not str or not content:
            content = _text_or_none(content)
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning is not None:
            reasoning = _text_or_none(reasoning)
        tool_calls = delta.get("tool_calls")
        return Chunk(content, reasoning, () if tool_calls is None else _tool_call_deltas(tool_calls),
                     False, usage, finish, self.model)


# -- helpers: parsing -------------------------------------------------------------

def _encode(body: Dict[str, Any]) -> bytes:
    """The request JSON, built before anything is sent so a bad option fails at the call.

    ASCII-escaped on purpose: a lone surrogate (a model can send one,
    JSON-escaped, and it comes back in the next round's messages) has no
    UTF-8 form, but ``\\udXXX`` is valid JSON text.
    """
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the request cannot be sent as JSON ({exc}); check CompletionOptions.extra, "
            f"tool parameters and message contents for non-JSON values such as sets or NaN"
        ) from exc


def _text_or_none(value: Any) -> Optional[str]:
    """Delta text: a string, or a list of text parts (``[{"type": "text", "text": ...}]``).

    Anything else (a number, an object) is not text and is ignored.
    """
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):
        parts = [part.get("text") for part in value
                 if isinstance(part, dict) and part.get("type", "text") == "text"]
        joined = "".join(p for p in parts if isinstance(p, str))
        return joined or None
    return None


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


def _usage(raw: Any) -> Optional[Usage]:
    """Usage numbers; a frame with absurd ones (``1e400``, ``"x"``, ``-5``) carries no usage."""
    if not isinstance(raw, dict):
        return None
    prompt = _token_count(raw.get("prompt_tokens") or 0)
    completion = _token_count(raw.get("completion_tokens") or 0)
    if prompt is None or completion is None:
        return None
    total = _token_count(raw.get("total_tokens") or (prompt + completion))
    if total is None:
        return None
    return Usage(prompt, completion, total)


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


def _provider_message(text: str) -> Optional[str]:
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
            if isinstance(error.get(key), str) and error[key]:
                return error[key]
    if isinstance(payload.get("detail"), str):
        return payload["detail"]
    return None


def _raise_in_band_error(payload: Any, url: str, redact: Any, after: Optional[int] = None) -> None:
    if not isinstance(payload, dict) or not payload.get("error"):
        return
    error = payload["error"]
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind, code = error.get("type"), error.get("code")
    else:
        message, kind, code = str(error), None, None
    facts = ", ".join(f"{k}={v}" for k, v in (("type", kind), ("code", code)) if v is not None)
    overloaded = bool(_OVERLOAD.search(" ".join(str(v) for v in (kind, code, message) if v is not None)))
    where = f"in the stream after {after} events" if after is not None else "in its answer"
    raise LlmStreamError(
        redact(f"provider at {url} sent an error {where}: {message}"
               + (f" ({facts})" if facts else "")
               + ("; it is overloaded, retry later or fail over" if overloaded else "; retry or fail over")),
        overloaded=overloaded,
    )


def _response_from_json(payload: Any, redact: Any) -> Response:
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
    return Response(
        content=_text_or_none(message.get("content")) or "",
        tool_calls=tuple(calls),
        usage=_usage(payload.get("usage")),
        model=payload.get("model") if isinstance(payload.get("model"), str) else None,
        finish_reason=finish if isinstance(finish, str) else None,
    )


def _vectors_from_json(payload: Any, expected: int) -> List[List[float]]:
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


def parse_retry_after(headers: Mapping[str, str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date).

    A number must be plain digits with an optional fraction (RFC 9110
    ``delay-seconds``, fractions tolerated): ``nan``, ``inf``, ``-1``,
    ``1e3``, ``0x10``, ``1_0`` are not numbers here.  Anything invalid,
    negative or over a day is ignored (``None``): a broken header must not
    park a caller for a year.  A date in the past means "now" (0).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = _finite(lowered.get("retry-after-ms"))
    if ms is not None:
        return _sane(ms / 1000.0)
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is not None:
        return _sane(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return _sane(max(0.0, when.timestamp() - now))


_DELAY = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


def _finite(value: Optional[str]) -> Optional[float]:
    # float() would take "nan", "inf", "1e9", " 1_0" and "+5"; a header is digits.
    if not isinstance(value, str) or not _DELAY.fullmatch(value.strip()):
        return None
    return float(value.strip())


def _sane(seconds: float) -> Optional[float]:
    return seconds if 0.0 <= seconds <= MAX_RETRY_AFTER_S else None


# -- helpers: configuration and secrets ----------------------------------------------

# Header names whose values are credentials (``Authorization``, Azure's
# ``api-key``, ``x-api-key``, ``X-Auth-Token``...): never shown in errors.
_SENSITIVE_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.I)
_BAD_HEADER_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _check_api_key(api_key: Optional[str]) -> Optional[str]:
    """The key, stripped; refused (without showing it) if it cannot be a header value.

    A key read from a file often ends with a newline.  Sent as is, requests
    refuses the header with an error that quotes it -- which would put the
    key into exception messages, logs and a browser's error event.
    """
    if api_key is None or api_key == "":
        return None
    if not isinstance(api_key, str):
        raise ConfigError(f"api_key must be a string, got {type(api_key).__name__}")
    key = api_key.strip()
    if not key:
        return None
    if _BAD_HEADER_CHARS.search(key) or not _is_latin1(key) or " " in key:
        raise ConfigError(
            "api_key holds characters that cannot be sent in an HTTP header (control characters, "
            "spaces or non-latin-1 text); check how the key is read (STREAMENGINE_API_KEY or "
            "OPENAI_API_KEY) -- the key is not shown here on purpose")
    return key


def _check_headers(headers: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Extra headers, checked now so a bad one is a clear ConfigError, not a failure per call."""
    checked: Dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise ConfigError(f"header name {name!r} is not a valid HTTP header name")
        if not isinstance(value, str) or _BAD_HEADER_CHARS.search(value) or not _is_latin1(value):
            shown = "(value not shown)" if _SENSITIVE_HEADER.search(name) else repr(value)
            raise ConfigError(
                f"header {name!r} has a value that cannot be sent in HTTP {shown}: values must be "
                f"latin-1 text without control characters (CR, LF, NUL...)")
        checked[name] = value
    return checked


def _is_latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def _secret_forms(secrets: Sequence[Optional[str]]) -> Tuple[str, ...]:
    """Each secret as it may appear in a message: raw, and escaped inside a repr()."""
    forms = []
    for secret in secrets:
        if secret:
            forms.append(secret)
            escaped = repr(secret)[1:-1]
            if escaped != secret:
                forms.append(escaped)
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted(set(forms), key=len, reverse=True))


# -- helpers: transport ------------------------------------------------------------

def _cancelled(cancel: Optional[threading.Event], tracker: RequestTracker) -> bool:
    return tracker.aborted or (cancel is not None and cancel.is_set())


def _read1_of(resp: requests.Response) -> Callable[[int], bytes]:
    """``read1`` of the body: returns what has arrived instead of waiting to fill a buffer.

    urllib3 >= 2 has it (decoding any content encoding); on urllib3 1.x the
    http.client response underneath has it (we ask for no encoding).
    """
    raw = resp.raw
    if hasattr(raw, "read1"):
        return lambda n: raw.read1(n, decode_content=True)
    fp = getattr(raw, "_fp", None)
    if fp is not None and hasattr(fp, "read1"):
        return fp.read1
    return raw.read  # last resort: correct, but may wait for a full buffer


#: After ``[DONE]``, how long to wait for the rest of the body (a chunked body's
#: ``0\r\n\r\n``) so the connection can be reused.  It is nearly always there
#: already; a provider that holds the body open after [DONE] costs this once,
#: and its connection is closed instead of reused.
DRAIN_AFTER_DONE_S = 0.05
DRAIN_AFTER_DONE_BYTES = 64 * 1024


def _drain_after_done(resp: requests.Response, tracker: RequestTracker) -> bool:
    """Read what follows ``[DONE]`` (briefly, boundedly) so urllib3 can pool the connection.

    Closing a chunked response before its terminating chunk closes the
    connection: every streamed call would pay a new TCP (and TLS) handshake.
    Returns True when the body ended and the connection went back to the pool.
    """
    tracker.set_read_timeout(DRAIN_AFTER_DONE_S)
    read1 = _read1_of(resp)
    drained = 0
    try:
        while drained <= DRAIN_AFTER_DONE_BYTES:
            data = read1(READ_SIZE)
            if not data:
                return True
            drained += len(data)
    except _STREAM_ERRORS:
        pass  # timed out or broke after [DONE]: the answer is complete; the connection is closed
    return False


def _excerpt(resp: requests.Response, limit: int = 300) -> str:
    """The start of a body for an error message; unreadable is not a second error."""
    try:
        return _read_limited(resp, limit, truncate=True).decode("utf-8", errors="replace")
    except _STREAM_ERRORS as exc:
        return f"<body unreadable: {exc}>"


def _read_limited(resp: requests.Response, limit: int, truncate: bool) -> bytes:
    """Read the body up to ``limit`` bytes; over it, cut (``truncate``) or refuse."""
    parts: List[bytes] = []
    size = 0
    for data in read1_iter(_read1_of(resp), READ_SIZE):
        parts.append(data)
        size += len(data)
        if size > limit:
            if truncate:
                break
            raise LlmProtocolError(
                f"the answer from {resp.url} is over {limit} bytes; refusing to buffer it"
            )
    return b"".join(parts)[:limit]
