"""The OpenAI-compatible chat-completions client (OpenAI, Azure, vLLM, llama.cpp, Ollama, LM Studio...).

This is the one boundary where HTTP, urllib3 and sseclient-py errors become
streamengine errors (``raise ... from exc``), so nothing above it needs to
know which library spoke to the provider.  What is sent lives in
``openai_request``, how answers are parsed in ``openai_parse``, how failures
are worded in ``openai_errors``.

Two things about the transport that are easy to get wrong:

* cancelling shuts the socket down (``connection.py``): closing a response
  from another thread does not unblock a read;
* the only timeout here is the connect timeout (and a 50 ms budget to read
  the few bytes after ``[DONE]``, so a chunked connection can be reused).
  Idle and total timeouts live in the call strategies, where only
  meaningful chunks count: a socket timeout would be reset by keep-alives.
"""
from __future__ import annotations

import json
import math
import re
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence
from urllib.parse import parse_qsl

import requests

from .._sse_read import MAX_EVENT_BYTES
from ..cancel import on_cancel
from ..errors import ConfigError, LlmCancelledError, LlmConnectionError, LlmError, LlmProtocolError
from ..logs import component_logger
from ..messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec
from .base import StreamingLlmClient
from .connection import RequestTracker, mount_cancellable, tracking
from .http_body import STREAM_ERRORS, cancelled, drain_after_done, excerpt, read_limited
from .openai_errors import (
    connection_error_message, http_error, parse_retry_after, raise_in_band_error, short_cause,
)
from .openai_parse import StreamParser, response_from_json, vectors_from_json
from .openai_request import (
    DEFAULT_BASE_URL, SENSITIVE_HEADER, chat_body, check_api_key, check_headers, check_query, encode_body,
    env_api_key, env_base_url, request_headers, secret_forms,
)

__all__ = ["DEFAULT_BASE_URL", "OpenAICompatibleClient", "parse_retry_after"]

ERROR_BODY_LIMIT = 64 * 1024  # read this much of an error body; LlmHttpError keeps 1 KB
JSON_BODY_LIMIT = 64 * 1024 * 1024


class OpenAICompatibleClient(StreamingLlmClient):
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
        query: Optional[Mapping[str, str]] = None,
        api_key_header: str = "Authorization",
        stream_options: bool = True,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/]", base_url):
            raise ConfigError(
                f"base_url must be an http(s) URL such as 'http://127.0.0.1:8000/v1', got {base_url!r}"
            )
        if not (isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < math.inf):
            raise ConfigError(
                f"connect_timeout must be a positive number of seconds, got {connect_timeout!r}")
        root, _, query_string = base_url.partition("?")
        self.base_url = root.rstrip("/")
        self._query = dict(parse_qsl(query_string, keep_blank_values=True))
        self._query.update(check_query(query))
        self._api_key = check_api_key(api_key)
        self._headers = check_headers(headers)
        check_headers({api_key_header: "x"} if isinstance(api_key_header, str) else {None: "x"})  # type: ignore[dict-item]
        self._api_key_header = api_key_header
        self.stream_options = bool(stream_options)
        # Everything an error message or log line must never show: the key and
        # the values of credential-like headers (Azure's ``api-key``...).
        self._secrets = secret_forms(
            [self._api_key] + [v for k, v in self._headers.items() if SENSITIVE_HEADER.search(k)])
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
        """Build from the environment, the openai SDK's variables included.

        Base URL: ``STREAMENGINE_BASE_URL``, else ``OPENAI_BASE_URL``, else
        OpenAI's.  Key: ``STREAMENGINE_API_KEY``, else ``OPENAI_API_KEY``.
        """
        base_url, api_key = env_base_url(), env_api_key()
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
        body = chat_body(messages, tools, options, stream=True, stream_options=self.stream_options)
        return self._stream(encode_body(body), cancel)

    def complete(
        self,
        messages: Sequence[MessageLike],
        tools: Optional[Sequence[ToolSpec]] = None,
        options: Optional[CompletionOptions] = None,
        cancel: Optional[threading.Event] = None,
    ) -> Response:
        """One non-streamed chat completion."""
        body = chat_body(messages, tools, options, stream=False, stream_options=False)
        payload = self._post_json("/chat/completions", encode_body(body), cancel)
        return response_from_json(payload, self._redact)

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
        payload = self._post_json("/embeddings", encode_body({"model": model, "input": texts}), cancel)
        return vectors_from_json(payload, len(texts))

    # -- request building ------------------------------------------------------

    def _request_headers(self, stream: bool) -> Dict[str, str]:
        return request_headers(stream, self._headers, self._api_key, self._api_key_header)

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
        if cancelled(cancel, tracker):
            raise LlmCancelledError(f"call to {url} was cancelled before it was sent")
        try:
            with tracking(tracker):
                resp = self._session.post(
                    url, data=data, headers=self._request_headers(stream), params=self._query or None,
                    stream=True, timeout=(self.connect_timeout, None),
                )
        except STREAM_ERRORS as exc:
            if cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled while waiting for the answer") from exc
            self._log.info("POST {} got no answer: {!r}", url, exc)
            raise LlmConnectionError(self._redact(
                connection_error_message(exc, url, self.base_url, self.connect_timeout))) from exc
        except UnicodeEncodeError as exc:
            # http.client encodes header values as latin-1; the only headers
            # not checked at construction are a user session's own.
            raise ConfigError(
                f"a request header for {url} cannot be sent: {exc}; HTTP header values must be "
                f"latin-1 text (check the headers of the requests.Session you passed)"
            ) from None
        try:
            if resp.status_code >= 400:
                raise self._http_error(resp, url, cancel, tracker, stream)
        except BaseException:
            resp.close()
            raise
        return resp

    def _http_error(self, resp: requests.Response, url: str, cancel: Optional[threading.Event],
                    tracker: RequestTracker, stream: bool) -> LlmError:
        try:
            raw = read_limited(resp, ERROR_BODY_LIMIT, truncate=True)
        except STREAM_ERRORS as exc:
            if cancelled(cancel, tracker):
                return LlmCancelledError(f"call to {url} was cancelled while reading an error answer")
            raw = f"<error body unreadable: {exc}>".encode()
        text = self._redact(raw.decode("utf-8", errors="replace"))
        error = http_error(resp.status_code, resp.reason or "", url, text, resp.headers, base_url=self.base_url,
                           sent_stream_options=stream and self.stream_options)
        self._log.debug("{}", error)
        return error

    def _post_json(self, path: str, data: bytes, cancel: Optional[threading.Event]) -> Any:
        url = self.base_url + path
        tracker = RequestTracker()
        stop_watch = on_cancel(cancel, tracker.abort)
        resp: Optional[requests.Response] = None
        try:
            resp = self._send(path, data, False, tracker, cancel)
            try:
                raw = read_limited(resp, JSON_BODY_LIMIT, truncate=False)
            except STREAM_ERRORS as exc:
                if cancelled(cancel, tracker):
                    raise LlmCancelledError(f"call to {url} was cancelled while reading the answer") from exc
                raise LlmConnectionError(
                    f"the answer from {url} broke off ({short_cause(exc)}); retry or fail over") from exc
            if cancelled(cancel, tracker):
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
            raise_in_band_error(payload, url, self._redact)
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
                    f"not 'text/event-stream': {self._redact(excerpt(resp))!r}; is base_url an "
                    f"OpenAI-compatible API root (ending in /v1)?"
                )
            parser = StreamParser(url, self._redact, self.max_event_bytes)
            completed = yield from parser.run(resp, cancel, tracker)
            if parser.saw_done:
                drain_after_done(resp, tracker)
        finally:
            release()
        # Released before the last chunk goes out: a caller that stops at the
        # completed chunk and never closes the iterator holds no connection.
        self._log.debug("stream from {} completed after {} events (finish={})",
                        url, parser.events, completed.finish_reason)
        yield completed
