"""The web trust boundary: who may start a run, from where, with which messages, and the refusals.

HTTP plumbing shared by the web modules: the refusal exception and JSON responses.

Which browsers' requests may start a run: the cross-site checks and CORS.

Browsers say where a request comes from (``Sec-Fetch-Site``), what it is
for (``Sec-Fetch-Mode``, ``Sec-Fetch-Dest``) and whether a person's click or
typing made it (``Sec-Fetch-User: ?1``); clients that are not browsers
(curl, a backend) send none of these and are not affected by them.

* **POST**: another site may start a run only when ``allow_origin`` admits
  its origin (a JSON POST needs a CORS preflight, so the browser asks first).
* **GET** needs no preflight, so ``<img src=".../v1/chat/stream?q=...">`` on
  any page, or a link clicked in a mail or chat app (``Sec-Fetch-Site:
  none``, ``Sec-Fetch-Mode: navigate``), would start a run: whatever
  ``allow_origin`` says, a browser's GET run must be same-origin and made by
  the page's script (``Sec-Fetch-Dest: empty``, not a navigation).  It must
  also ask for ``Accept: text/event-stream`` (what EventSource sends): a
  browser too old to send ``Sec-Fetch-*`` says nothing else, and a link or a
  tag never asks for that type.
* **Autorun** (``/?autorun=PROMPT``) asks on load only for a same-origin
  request that no click made: a link the model wrote into an answer is
  same-origin too, and clicking it must not run what it says.  Any other
  only fills the prompt box, and a person presses Send.

Which messages a request may bring: the trust boundary between a browser and the provider.

A request body is written by whoever can reach the endpoint.  Forwarding it
as is would let that person speak as ``system`` or ``developer``, forge an
assistant's ``tool_calls`` and the ``tool`` results that answer them, and put
their own instructions ahead of the application's.  So by default a request
may carry only ``user`` and ``assistant`` messages with plain text, the last
one the user's; the system prompt is the application's, set on the server.
Trusted callers (a backend of your own) can widen that with ``trusted=True``.

:func:`messages_from_request` is public so a Flask or Django view builds its
messages with exactly the rules this package's own endpoint uses.

Who may start a run, from where, and how many at once.

Every check here runs before a stream starts, so a refusal is an ordinary
JSON response and costs no provider call:

* **Host** (DNS rebinding): a page on ``evil.example`` whose name is made to
  resolve to ``127.0.0.1`` talks to this server as "same origin"; only the
  ``Host`` header still says ``evil.example``.  So the Host must be one the
  app was told about (by default the loopback names and the server's own).
* **authorize(environ)**: the application's hook (session cookie, API key,
  ...).  Falsy -> 401; raising :class:`PermissionError` -> 403 with its text.
* **Stream limits**: each open stream holds a server thread for its whole
  length.  A global cap below the server's thread count keeps threads free
  for ``/healthz`` and the page; a per-client cap keeps one client from
  taking all of them.  Over either cap -> 429 with ``Retry-After``.
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Protocol, Sequence, Tuple, Union

from .. import _validation as validation
from .._errors import ConfigError, PartNotCarriedError, StreamEngineError
from .._messages import Message, as_message, message_content
from .._validation import json_type
from ._parts import PartsPolicy, checked_policy

#: A WSGI environ (PEP 3333).
Environ = Dict[str, Any]

StartResponse = Callable[..., Any]
Headers = List[Tuple[str, str]]

JSON_TYPE = "application/json; charset=utf-8"
_REASONS = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 409: "Conflict", 415: "Unsupported Media Type",
            422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


def engine_refusal(exc: ConfigError) -> HttpError:
    """The engine refusing a run at its start: the request's own content (a part the model's API cannot take,
    422) or the engine's state (closed, misconfigured: 503)."""
    if isinstance(exc, PartNotCarriedError):
        return HttpError(f"{exc}; send it as text or as a kind of part this model takes", 422)
    return HttpError(f"the engine cannot take requests: {exc}", 503)


def status_line(status: int) -> str:
    return f"{status} {_REASONS[status]}"


class HttpError(StreamEngineError):
    """A request refused before streaming; ``str()`` is the JSON ``error`` sent back.

    ``field`` names the part of the request that was wrong (``"messages[2].role"``,
    ``"Host"``), so a client can point at it without parsing the sentence.
    """

    def __init__(self, message: str, status: int = 400, headers: Sequence[Tuple[str, str]] = (),
                 field: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)
        self.field = field

    def payload(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"error": str(self)}
        if self.field:
            body["field"] = self.field
        return body


def json_response(status: int, payload: Dict[str, Any],
                  headers: Sequence[Tuple[str, str]] = ()) -> Tuple[str, Headers, List[bytes]]:
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    return status_line(status), [("Content-Type", JSON_TYPE), ("Content-Length", str(len(body)))] + list(headers), \
        [body]


Origins = Union[None, str, FrozenSet[str]]
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+$")
_OPEN_THE_PAGE = "open the page at / and ask there"


def may_autorun(environ: Environ) -> bool:
    """The browser says this site's own script opened the page, not a click on a link (model-written ones too)."""
    return environ.get("HTTP_SEC_FETCH_SITE") == "same-origin" and not _clicked(environ)


def _clicked(environ: Environ) -> bool:
    """A person's click or typed address made the request (``Sec-Fetch-User: ?1``), never a script."""
    return environ.get("HTTP_SEC_FETCH_USER") == "?1"


class CrossSite:
    """``allow_origin`` checked once; the cross-site refusals and the CORS headers follow from it."""

    def __init__(self, allow_origin: Union[str, Iterable[str], None]) -> None:
        self.origins: Origins = _check_origins(allow_origin)

    @property
    def cors(self) -> bool:
        return self.origins is not None

    def refuse_post(self, environ: Environ) -> None:
        """Another site may POST a run only if ``allow_origin`` lets its origin in (a run costs money, calls tools)."""
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site not in ("cross-site", "same-site"):
            return
        origin = environ.get("HTTP_ORIGIN", "")
        if origin and self.origin_allowed(origin):
            return
        source = f" from {origin}" if origin else ""
        raise HttpError(f"refused a {site} request{source}: another site may not start runs here; to allow "
                        "one, pass its origin as make_wsgi_app(engine, allow_origin=[...])", 403, field="Origin")

    @staticmethod
    def refuse_get(environ: Environ) -> None:
        """A GET run comes from this site's own script (fetch/EventSource), never from a link or a tag."""
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site == "none":
            raise HttpError("refused a GET run from outside this site's page (a link opened from another "
                            f"application, a bookmark or a typed address); {_OPEN_THE_PAGE}",
                            403, field="Sec-Fetch-Site")
        if site and site != "same-origin":
            raise HttpError(f"refused a {site} GET run: other sites may start runs only with a POST that "
                            "allow_origin admits", 403, field="Sec-Fetch-Site")
        dest = environ.get("HTTP_SEC_FETCH_DEST", "")
        if dest and dest != "empty":
            raise HttpError(f"refused a GET run loaded as {dest!r}: runs start from the page's fetch() or "
                            f"EventSource; {_OPEN_THE_PAGE}", 403, field="Sec-Fetch-Dest")
        if environ.get("HTTP_SEC_FETCH_MODE", "") == "navigate":
            raise HttpError("refused a GET run opened as a page: runs start from the page's fetch() or "
                            f"EventSource; {_OPEN_THE_PAGE}", 403, field="Sec-Fetch-Mode")
        if _clicked(environ):
            raise HttpError("refused a GET run made by a click: runs start from the page's fetch() or "
                            f"EventSource; {_OPEN_THE_PAGE}", 403, field="Sec-Fetch-User")
        if not _asks_for_event_stream(environ):
            raise HttpError("refused a GET run without Accept: text/event-stream (a link, a tag or an old "
                            f"browser's navigation asks for other types); {_OPEN_THE_PAGE}, or send "
                            "Accept: text/event-stream from a client of your own (EventSource does)",
                            403, field="Accept")

    @staticmethod
    def refuse_other_sites(environ: Environ) -> None:
        """A read that may act (a status poll can take a lost run over) is refused when a browser says another
        site asked; a backend's client, which sends no ``Sec-Fetch-Site``, passes."""
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site in ("cross-site", "same-site"):
            raise HttpError(f"refused a {site} request for a run: only this site's page and your own clients may "
                            "read runs", 403, field="Sec-Fetch-Site")

    def origin_allowed(self, origin: str) -> bool:
        if self.origins is None:
            return False
        if self.origins == "*":
            return True
        if isinstance(self.origins, str):
            return origin == self.origins
        return origin in self.origins

    def cors_headers(self, environ: Environ) -> Headers:
        if self.origins is None:
            return []
        if self.origins == "*":
            return [("Access-Control-Allow-Origin", "*")]
        if isinstance(self.origins, str):
            return [("Access-Control-Allow-Origin", self.origins)]
        origin = environ.get("HTTP_ORIGIN", "")
        headers = [("Vary", "Origin")]
        if origin in self.origins:
            headers.append(("Access-Control-Allow-Origin", origin))
        return headers

    @staticmethod
    def preflight_headers(allowed: Sequence[str]) -> Headers:
        return [
            ("Allow", ", ".join(allowed)),
            ("Access-Control-Allow-Methods", ", ".join(allowed)),
            ("Access-Control-Allow-Headers", "Content-Type"),
            ("Access-Control-Max-Age", "600"),
        ]


def _asks_for_event_stream(environ: Environ) -> bool:
    """``Accept`` names ``text/event-stream`` itself (``*/*`` is what a tag or curl sends, not a stream reader)."""
    accept = environ.get("HTTP_ACCEPT", "").lower()
    return "text/event-stream" in {part.split(";", 1)[0].strip() for part in accept.split(",")}


def _check_origins(allow_origin: Union[str, Iterable[str], None]) -> Origins:
    """``None``, ``"*"``, one origin, or a frozenset of origins; each checked so no header can be forged."""
    if allow_origin is None or allow_origin == "*":
        return allow_origin
    origins = [allow_origin] if isinstance(allow_origin, str) else list(allow_origin)
    for origin in origins:
        if not isinstance(origin, str) or not _ORIGIN.match(origin):
            raise ConfigError(f"allow_origin entries must look like 'https://app.example' (scheme://host[:port], "
                              f"no path or trailing slash) or be '*', got {origin!r}")
    if not origins:
        raise ConfigError("allow_origin is an empty collection; pass None for same-origin only")
    return origins[0] if isinstance(allow_origin, str) else frozenset(origins)


SEND = 'send {"messages": [{"role": "user", "content": "..."}]}'
_PUBLIC_ROLES = ("user", "assistant")
_PUBLIC_KEYS = frozenset({"role", "content"})


class RequestRejected(StreamEngineError, ValueError):
    """The request's messages break the policy; ``field`` names where (``messages[1].role``)."""

    def __init__(self, message: str, field: str = "messages") -> None:
        super().__init__(message)
        self.field = field


def messages_from_request(payload: Any, *, system_prompt: Optional[str] = None,
                          trusted: bool = False, parts: Optional[PartsPolicy] = None) -> List[Message]:
    """The conversation to run for a decoded JSON request body ``{"messages": [...]}``.

    Untrusted (the default): only ``{"role": "user"|"assistant", "content": str}``
    messages (or lists of content parts), ending with a user message; anything
    else raises :class:`RequestRejected` naming the field.  ``system_prompt``
    (yours, not the caller's) goes first.  ``trusted=True`` accepts every role
    and tool-call field :func:`~streamengine._messages.as_message` understands,
    still after ``system_prompt``, and any content part.  Untrusted, images,
    audio and files pass only as ``parts`` (a
    :class:`~streamengine.web._parts.PartsPolicy`) allows; by default none do.
    """
    raw = _raw_messages(payload)
    parsed = [_trusted_message(i, m) if trusted else _public_message(i, m) for i, m in enumerate(raw)]
    try:
        require_unicode("messages", raw)
    except RecursionError as exc:
        raise RequestRejected(f"messages are nested too deeply; {SEND}") from exc
    refusal = None if trusted else checked_policy(parts).refusal(parsed)
    if refusal is not None:
        raise RequestRejected(*refusal)
    if not trusted and parsed[-1].role != "user":
        raise RequestRejected(f"messages[{len(raw) - 1}].role: the last message must be the user's question, "
                              f"got {parsed[-1].role!r}; "
                              f"end with {{\"role\": \"user\", \"content\": \"...\"}}",
                              f"messages[{len(raw) - 1}].role")
    return with_system_prompt(parsed, system_prompt)


def with_system_prompt(messages: List[Message], system_prompt: Optional[str]) -> List[Message]:
    return ([Message(role="system", content=system_prompt)] if system_prompt else []) + messages


def _raw_messages(payload: Any) -> List[Any]:
    if not isinstance(payload, dict):
        raise RequestRejected(f"body must be a JSON object, got {json_type(payload)}; {SEND}", "body")
    if "messages" not in payload:
        raise RequestRejected(f"body has no \"messages\" field; {SEND}")
    messages = payload["messages"]
    if not isinstance(messages, list):
        raise RequestRejected(f"\"messages\" must be a list, got {json_type(messages)}; {SEND}")
    if not messages:
        raise RequestRejected(f"\"messages\" is empty; {SEND}")
    return messages


def _public_message(i: int, message: Any) -> Message:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be an object, got {json_type(message)}; {SEND}", where)
    role = message.get("role")
    if role not in _PUBLIC_ROLES:
        shown = repr(role) if isinstance(role, str) else json_type(role)
        raise RequestRejected(
            f"{where}.role {shown} is not accepted from a request; send \"user\" or \"assistant\" "
            "(the system prompt is the application's: make_wsgi_app(engine, system_prompt=...); "
            "tool messages come from the server's own runs)", f"{where}.role")
    extra = sorted(set(message) - _PUBLIC_KEYS)
    if extra:
        raise RequestRejected(
            f"{where}.{extra[0]} is not accepted from a request; send only "
            "{\"role\": \"user\"|\"assistant\", \"content\": \"text\"} (tool calls and their results "
            "are made by the server)", f"{where}.{extra[0]}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: read as everywhere, then PartsPolicy decides
        try:
            text, parts = message_content(content, role, f"{where}.content")
        except ConfigError as exc:
            raise RequestRejected(clip(str(exc), 300), f"{where}.content") from exc
        return Message(role=role, content=text, parts=parts)
    if not isinstance(content, str):
        raise RequestRejected(f"{where}.content must be a string or a list of content parts, got "
                              f"{json_type(content)}; {SEND}", f"{where}.content")
    return Message(role=role, content=content)


def _trusted_message(i: int, message: Any) -> Message:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be an object, got {json_type(message)}; {SEND}", where)
    missing = [key for key in ("role", "content") if key not in message]
    if missing:
        raise RequestRejected(f"{where} has no {' or '.join(repr(k) for k in missing)}; each message "
                              "needs \"role\" (system, user, assistant or tool) and \"content\"", where)
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise RequestRejected(f"{where}.tool_calls must be a list of objects; send null or "
                              '[{"id": "...", "function": {"name": "...", "arguments": "{}"}}]',
                              f"{where}.tool_calls")
    try:
        return as_message(message)
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:  # the last three: odd tool_calls
        raise RequestRejected(f"{where} is invalid: {clip(str(exc), 300)}; {SEND}", where) from exc


def require_unicode(where: str, value: Any) -> None:
    """Refuse unpaired surrogates anywhere in the messages.

    JSON may carry ``\\ud83d`` alone; that is not text, has no UTF-8 form, and
    would only fail the provider request mid-run instead of here.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestRejected(f"{where} contains an unpaired surrogate (\\u{ord(value[exc.start]):04x} at "
                                  f"position {exc.start}); send valid Unicode text", where) from exc
    elif isinstance(value, list):
        for i, item in enumerate(value):
            require_unicode(f"{where}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            require_unicode(f"{where} key", key)
            require_unicode(f"{where}.{key}", item)


def clip(text: str, limit: int) -> str:
    """Errors quote what was sent; a megabyte of it helps nobody."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


ClientKey = Callable[[Environ], str]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def client_address(environ: Environ) -> str:
    """The default client key: the peer address (behind a proxy, pass a ``client_key`` that reads yours)."""
    return environ.get("REMOTE_ADDR") or "unknown"


class HostCheck:
    """The ``Host`` header must name this server; ``None`` hosts = loopback names + the bound address."""

    def __init__(self, allowed_hosts: Optional[Iterable[str]]) -> None:
        if isinstance(allowed_hosts, str):
            raise ConfigError(f"allowed_hosts must be a collection of host names, got the string "
                              f"{allowed_hosts!r}; write allowed_hosts=[{allowed_hosts!r}]")
        self._any = False
        self._configured: Optional[FrozenSet[str]] = None
        if allowed_hosts is not None:
            hosts = [self._checked(h) for h in allowed_hosts]
            self._any = "*" in hosts
            self._configured = frozenset(h for h in hosts if h != "*")

    @staticmethod
    def _checked(host: object) -> str:
        if not isinstance(host, str) or not host.strip() or any(c in host for c in "/@ "):
            raise ConfigError(f"allowed_hosts entries must be host names like 'chat.example.com' or "
                              f"'127.0.0.1' (no scheme, port or path), or '*' for any; got {host!r}")
        return _bare(host.strip().lower())

    def check(self, environ: Environ) -> None:
        if self._any:
            return
        raw = environ.get("HTTP_HOST") or ""
        host = _host_of(raw.strip().lower())
        allowed = self._configured if self._configured is not None else self._defaults(environ)
        if host is None or host not in allowed:
            raise HttpError(f"Host {raw or '(none)'!r} is not served here (DNS rebinding guard); allowed: "
                            f"{', '.join(sorted(allowed))}. Serving under another name? "
                            "Pass make_wsgi_app(engine, allowed_hosts=[...])", 400, field="Host")

    @staticmethod
    def _defaults(environ: Environ) -> FrozenSet[str]:
        server = _bare((environ.get("SERVER_NAME") or "").lower())
        return LOOPBACK_HOSTS | ({server} if server not in _WILDCARDS else set())


def _host_of(header: str) -> Optional[str]:
    """The host name of a ``Host`` header, or None when it is not ``host[:port]``.

    A Host header carries no userinfo (RFC 9110 7.2), so ``127.0.0.1:80@evil.example``
    is refused rather than read as "127.0.0.1"; the port, when present, must be digits.
    """
    if "@" in header:
        return None
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        host, rest = header[:end + 1], header[end + 1:]
    elif header.count(":") == 1:
        host, port = header.split(":")
        rest = ":" + port
    else:
        host, rest = header, ""  # a bare IPv6 address without brackets has several colons and no port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii()):
        return None
    return _bare(host)


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class Watched(Protocol):
    """A stream response the stuck-reader watch (``_sse.StuckReaders``) can give up on: an app's or a run's."""

    @property
    def writing_since(self) -> Optional[float]: ...

    @property
    def cancel(self) -> threading.Event: ...

    def give_up(self) -> None: ...


class StreamLimiter:
    """Counts open streams, in total and per client key; refuses over either cap with a 429."""

    def __init__(self, max_streams: int, max_streams_per_client: int, client_key: ClientKey,
                 retry_after_s: int) -> None:
        for name, value in (("max_streams", max_streams), ("max_streams_per_client", max_streams_per_client),
                            ("retry_after_s", retry_after_s)):
            validation.count(value, name, minimum=1)
        if not callable(client_key):
            raise ConfigError(f"client_key must be a function environ -> str, got {type(client_key).__name__}")
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client
        self._client_key = client_key
        self._retry_after = str(retry_after_s)
        self._lock = threading.Lock()
        self._total = 0
        self._per_client: Dict[str, int] = {}

    @property
    def active(self) -> int:
        return self._total

    def acquire(self, environ: Environ) -> Callable[[], None]:
        """Take a slot for this request's client, or raise a 429; returns ``release()`` (idempotent)."""
        key = str(self._client_key(environ))
        with self._lock:
            if self._total >= self.max_streams:
                raise self._refusal(f"the server is at its limit of {self.max_streams} concurrent streams")
            held = self._per_client.get(key, 0)
            if held >= self.max_streams_per_client:
                raise self._refusal(f"this client already has {held} open streams (the limit is "
                                    f"{self.max_streams_per_client}); close one")
            self._total += 1
            self._per_client[key] = held + 1
        released: List[bool] = []

        def release() -> None:
            with self._lock:
                if released:
                    return
                released.append(True)
                self._total -= 1
                left = self._per_client[key] - 1
                if left:
                    self._per_client[key] = left
                else:
                    del self._per_client[key]

        return release

    def _refusal(self, why: str) -> HttpError:
        return HttpError(f"{why}; retry after {self._retry_after} s", 429, [("Retry-After", self._retry_after)])
