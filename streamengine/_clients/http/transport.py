"""The HTTP transport every provider client shares; a provider adds only its wire format.

Also what the environment says about a request (proxies, CA bundle,
``~/.netrc``, read once per URL) and the loop of wires whose SSE events are
JSON objects named by their ``type`` (Anthropic, OpenAI Responses).

What the environment says about a request (proxies, CA bundle, ``~/.netrc``), read once per URL.

With ``trust_env`` on (its default), requests reads the environment again on
every request: it decodes every environment variable twice to find the
proxies and ``NO_PROXY``, looks for ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
and reads ``~/.netrc``.  On a served stream of 60 tokens that is the largest
part of a request's fixed cost (``bench/README.md``, section 14).  httpx and
the openai SDK read the environment once, when the client is made.

A client that made its own session does the same, per URL: its session gets
``trust_env = False``, and the settings requests would have found are read at
the first request to a URL, kept, and passed with every request to it — the
same proxies, ``verify`` and netrc credentials requests itself would use.
To follow a change of the environment, make a new client.  A session you
pass is left alone: it reads the environment as requests always does.

The HTTP transport every provider client shares; a provider adds only its wire format.

This is the one boundary where HTTP, urllib3 and framing errors become
streamengine errors (``raise ... from exc``), so nothing above it needs to
know which library spoke to the provider.  What it guarantees, for every
provider alike:

* cancelling shuts the socket down (``connection.py``), even before the
  response headers: closing a response from another thread does not unblock
  a read;
* the only timeout here is the connect timeout (and a 50 ms budget to read
  the few bytes after the end of a stream, so a chunked connection can be
  reused).  Idle and total timeouts live in the call strategies, where only
  meaningful chunks count: a socket timeout would be reset by keep-alives;
* an error body, a JSON answer and an SSE event are read with bounds;
* no message or log line shows a credential: the key, the base_url's userinfo, credential-like
  header and query values, or any URL's userinfo and query values (``_logs.Redactor``).

A provider writes a :class:`Wire` (request body and headers, answer parsing,
error wording) and an :class:`SseStreamParser` (events -> chunks); its client
is an :class:`HttpProviderClient` holding that wire.

The loop of a wire whose SSE events are JSON objects named by their ``type`` (Anthropic, OpenAI Responses).

One home for what those wires share: each event is parsed as a JSON object
(anything else is a protocol error naming the wire; a plain-text ``error``
event keeps its text), handed to the wire's :meth:`TypedEventParser.chunk_of`,
and the stream is complete when the wire sets :attr:`ended`.  The
Chat Completions wire keeps its own loop: it is the hot path and has no
``type`` field.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import json
import re
import threading
import time
from functools import cached_property
from typing import Any, Dict, Generator, Iterator, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

import requests
import requests.utils

from ..._cancel import cancel_flag, on_cancel
from ..._errors import (
    ConfigError,
    LlmCancelledError,
    LlmConnectionError,
    LlmError,
    LlmProtocolError,
    LlmStreamError,
    PartNotCarriedError,
)
from ..._logs import Redactor, component_logger, redact_urls
from ..._messages import Chunk, CompletionOptions, Message, MessageLike, Response, ToolSpec, Usage, as_messages
from ..._parts import Part
from ..._validation import seconds
from ..._wait import Wait, chunks_only
from ..base import StreamingLlmClient
from .body import (
    ALWAYS,
    STREAM_ERRORS,
    SocketBody,
    cancelled,
    drain_after_done,
    excerpt,
    read_limited,
    seconds_left,
    timed_reads,
)
from .connection import RequestTracker, mount_cancellable, tracking
from .errors import redact_exception, short_cause
from .options import check_api_key, check_headers, credentials_in, parse_base_url, split_extras
from .sse_read import MAX_EVENT_BYTES, WAIT, SseEventTooLarge, SseFramer, iter_event_batches

_Client = TypeVar("_Client", bound="HttpProviderClient")

#: A client talks to a handful of URLs (its endpoints); past this many, the oldest are forgotten.
MAX_URLS = 64
#: Pages of a model list read at most (Anthropic's pages hold up to 1000 models).
MAX_MODEL_PAGES = 20


class EnvironmentSettings:
    """The keyword arguments of ``Session.request`` that requests would take from the environment, per URL."""

    def __init__(self) -> None:
        self._by_url: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._probe = requests.Session()  # trust_env on: the one requests reads the environment with
        self._probe.close()  # never sends; nothing to pool

    def for_url(self, url: str) -> Dict[str, Any]:
        """``proxies``, ``verify`` and (from ``~/.netrc``) ``auth`` for a request to ``url``."""
        settings = self._by_url.get(url)
        if settings is None:
            settings = self._read(url)
            with self._lock:
                if len(self._by_url) >= MAX_URLS:
                    self._by_url.pop(next(iter(self._by_url)))
                self._by_url[url] = settings
        return settings

    def _read(self, url: str) -> Dict[str, Any]:
        merged = self._probe.merge_environment_settings(url, {}, None, None, None)
        settings: Dict[str, Any] = {"proxies": merged["proxies"], "verify": merged["verify"]}
        auth: Optional[Any] = requests.utils.get_netrc_auth(url)
        if auth:
            settings["auth"] = auth
        return settings


def read_once(session: requests.Session) -> EnvironmentSettings:
    """For a session the client made: requests stops reading the environment; ask the result instead."""
    session.trust_env = False
    return EnvironmentSettings()


ERROR_BODY_LIMIT = 64 * 1024  # read this much of an error body; LlmHttpError keeps 1 KB
JSON_BODY_LIMIT = 64 * 1024 * 1024


def encode_body(body: Dict[str, Any]) -> bytes:
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


def content_headers(stream: bool) -> Dict[str, str]:
    """JSON out; an event stream or JSON back.  A compressed event stream is buffered by some proxies."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    if stream:
        headers["Accept-Encoding"] = "identity"
    return headers


class SseStreamParser:
    """The SSE events of one streamed response -> chunks; a provider writes :meth:`run`.

    ``run`` reads the events inside :meth:`reading` (the body through the SSE
    framer; what breaks becomes a streamengine error), returns the
    completing chunk when the stream's end marker arrives (setting
    :attr:`ended`), and otherwise ends with :meth:`unfinished`.  The loop
    itself is the provider's: it is the hot path, where one more generator
    or call per event would show.
    """

    #: How the end of a complete stream is named in the error for an incomplete one.
    end_marker = "an end marker"

    def __init__(self, url: str, redact: Any, max_event_bytes: int) -> None:
        self.url = url
        self.redact = redact
        self.max_event_bytes = max_event_bytes
        self.events = 0
        self.ended = False  # the end marker arrived: the rest of the body can be drained
        self.finish_reason: Optional[str] = None
        self.usage: Optional[Usage] = None
        self.model: Optional[str] = None
        self.response_id: Optional[str] = None  # the provider's id for the answer, where its wire gives one
        #: Set by the transport before :meth:`run`: the body read from its socket, or None (urllib3 reads it).
        self.body: Optional[SocketBody] = None
        self._framer = SseFramer(max_event_bytes, 8 * max_event_bytes)

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Union[Chunk, Wait], None, Chunk]:
        """Yield the chunks of the stream (and the body's waits); return the completed chunk (not yielded)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def reading(self, resp: requests.Response, cancel: Optional[threading.Event],
                tracker: RequestTracker) -> Iterator[Tuple[Iterator[Tuple[str, Any]], Any]]:
        """``(event name, data)`` pairs as they arrive, and the cancel flag for the loop over them.

        A broken body leaves as a streamengine error.  The tracker is only
        ever aborted by ``cancel`` (on_cancel), so inside the loop the
        event's flag alone says "cancelled": ``flag.cancelled`` (``_cancel.cancel_flag``),
        an attribute read where ``Event.is_set`` is a Python call per event.
        """
        batches = (self.body.event_batches(self._framer) if self.body is not None  # framed in its own read loop
                   else iter_event_batches(timed_reads(resp, tracker), self._framer))
        try:
            # One list of events per read, flattened in C.
            yield itertools.chain.from_iterable(batches), cancel_flag(cancel)
        except SseEventTooLarge as exc:
            raise LlmProtocolError(f"{self.url}: {exc}") from exc
        except STREAM_ERRORS as exc:
            if cancelled(cancel, tracker):
                raise LlmCancelledError(f"stream from {self.url} was cancelled") from exc
            raise LlmStreamError(self.redact(
                f"stream from {self.url} broke after {self.events} events: the provider dropped the connection "
                f"mid-answer ({short_cause(exc)}); retry or fail over"
            )) from exc

    def unfinished(self, cancel: Optional[threading.Event], tracker: RequestTracker) -> Chunk:
        """The events stopped before the end marker: cancelled, complete (a finish reason came) or broken.

        A close-delimited body cut mid-stream looks like a clean end, so
        without a finish reason the answer is incomplete.
        """
        if cancelled(cancel, tracker):
            raise LlmCancelledError(f"stream from {self.url} was cancelled")
        if self.finish_reason is not None:
            return self.completed()
        dropped = self._framer.dropped_bytes
        cut = f" ({dropped} bytes of an unfinished event were dropped)" if dropped else ""
        raise LlmStreamError(
            f"stream from {self.url} ended without {self.end_marker} after "
            f"{self.events} events{cut}; the answer is incomplete, retry or fail over"
        )

    def completed(self) -> Chunk:
        return Chunk(is_completed=True, finish_reason=self.finish_reason, usage=self.usage, model=self.model,
                     response_id=self.response_id)


class Wire:
    """What one provider's API adds to the shared :class:`HttpProviderClient`: paths, bodies, headers, answers, errors.

    A client is an :class:`HttpProviderClient` holding one wire: the client
    owns the HTTP (session, credentials, cancel, bounded reads), the wire
    only says how this API spells a request and its answer.  The wire's
    methods are given what they need from the client; they keep no state of
    a call.
    """

    #: The path of the chat endpoint below the API root.
    chat_path = ""
    #: The path that lists the models (``GET``), below the API root.
    models_path = "/models"
    #: Shown in the error for a bad ``base_url``.
    example_base_url = ""
    #: The question that ends an error for an answer of the wrong kind (HTML, a proxy's login page).
    api_root_hint = ""
    #: Where the key comes from, for the error about a key that cannot be sent.
    key_source = ""
    #: The logger's component name.
    log_name = "streamengine._clients"
    #: Turns the events of a streamed answer into chunks.
    parser_class: Type[SseStreamParser] = SseStreamParser
    #: How errors name this API ("the Anthropic Messages API").
    name = "this API"

    def cannot_carry(self, part: Part) -> Optional[str]:
        """Why this API cannot take ``part`` (an image, audio, a file) and what to do instead; None if it can."""
        return None

    def api_root(self, base_url: str) -> str:
        """``base_url`` as the API root the paths are appended to."""
        return base_url

    def chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                  options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        raise NotImplementedError

    def request_headers(self, stream: bool, headers: Mapping[str, str], api_key: Optional[str]) -> Dict[str, str]:
        """Every header of a request: content negotiation, the caller's ``headers``, the key."""
        raise NotImplementedError

    def response_of(self, payload: Any, url: str, redact: Redactor) -> Response:
        """A non-streamed answer from ``url``, parsed."""
        raise NotImplementedError

    def status_error(self, resp: requests.Response, url: str, text: str, stream: bool, base_url: str) -> LlmError:
        """The error for an HTTP error status; ``text`` is the (redacted) start of the body."""
        raise NotImplementedError

    def no_answer(self, exc: BaseException, url: str, base_url: str, connect_timeout: float) -> str:
        """The message for a request that got no answer at all (refused, unreachable, reset)."""
        return (f"could not get an answer from {url}: {type(exc).__name__}: {exc}; "
                f"check that the provider is reachable and base_url is right")

    def raise_in_band_error(self, payload: Any, url: str, redact: Redactor) -> None:
        """Raise if a 200 JSON answer is an error after all."""

    def models_query(self, after: Optional[str]) -> Dict[str, str]:
        """The query of one page of the model list (``after``: the last id of the page before)."""
        return {}

    def model_page(self, payload: Any, url: str) -> Tuple[List[str], Optional[str]]:
        """The model ids of one page of ``GET models`` and the id to continue after (None: last page).

        OpenAI and the servers that copy it, and Anthropic, all answer
        ``{"data": [{"id": …}, …]}``; Anthropic pages with ``has_more``.
        """
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise LlmProtocolError(f"{url} answered without a list of models ({{'data': [{{'id': ...}}]}}); "
                                   f"{self.api_root_hint}")
        ids = [m["id"] for m in data]
        more = isinstance(payload, dict) and payload.get("has_more") is True and bool(ids)
        return ids, ids[-1] if more else None


def refuse_uncarried(wire: Wire, messages: Sequence[Message], model: Optional[str]) -> None:
    """Raise :class:`PartNotCarriedError` for the first part of ``messages`` that ``wire`` cannot carry, before any
    request."""
    for i, message in enumerate(messages):
        for part in message.parts:
            why = wire.cannot_carry(part)
            if why is not None:
                to = f" to model {model!r}" if model else ""
                raise PartNotCarriedError(f"the {part.describe()} in messages[{i}] cannot be sent{to} over "
                                          f"{wire.name}: {why}")


class HttpProviderClient(StreamingLlmClient):
    """Chat over one ``requests.Session`` in the format of its :class:`Wire`: every provider client is one.

    A ``session`` you pass is used as is, except that a cancellable adapter is
    mounted for ``base_url`` (needed to abort a request before its headers);
    it is not closed by :meth:`close`.  A query string in ``base_url`` is sent
    with every request (with ``query`` added), and its ``user:password@`` as
    Basic auth.  ``max_retries`` (the SDKs' name) is the engine's retries of
    a rate-limited call, None to leave them to ``EngineConfig``.

    The options' ``extra_headers`` and ``extra_query`` go with one call:
    it runs on a shallow copy of the client (same session and pool) whose
    headers, query and secrets include them, so nothing of one call leaks
    into the next (``extra_body`` is merged into the body by the options).
    """

    #: An SSE event larger than this is refused (LlmProtocolError), bounding memory.
    max_event_bytes: int = MAX_EVENT_BYTES

    def __init__(self, wire: Wire, base_url: str, api_key: Optional[str], *, session: Optional[requests.Session],
                 headers: Optional[Mapping[str, str]], connect_timeout: float,
                 query: Optional[Mapping[str, str]] = None, max_retries: Optional[int] = None) -> None:
        if not isinstance(base_url, str) or not re.match(r"^https?://[^/]", base_url):
            raise ConfigError(f"base_url must be an http(s) URL such as {wire.example_base_url!r}, "
                              f"got {redact_urls(repr(base_url))}")
        self.wire = wire
        self.connect_timeout = seconds(connect_timeout, "connect_timeout")
        self.max_retries = max_retries
        root, self._auth, self._query = parse_base_url(base_url)  # userinfo: Basic auth, never shown
        self._query.update(query or {})
        self.base_url = wire.api_root(root.rstrip("/"))
        self._api_key = check_api_key(api_key, wire.key_source)
        self._headers = check_headers(headers)
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        mount_cancellable(self._session, ("http://", "https://") if self._owns_session else (self.base_url + "/",))
        self._environment = read_once(self._session) if self._owns_session else None
        self._log = component_logger(wire.log_name)

    def __repr__(self) -> str:
        key = "***" if self._api_key else None
        return f"{type(self).__name__}(base_url={self.base_url!r}, api_key={key!r})"

    def close(self) -> None:
        """Close pooled connections (only if this client created the session)."""
        if self._owns_session:
            self._session.close()

    def __enter__(self: _Client) -> _Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        """Yield chunks as they arrive; the last one has ``is_completed=True``.

        Arguments are checked now; the request is sent on the first ``next()``.
        """
        return chunks_only(self.open_stream(messages, tools, options, cancel))

    def open_stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None,
                    cancel: Optional[threading.Event] = None) -> Iterator[Union[Chunk, Wait]]:
        """Chunks, and a :class:`Wait` on the socket wherever the body would block (``_clients.base``)."""
        client, options = self._for_call(options)
        messages = self._carried(messages, options)
        return client._stream(encode_body(self.wire.chat_body(messages, tools, options, stream=True)), cancel)

    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None,
                 cancel: Optional[threading.Event] = None) -> Response:
        """One answer, not streamed."""
        client, options = self._for_call(options)
        body = encode_body(self.wire.chat_body(self._carried(messages, options), tools, options, stream=False))
        path = self.wire.chat_path
        return self.wire.response_of(client._json(path, body, cancel), self.base_url + path, client._redact)

    def check_parts(self, messages: Sequence[MessageLike], model: Optional[str] = None) -> None:
        """Raise :class:`ConfigError` if a part of ``messages`` (an image, audio, a file) has no form on this wire."""
        refuse_uncarried(self.wire, as_messages(messages), model)

    def _carried(self, messages: Sequence[MessageLike], options: Optional[CompletionOptions]) -> List[Message]:
        """``messages`` as records, every part checked against the wire."""
        checked = as_messages(messages)
        refuse_uncarried(self.wire, checked, options.model if options is not None else None)
        return checked

    def list_models(self, cancel: Optional[threading.Event] = None, *, timeout: float = 30.0) -> List[str]:
        """The ids of the models the server offers (``GET /models``; Anthropic's ``/v1/models``, every page).

        ``timeout`` bounds each wait for the server (headers, then each read).
        At most ``MAX_MODEL_PAGES`` pages are read: a server that says there
        is always more cannot keep the caller forever.
        """
        timeout = seconds(timeout, "timeout")
        ids: List[str] = []
        after: Optional[str] = None
        for _ in range(MAX_MODEL_PAGES):
            client = self._view({}, self.wire.models_query(after))
            payload = client._json(self.wire.models_path, None, cancel, timeout)
            page, after = self.wire.model_page(payload, self.base_url + self.wire.models_path)
            ids.extend(page)
            if after is None:
                break
        return ids

    def _for_call(self, options: Optional[CompletionOptions]) -> Tuple[HttpProviderClient, Optional[CompletionOptions]]:
        """This client, or a copy of it carrying the options' ``extra_headers`` and ``extra_query``."""
        options, headers, query = split_extras(options)
        return self._view(headers, query), options

    def _view(self, headers: Mapping[str, str], query: Mapping[str, str]) -> HttpProviderClient:
        """This client, or a copy of it (same session and pool) that also sends ``headers`` and ``query``."""
        if not headers and not query:
            return self
        view = copy.copy(self)
        view._headers = {**self._headers, **headers}
        view._query = {**self._query, **query}
        view.__dict__["_redact"] = self._redact.with_secrets(credentials_in(None, headers, query))
        view._owns_session = False  # closing the view must never close the shared session
        return view

    # -- the transport -----------------------------------------------------------------

    @cached_property
    def _redact(self) -> Redactor:
        """Hides the client's credentials and every URL's userinfo and query values (made at first use:
        a provider's constructor may still add headers and query parameters)."""
        return Redactor([self._api_key, *credentials_in(self._auth, self._headers, self._query)])

    def _send(self, path: str, data: Optional[bytes], stream: bool, tracker: RequestTracker,
              cancel: Optional[threading.Event], read_timeout: Optional[float] = None) -> requests.Response:
        """POST ``data`` (GET when None) and return the response with its body unread; the status is checked."""
        url = self.base_url + path
        method = "GET" if data is None else "POST"
        self._log.debug("{} {} stream={} ({} bytes)", method, url, stream, len(data or b""))
        if cancelled(cancel, tracker):
            raise LlmCancelledError(f"call to {url} was cancelled before it was sent")
        environment = self._environment.for_url(url) if self._environment is not None else {}
        if self._auth is not None:  # the base_url's userinfo, as requests would send it (and before ~/.netrc)
            environment = {**environment, "auth": self._auth}
        try:
            with tracking(tracker):
                resp = self._session.request(
                    method, url, data=data, headers=self.wire.request_headers(stream, self._headers, self._api_key),
                    params=self._query or None,
                    stream=True, timeout=(self.connect_timeout, read_timeout), **environment,
                )
        except STREAM_ERRORS as exc:
            redact_exception(exc, self._redact)  # chained below: a printed traceback shows its words
            if cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled while waiting for the answer") from exc
            self._log.info("{} {} got no answer: {!r}", method, url, exc)
            if read_timeout is not None and isinstance(exc, requests.exceptions.ReadTimeout):
                raise LlmConnectionError(f"{url} sent no response headers within {read_timeout:.3g}s "
                                         f"(what was left of the call's deadlines)") from exc
            raise LlmConnectionError(self._redact(
                self.wire.no_answer(exc, url, self.base_url, self.connect_timeout))) from exc
        except UnicodeEncodeError as exc:
            # http.client encodes header values as latin-1; the only headers
            # not checked at construction are a user session's own.
            raise ConfigError(
                f"a request header for {url} cannot be sent: {exc}; HTTP header values must be "
                f"latin-1 text (check the headers of the requests.Session you passed)"
            ) from exc
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
        error = self.wire.status_error(resp, url, self._redact(raw.decode("utf-8", errors="replace")), stream,
                                       self.base_url)
        self._log.debug("{}", error)
        return error

    @contextlib.contextmanager
    def _response(self, path: str, data: Optional[bytes], stream: bool, cancel: Optional[threading.Event],
                  read_timeout: Optional[float] = None) -> Iterator[Tuple[RequestTracker, requests.Response]]:
        """Send the request; yield its tracker and response, both released when the block ends.

        ``read_timeout`` bounds the wait for the headers (and an error body):
        the one wait a streamed call spends in a blocking read.
        """
        tracker = RequestTracker()
        if read_timeout is not None:
            tracker.deadline = time.monotonic() + read_timeout
        stop_watch = on_cancel(cancel, tracker.abort)
        resp: Optional[requests.Response] = None
        try:
            resp = self._send(path, data, stream, tracker, cancel, read_timeout)
            yield tracker, resp
        finally:
            # Tracker first: a cancel arriving now must not reach a socket
            # that is being closed (its descriptor number may be reused).
            stop_watch()
            tracker.release()
            if resp is not None:
                resp.close()

    def _json(self, path: str, data: Optional[bytes], cancel: Optional[threading.Event],
              read_timeout: Optional[float] = None) -> Any:
        """The JSON answer to a POST of ``data`` (GET when None), read within ``JSON_BODY_LIMIT``."""
        url = self.base_url + path
        with self._response(path, data, False, cancel, read_timeout) as (tracker, resp):
            try:
                raw = read_limited(resp, JSON_BODY_LIMIT, truncate=False)
            except STREAM_ERRORS as exc:
                if cancelled(cancel, tracker):
                    raise LlmCancelledError(f"call to {url} was cancelled while reading the answer") from exc
                raise LlmConnectionError(self._redact(
                    f"the answer from {url} broke off ({short_cause(exc)}); retry or fail over")) from exc
            if cancelled(cancel, tracker):
                raise LlmCancelledError(f"call to {url} was cancelled")
            try:
                payload = json.loads(raw.decode("utf-8", errors="replace"))
            except ValueError as exc:
                raise LlmProtocolError(
                    f"{url} answered HTTP {resp.status_code} with a body that is not JSON "
                    f"(content type {resp.headers.get('Content-Type')!r}): "
                    f"{self._redact(raw[:200].decode('utf-8', errors='replace'))!r}; {self.wire.api_root_hint}"
                ) from exc
        self.wire.raise_in_band_error(payload, url, self._redact)
        return payload

    def _stream(self, data: bytes, cancel: Optional[threading.Event]) -> Iterator[Union[Chunk, Wait]]:
        path = self.wire.chat_path
        url = self.base_url + path
        # Passed up first, so the strategy fills in its deadlines: they bound the wait for the headers.
        first = Wait(None, ready=ALWAYS)
        yield first
        with self._response(path, data, True, cancel, seconds_left(first)) as (tracker, resp):
            content_type = resp.headers.get("Content-Type", "")
            if not content_type.lower().startswith("text/event-stream"):
                raise LlmProtocolError(
                    f"{url} answered a streaming request with content type {content_type!r}, "
                    f"not 'text/event-stream': {self._redact(excerpt(resp))!r}; {self.wire.api_root_hint}"
                )
            parser = self.wire.parser_class(url, self._redact, self.max_event_bytes)
            body = parser.body = SocketBody.of(resp)
            try:
                completed = yield from parser.run(resp, cancel, tracker)
                if parser.ended:
                    if body is not None:
                        body.finish(tracker)
                    else:
                        drain_after_done(resp, tracker)
            finally:
                if body is not None:
                    body.close()
        # Released before the last chunk goes out: a caller that stops at the
        # completed chunk and never closes the iterator holds no connection.
        self._log.debug("stream from {} completed after {} events (finish={})",
                        url, parser.events, completed.finish_reason)
        yield completed


class TypedEventParser(SseStreamParser):
    """SSE events that are JSON objects -> chunks; a wire writes :meth:`chunk_of` and :meth:`plain_error`."""

    #: How the wire is named in the error for an event it cannot read.
    wire_name = "the"

    def run(self, resp: requests.Response, cancel: Optional[threading.Event],
            tracker: RequestTracker) -> Generator[Union[Chunk, Wait], None, Chunk]:
        with self.reading(resp, cancel, tracker) as (events, flag):
            for name, data in events:
                if name is WAIT:  # the body would block: the run waits for it, with everything else
                    yield data
                    continue
                if flag.cancelled:
                    break
                self.events += 1
                chunk = self.chunk_of(name, self._frame(name, data))
                if chunk is not None:
                    yield chunk
                if self.ended:
                    return self.completed()
        return self.unfinished(cancel, tracker)

    def chunk_of(self, name: str, frame: Dict[str, Any]) -> Optional[Chunk]:
        """The chunk for one event (None: nothing meaningful); raise for an error, set ``ended`` at the end."""
        raise NotImplementedError

    def plain_error(self, text: str) -> Dict[str, Any]:
        """The frame for an ``error`` event whose data is plain text, in the wire's own error shape."""
        raise NotImplementedError

    def _frame(self, name: str, data: str) -> Dict[str, Any]:
        try:
            frame = json.loads(data)
        except ValueError as exc:
            if name == "error":  # a plain-text error event still says what went wrong
                return self.plain_error(data)
            raise LlmProtocolError(
                f"{self.url} sent a stream event that is not JSON ({exc}): {self.redact(data[:200])!r}; "
                f"the provider does not speak {self.wire_name} stream format") from exc
        if not isinstance(frame, dict):
            raise LlmProtocolError(
                f"{self.url} sent a stream event that is not a JSON object: {self.redact(data[:200])!r}; "
                f"the provider does not speak {self.wire_name} stream format")
        return frame
