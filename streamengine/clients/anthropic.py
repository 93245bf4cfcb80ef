"""The Anthropic Messages API client (``POST {base_url}/v1/messages``), streamed or not.

The same guarantees as :class:`OpenAICompatibleClient`, from the same
machinery: the socket is shut down on cancel even before the response
headers (``connection.py``), the body is read with ``read1`` through the
SSE framer (``_sse_read.py``), a stream is complete only at ``message_stop``
or a stop reason, and every HTTP, urllib3 or parse error leaves as a
streamengine error, chained.  HTTP errors are the same :class:`LlmHttpError`
(``retry-after`` parsed alike), so failover treats both providers alike;
an ``error`` event inside a 200 stream is classified as its HTTP status
would be (``anthropic_format.error_from_payload``).

The wire format lives in ``anthropic_format.py`` (requests, answers,
errors) and ``anthropic_stream.py`` (stream events -> chunks).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import requests

from .._sse_read import MAX_EVENT_BYTES
from ..cancel import on_cancel
from ..errors import ConfigError, LlmCancelledError, LlmConnectionError, LlmError, LlmHttpError, LlmProtocolError
from ..logs import component_logger
from ..messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec
from .anthropic_format import chat_body, error_details, error_from_payload, hint, response_from_json
from .anthropic_stream import AnthropicStreamParser
from .base import StreamingLlmClient
from .connection import RequestTracker, mount_cancellable, tracking
from .http_body import STREAM_ERRORS as _STREAM_ERRORS
from .http_body import cancelled as _cancelled
from .http_body import drain_after_done as _drain_after_done
from .http_body import excerpt as _excerpt
from .http_body import read_limited as _read_limited
from .openai import ERROR_BODY_LIMIT, JSON_BODY_LIMIT, parse_retry_after
from .openai_request import SENSITIVE_HEADER as _SENSITIVE_HEADER
from .openai_request import check_api_key as _check_api_key
from .openai_request import check_headers as _check_headers
from .openai_request import encode_body as _encode
from .openai_request import secret_forms as _secret_forms

__all__ = ["AnthropicClient"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
#: Sent as ``max_tokens`` when the call's options give none (the API requires one).
DEFAULT_MAX_TOKENS = 4096
_PATH = "/v1/messages"


def _anthropic_key(api_key: Optional[str]) -> Optional[str]:
    """The key, stripped; one that cannot be a header value is refused without being shown."""
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigError(f"api_key must be a string, got {type(api_key).__name__}")
    try:
        return _check_api_key(api_key)
    except ConfigError as exc:
        raise ConfigError(
            "api_key holds characters that cannot be sent in an HTTP header (control characters, spaces or "
            "non-latin-1 text); check how the key is read (ANTHROPIC_API_KEY) -- the key is not shown here "
            "on purpose") from exc


class AnthropicClient(StreamingLlmClient):
    """Claude through the Messages API, over one ``requests.Session``.

    ``base_url`` is the API root without ``/v1`` (``https://api.anthropic.com``,
    or a proxy's root); ``api_key`` defaults to ``ANTHROPIC_API_KEY`` and goes
    out as ``x-api-key``, never shown in errors or logs.  ``default_max_tokens``
    is sent when ``CompletionOptions.max_tokens`` is not set.  A ``session``
    you pass is used as is (a cancellable adapter is mounted for ``base_url``)
    and not closed by :meth:`close`.
    """

    #: An SSE event larger than this is refused (LlmProtocolError), bounding memory.
    max_event_bytes: int = MAX_EVENT_BYTES

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: Optional[str] = None,
        *,
        anthropic_version: str = DEFAULT_VERSION,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/]", base_url):
            raise ConfigError(f"base_url must be an http(s) URL such as {DEFAULT_BASE_URL!r}, got {base_url!r}")
        if not (isinstance(connect_timeout, (int, float)) and 0 < connect_timeout < math.inf):
            raise ConfigError(f"connect_timeout must be a positive number of seconds, got {connect_timeout!r}")
        if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int) or default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be a positive integer, got {default_max_tokens!r}")
        if not isinstance(anthropic_version, str) or not re.fullmatch(r"[0-9A-Za-z.-]+", anthropic_version):
            raise ConfigError(f"anthropic_version must look like {DEFAULT_VERSION!r}, got {anthropic_version!r}")
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):  # an OpenAI habit; the path below adds /v1 itself
            self.base_url = self.base_url[:-3]
        self._api_key = _anthropic_key(api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY"))
        self._headers = _check_headers(headers)
        self._secrets = _secret_forms(
            [self._api_key] + [v for k, v in self._headers.items() if _SENSITIVE_HEADER.search(k)])
        self.anthropic_version = anthropic_version
        self.default_max_tokens = default_max_tokens
        self.connect_timeout = float(connect_timeout)
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        mount_cancellable(self._session, ("http://", "https://") if self._owns_session else (self.base_url + "/",))
        self._log = component_logger("streamengine.clients.anthropic.AnthropicClient")

    def __repr__(self) -> str:
        key = "***" if self._api_key else None
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={key!r})"

    def close(self) -> None:
        """Close pooled connections (only if this client created the session)."""
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> "AnthropicClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- public calls ------------------------------------------------------------------

    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        """Yield chunks as they arrive; the last one has ``is_completed=True``.

        Arguments are checked now; the request is sent on the first ``next()``.
        """
        body = chat_body(messages, tools, options, self.default_max_tokens, stream=True)
        return self._stream(_encode(body), cancel)

    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None,
                 cancel: Optional[threading.Event] = None) -> Response:
        """One non-streamed message."""
        body = chat_body(messages, tools, options, self.default_max_tokens, stream=False)
        return response_from_json(self._post_json(_encode(body), cancel), self._redact)

    # -- transport ---------------------------------------------------------------------

    def _request_headers(self, stream: bool) -> Dict[str, str]:
        headers = {"Content-Type": "application/json", "anthropic-version": self.anthropic_version,
                   "Accept": "text/event-stream" if stream else "application/json"}
        if stream:
            headers["Accept-Encoding"] = "identity"  # a compressed event stream is buffered by some proxies
        headers.update(self._headers)
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _send(self, data: bytes, stream: bool, tracker: RequestTracker,
              cancel: Optional[threading.Event]) -> requests.Response:
        """POST and return the response with its body unread; the status is checked."""
        url = self.base_url + _PATH
        self._log.debug("POST {} stream={} ({} bytes)", url, stream, len(data))
        if _cancelled(cancel, tracker):
            raise LlmCancelledError(f"call to {url} was cancelled before it was sent")
        try:
            with tracking(tracker):
                resp = self._session.post(url, data=data, headers=self._request_headers(stream), stream=True,
                                          timeout=(self.connect_timeout, None))
        except _STREAM_ERRORS as exc:
            if _cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled while waiting for the answer") from exc
            raise LlmConnectionError(self._redact(
                f"could not get an answer from {url}: {type(exc).__name__}: {exc}; "
                f"check that the provider is reachable and base_url is right")) from exc
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"a request header for {url} cannot be sent: {exc}; HTTP header values must be latin-1 "
                f"text (check the headers of the requests.Session you passed)") from exc
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
        try:
            kind, message = error_details(json.loads(text))
        except ValueError:
            kind, message = None, None
        detail = (f"{kind}: " if kind else "") + (message or text[:300].strip() or "(empty body)")
        retry_after = parse_retry_after(resp.headers)
        when = f"; retry after {retry_after:g}s" if retry_after is not None else ""
        summary = (f"provider answered HTTP {resp.status_code} {resp.reason or ''}".rstrip()
                   + f" for {url}: {detail} ({hint(resp.status_code)}{when})")
        self._log.debug("HTTP {} from {}: {}", resp.status_code, url, detail)
        return LlmHttpError(resp.status_code, text, retry_after, message=summary)

    @contextlib.contextmanager
    def _response(self, data: bytes, stream: bool,
                  cancel: Optional[threading.Event]) -> Iterator[Tuple[RequestTracker, requests.Response]]:
        """Send the request; yield its tracker and response, both released when the block ends."""
        tracker = RequestTracker()
        stop_watch = on_cancel(cancel, tracker.abort)
        resp: Optional[requests.Response] = None
        try:
            resp = self._send(data, stream, tracker, cancel)
            yield tracker, resp
        finally:
            # Tracker first: a cancel arriving now must not reach a socket
            # that is being closed (its descriptor number may be reused).
            stop_watch()
            tracker.release()
            if resp is not None:
                resp.close()

    def _post_json(self, data: bytes, cancel: Optional[threading.Event]) -> Any:
        url = self.base_url + _PATH
        with self._response(data, False, cancel) as (tracker, resp):
            try:
                raw = _read_limited(resp, JSON_BODY_LIMIT, truncate=False)
            except _STREAM_ERRORS as exc:
                if _cancelled(cancel, tracker):
                    raise LlmCancelledError(f"call to {url} was cancelled while reading the answer") from exc
                raise LlmConnectionError(
                    f"the answer from {url} broke off: {type(exc).__name__}: {exc}; retry or fail over") from exc
            if _cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled")
            try:
                payload = json.loads(raw.decode("utf-8", errors="replace"))
            except ValueError as exc:
                raise LlmProtocolError(
                    f"{url} answered HTTP {resp.status_code} with a body that is not JSON (content type "
                    f"{resp.headers.get('Content-Type')!r}): {self._redact(raw[:200].decode('utf-8', 'replace'))!r}; "
                    f"is base_url the Anthropic API root (https://api.anthropic.com)?") from exc
        if isinstance(payload, dict) and payload.get("type") == "error":
            raise error_from_payload(payload, f"{url} answered with an error", self._redact)
        return payload

    def _stream(self, data: bytes, cancel: Optional[threading.Event]) -> Iterator[Chunk]:
        url = self.base_url + _PATH
        with self._response(data, True, cancel) as (tracker, resp):
            content_type = resp.headers.get("Content-Type", "")
            if not content_type.lower().startswith("text/event-stream"):
                raise LlmProtocolError(
                    f"{url} answered a streaming request with content type {content_type!r}, not "
                    f"'text/event-stream': {self._redact(_excerpt(resp))!r}; is base_url the Anthropic "
                    f"API root (https://api.anthropic.com)?")
            parser = AnthropicStreamParser(url, self._redact, self.max_event_bytes)
            completed = yield from parser.run(resp, cancel, tracker)
            if parser.saw_stop:
                _drain_after_done(resp, tracker)
        # Released before the last chunk goes out: a caller that stops at the
        # completed chunk and never closes the iterator holds no connection.
        self._log.debug("stream from {} completed after {} events (finish={})",
                        url, parser.events, completed.finish_reason)
        yield completed
