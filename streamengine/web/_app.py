"""The engine as a PEP 3333 WSGI app: routes, request checks, and the stream's start.

Routes (relative to where the app is mounted, ``SCRIPT_NAME``)::

    GET  /                     a self-contained page (inline CSS/JS, no external assets)
    GET  /healthz              {"status": "ok"}
    POST /v1/chat/stream       body {"messages": [{"role": "user", "content": "..."}, ...]}
    GET  /v1/chat/stream?q=…   the same for one user message (get_runs=True)
    OPTIONS <any route>        CORS preflight, only when ``allow_origin`` is set

A request passes, in order: the Host check, the cross-site check, the
``authorize`` hook, the message policy and the stream limits (see
:mod:`.guard` and :mod:`.policy`); any refusal is a JSON
``{"error": ..., "field": ...}`` with a 4xx status, before the stream starts.
"""
from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qs

from .. import _validation as validation
from .._errors import ConfigError
from .._logs import component_logger
from .._messages import Message
from ._public_errors import PublicErrors
from ._guard import ClientKey, HostCheck, StreamLimiter, client_address
from ._http import Headers, HttpError, StartResponse, json_response, status_line
from ._page import fill_page, load_page
from ._policy import SEND, RequestRejected, messages_from_request, with_system_prompt
from ._response import SseResponse, StuckReaders

STREAM_PATH = "/v1/chat/stream"
HEALTH_PATH = "/healthz"
PAGE_PATH = "/"

Authorize = Callable[[dict], Any]
Route = Callable[[dict], Tuple[str, Headers, Iterable[bytes]]]
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+$")


class StreamApp:
    """The WSGI callable serving ``engine``; one instance serves any number of concurrent streams.

    Trust: ``system_prompt`` is the app's; requests may send only user and
    assistant text unless ``trusted_messages=True`` (your own backend).
    ``authorize(environ)``: falsy -> 401, raise ``PermissionError`` -> 403.
    ``scope(environ)``: the RAG scope of the request's run (``conversation_id``),
    e.g. the signed-in user's or tenant's id; runs with the same scope search
    each other's tool results.  None (or no hook): each run is its own scope.
    It comes from the application, never from the request body.
    ``allowed_hosts``: Host names served (default: loopback + the server's
    name; ``["*"]`` = any).  ``allow_origin``: ``"*"``, one origin or a
    collection -> CORS for POST (``"*"`` lets every site start runs from its
    visitors' browsers: avoid).  ``get_runs``: allow ``GET ?q=`` runs (only
    same-origin when a browser asks).  ``max_streams`` /
    ``max_streams_per_client`` (keyed by ``client_key(environ)``, default the
    peer address) cap open streams: 429 + ``Retry-After: retry_after_s``.
    ``expose_errors``: error details to the client (development only).
    ``stuck_reader_timeout_s``: cancel a run whose client read nothing for
    that long (``None``: never).  ``heartbeat_s``: seconds of silence before
    a ``: ping``.  ``max_body_bytes`` caps a POST body (and a ``q``).
    """

    def __init__(self, engine: Any, *, system_prompt: Optional[str] = None, trusted_messages: bool = False,
                 authorize: Optional[Authorize] = None, allowed_hosts: Optional[Iterable[str]] = None,
                 allow_origin: Union[None, str, Iterable[str]] = None, get_runs: bool = True,
                 max_streams: int = 32, max_streams_per_client: int = 4, client_key: Optional[ClientKey] = None,
                 retry_after_s: int = 5, expose_errors: bool = False,
                 stuck_reader_timeout_s: Optional[float] = 60.0, heartbeat_s: Optional[float] = 15.0,
                 max_body_bytes: int = 1_000_000, scope: Optional[Callable[[dict], Optional[str]]] = None) -> None:
        if not callable(getattr(engine, "run", None)):
            raise ConfigError(f"make_wsgi_app needs a StreamingEngine (something with .run()), "
                              f"got {type(engine).__name__}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ConfigError(f"system_prompt must be a string or None, got {type(system_prompt).__name__}")
        if authorize is not None and not callable(authorize):
            raise ConfigError(f"authorize must be a function environ -> bool, got {type(authorize).__name__}")
        validation.count(max_body_bytes, "max_body_bytes", minimum=1)
        if scope is not None and not callable(scope):
            raise ConfigError(f"scope must be a function environ -> str or None, got {type(scope).__name__}")
        self.engine = engine
        self.system_prompt = system_prompt
        self.trusted_messages = bool(trusted_messages)
        self.expose_errors = bool(expose_errors)
        self.get_runs = bool(get_runs)
        self.heartbeat_s = validation.seconds(heartbeat_s, "heartbeat_s", allow_none=True)
        self.max_body_bytes = max_body_bytes
        self._authorize = authorize
        self._scope = scope
        self._hosts = HostCheck(allowed_hosts)
        self._origins = _check_origins(allow_origin)
        self._limiter = StreamLimiter(max_streams, max_streams_per_client, client_key or client_address,
                                      retry_after_s)
        self._log = component_logger("streamengine.web.StreamApp")
        self._stuck = StuckReaders(validation.seconds(stuck_reader_timeout_s, "stuck_reader_timeout_s",
                                                      allow_none=True), self._log)
        self._page, self._page_csp = load_page()
        self._routes: Dict[str, Dict[str, Route]] = {
            PAGE_PATH: {"GET": self._page_response},
            HEALTH_PATH: {"GET": self._health},
            STREAM_PATH: {"POST": self._stream_post, **({"GET": self._stream_get} if self.get_runs else {})},
        }

    @property
    def active_streams(self) -> int:
        """Streams started and not yet closed (for health pages and leak tests)."""
        return self._limiter.active

    # --- WSGI -------------------------------------------------------------------------
    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET").upper()
        cors = self._cors_headers(environ)
        try:
            if path != HEALTH_PATH:  # load balancers probe health by address; it reveals nothing
                self._hosts.check(environ)
            status, headers, body = self._dispatch(path, method, environ)
        except HttpError as exc:
            status, headers, body = json_response(exc.status, exc.payload(), exc.headers)
        start_response(status, headers + cors)
        return body

    def _dispatch(self, path: str, method: str, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        methods = self._routes.get(path)
        if methods is None:
            raise HttpError(f"no such path {path!r}; this app serves GET {PAGE_PATH} (page), "
                            f"GET {HEALTH_PATH}, and POST {STREAM_PATH}", 404)
        allowed = sorted(methods) + (["OPTIONS"] if self._origins is not None else [])
        if method == "OPTIONS" and self._origins is not None:
            return status_line(204), self._preflight_headers(allowed), []
        handler = methods.get(method)
        if handler is None:
            hint = " (GET runs are off: make_wsgi_app(get_runs=True))" if path == STREAM_PATH and not self.get_runs \
                else ""
            raise HttpError(f"method {method} is not allowed on {path}; use {' or '.join(allowed)}{hint}",
                            405, [("Allow", ", ".join(allowed))])
        return handler(environ)

    # --- routes -------------------------------------------------------------------------
    def _page_response(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        stream_url = (environ.get("SCRIPT_NAME") or "").rstrip("/") + STREAM_PATH
        body = fill_page(self._page, stream_url, environ)
        return status_line(200), [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", self._page_csp),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ], [body]

    def _health(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        return json_response(200, {"status": "ok"})

    def _stream_get(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        self._refuse_cross_site_get(environ)
        self._check_authorized(environ)
        query = parse_qs(_wsgi_text(environ.get("QUERY_STRING", "")), keep_blank_values=True)
        values = query.get("q")
        if not values or not values[0].strip():
            raise HttpError(f"missing query parameter q; use GET {STREAM_PATH}?q=your+question, "
                            f"or POST {STREAM_PATH} with {SEND}", field="q")
        if len(values[0].encode("utf-8")) > self.max_body_bytes:
            raise HttpError(f"q is longer than {self.max_body_bytes} bytes; send a shorter question", field="q")
        return self._stream(with_system_prompt([Message(role="user", content=values[0])], self.system_prompt),
                            environ)

    def _stream_post(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        self._refuse_cross_site(environ)
        self._check_authorized(environ)
        payload = _decode_json(self._read_body(environ))
        try:
            messages = messages_from_request(payload, system_prompt=self.system_prompt,
                                             trusted=self.trusted_messages)
        except RequestRejected as exc:
            raise HttpError(str(exc), field=exc.field) from exc
        return self._stream(messages, environ)

    def _stream(self, messages: List[Message], environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        release = self._limiter.acquire(environ)
        request_id = uuid.uuid4().hex[:12]
        probe = environ.get("waitress.client_disconnected")
        holder: List[SseResponse] = []

        def closed() -> None:
            release()
            if holder:
                self._stuck.remove(holder[0])

        try:
            response = SseResponse(self.engine, messages, heartbeat_s=self.heartbeat_s,
                                   disconnected=probe if callable(probe) else None, on_close=closed,
                                   errors=PublicErrors(request_id, expose=self.expose_errors, logger=self._log),
                                   logger=self._log, run_options=self._run_options(environ))
        except ConfigError as exc:  # the messages were checked: this is the engine refusing (closed)
            release()
            raise HttpError(f"the engine cannot take requests: {exc}", 503) from exc
        except BaseException:
            release()
            raise
        holder.append(response)
        self._stuck.add(response)
        self._log.info("request {}: stream started for {}", request_id, environ.get("REMOTE_ADDR", "?"))
        return status_line(200), [
            ("Content-Type", "text/event-stream; charset=utf-8"),
            ("Cache-Control", "no-cache"),
            ("X-Accel-Buffering", "no"),
            ("X-Request-Id", request_id),
        ], response

    # --- request checks ---------------------------------------------------------------------
    def _check_authorized(self, environ: dict) -> None:
        if self._authorize is None:
            return
        try:
            allowed = self._authorize(environ)
        except PermissionError as exc:
            raise HttpError(f"forbidden: {exc or 'the authorize hook refused this request'}", 403) from exc
        except Exception as exc:
            request_id = uuid.uuid4().hex[:12]
            self._log.opt(exception=exc).error("request {}: the authorize hook failed: {}", request_id, exc)
            raise HttpError(f"the authorization check failed (request id {request_id}); try again later or "
                            "ask the operator to look at the server log", 500) from exc
        if not allowed:
            raise HttpError("not authorized: sign in (or send your credentials) and retry", 401)

    def _run_options(self, environ: dict) -> Dict[str, Any]:
        """``conversation_id`` from the application's ``scope`` hook (nothing without one)."""
        if self._scope is None:
            return {}
        try:
            scope = self._scope(environ)
            if scope is not None and (not isinstance(scope, str) or not scope.strip()):
                raise TypeError(f"the scope hook must return a non-empty str or None, got {scope!r}")
            return {"conversation_id": scope}
        except Exception as exc:
            request_id = uuid.uuid4().hex[:12]
            self._log.opt(exception=exc).error("request {}: the scope hook failed: {}", request_id, exc)
            raise HttpError(f"the request's scope could not be determined (request id {request_id}); try again "
                            "later or ask the operator to look at the server log", 500) from exc

    def _read_body(self, environ: dict) -> bytes:
        media_type = (environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise HttpError(f"Content-Type must be application/json, got {media_type or 'none'!r}; {SEND}",
                            field="Content-Type")
        raw_length = (environ.get("CONTENT_LENGTH") or "").strip()
        try:
            length = int(raw_length) if raw_length else 0
        except ValueError as exc:
            raise HttpError(f"invalid Content-Length {raw_length!r}; {SEND}", field="Content-Length") from exc
        if length > self.max_body_bytes:
            raise HttpError(f"body too large: {length} bytes, the limit is {self.max_body_bytes}; "
                            "send fewer or shorter messages", field="body")
        if length <= 0:
            raise HttpError(f"empty body; {SEND}", field="body")
        body = environ["wsgi.input"].read(length)
        if len(body) < length:
            raise HttpError(f"body ended after {len(body)} of {length} bytes; resend the request", field="body")
        return body

    def _refuse_cross_site_get(self, environ: dict) -> None:
        """A GET run must come from this site's own script (fetch/EventSource), never from a link or a tag.

        A GET needs no preflight: ``<img src=".../v1/chat/stream?q=...">`` on
        any page, or a link clicked in a mail or chat app (``Sec-Fetch-Site:
        none``, ``Sec-Fetch-Mode: navigate``), would start a run.  So whatever
        ``allow_origin`` says, a browser's GET must be same-origin and made by
        script (``Sec-Fetch-Dest: empty``, not a navigation).  Clients that are
        not browsers send no ``Sec-Fetch-*`` headers and pass, unless their
        ``Accept`` asks for HTML: that is a browser too old to send them
        following a link.
        """
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site == "none":
            raise HttpError("refused a GET run from outside this site's page (a link opened from another "
                            "application, a bookmark or a typed address); open the page at / and ask there",
                            403, field="Sec-Fetch-Site")
        if site and site != "same-origin":
            raise HttpError(f"refused a {site} GET run: other sites may start runs only with a POST that "
                            "allow_origin admits", 403, field="Sec-Fetch-Site")
        dest = environ.get("HTTP_SEC_FETCH_DEST", "")
        if dest and dest != "empty":
            raise HttpError(f"refused a GET run loaded as {dest!r}: runs start from the page's fetch() or "
                            "EventSource; open the page at / and ask there", 403, field="Sec-Fetch-Dest")
        if environ.get("HTTP_SEC_FETCH_MODE", "") == "navigate":
            raise HttpError("refused a GET run opened as a page: runs start from the page's fetch() or "
                            "EventSource; open the page at / and ask there", 403, field="Sec-Fetch-Mode")
        if not site and _asks_for_html(environ):
            raise HttpError("refused a GET run asking for HTML (a browser following a link); open the page at / "
                            "and ask there, or send Accept: text/event-stream from a client of your own",
                            403, field="Accept")

    def _refuse_cross_site(self, environ: dict) -> None:
        """Another site may POST a run only if ``allow_origin`` lets its origin in.

        A run costs money and may call tools.  Browsers say where a request
        comes from in ``Sec-Fetch-Site``; clients that are not browsers send
        no such header and are not affected.
        """
        site = _cross_site(environ)
        if not site:
            return
        origin = environ.get("HTTP_ORIGIN", "")
        if origin and self._origin_allowed(origin):
            return
        source = f" from {origin}" if origin else ""
        raise HttpError(f"refused a {site} request{source}: another site may not start runs here; to allow "
                        "one, pass its origin as make_wsgi_app(engine, allow_origin=[...])", 403, field="Origin")

    # --- CORS ---------------------------------------------------------------------------------
    def _origin_allowed(self, origin: str) -> bool:
        if self._origins is None:
            return False
        if self._origins == "*":
            return True
        if isinstance(self._origins, str):
            return origin == self._origins
        return origin in self._origins

    def _cors_headers(self, environ: dict) -> Headers:
        if self._origins is None:
            return []
        if self._origins == "*":
            return [("Access-Control-Allow-Origin", "*")]
        if isinstance(self._origins, str):
            return [("Access-Control-Allow-Origin", self._origins)]
        origin = environ.get("HTTP_ORIGIN", "")
        headers = [("Vary", "Origin")]
        if origin in self._origins:
            headers.append(("Access-Control-Allow-Origin", origin))
        return headers

    @staticmethod
    def _preflight_headers(allowed: Sequence[str]) -> Headers:
        return [
            ("Allow", ", ".join(allowed)),
            ("Access-Control-Allow-Methods", ", ".join(allowed)),
            ("Access-Control-Allow-Headers", "Content-Type"),
            ("Access-Control-Max-Age", "600"),
        ]


# --- helpers ----------------------------------------------------------------------------------

def _decode_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise HttpError(f"body is not UTF-8 ({exc.reason} at byte {exc.start}); {SEND}", field="body") from exc
    except RecursionError as exc:
        raise HttpError(f"body is nested too deeply to parse; {SEND}", field="body") from exc
    except ValueError as exc:
        raise HttpError(f"body is not valid JSON ({str(exc)[:200]}); {SEND}", field="body") from exc


def _cross_site(environ: dict) -> str:
    """``"cross-site"`` or ``"same-site"`` when a browser says the request comes from elsewhere, else ``""``."""
    site = environ.get("HTTP_SEC_FETCH_SITE", "")
    return site if site in ("cross-site", "same-site") else ""


def _asks_for_html(environ: dict) -> bool:
    """Whether ``Accept`` names an HTML type: what a browser sends for a navigation, never fetch() or EventSource."""
    accept = environ.get("HTTP_ACCEPT", "").lower()
    types = {part.split(";", 1)[0].strip() for part in accept.split(",")}
    return bool(types & {"text/html", "application/xhtml+xml"})


def _wsgi_text(native: str) -> str:
    """A PEP 3333 native string holds the raw bytes as latin-1; raw (unescaped) UTF-8 is decoded."""
    try:
        return native.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a server that already decoded it
        return native


#: ``make_wsgi_app(engine, **options)`` is the app's documented name; the
#: class is the one place its options and their defaults are written.
make_wsgi_app = StreamApp


def _check_origins(allow_origin: Union[None, str, Iterable[str]]) -> Union[None, str, FrozenSet[str]]:
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
