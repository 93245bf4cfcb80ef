"""The engine as a PEP 3333 WSGI app: routes, the page, mounting under a prefix, the stream's start.

The page the app serves at ``/``: read once, with a CSP that allows exactly its inline code.

The page (``streamengine/static/index.html``) is self-contained: its script
and style are inline, so the Content-Security-Policy names them by SHA-256
and allows nothing else (no external assets, no other inline code).

Serving the app under a prefix next to another WSGI app (Flask, Django).

The engine as a PEP 3333 WSGI app: routes, request checks, and the stream's start.

Routes (relative to where the app is mounted, ``SCRIPT_NAME``)::

    GET  /                     a self-contained page (inline CSS/JS, no external assets)
    GET  /healthz              {"status": "ok"}
    POST /v1/chat/stream       body {"messages": [{"role": "user", "content": "..."}, ...]}
    GET  /v1/chat/stream?q=…   the same for one user message (get_runs=True)
    POST /api/chat             the AI SDK's useChat request, answered as a UI message stream (_aisdk)
    GET  /api/chat/<id>/stream useChat's resume (resume: true): the chat's active run (runs=), else 204
    POST /agui                 an AG-UI RunAgentInput, answered as AG-UI events (_agui)
    OPTIONS <any route>        CORS preflight, only when ``allow_origin`` is set

A request passes, in order: the Host check, the cross-site check, the
``authorize`` hook, the message policy and the stream limits (see
:mod:`._guard`); any refusal is a JSON
``{"error": ..., "field": ...}`` with a 4xx status, before the stream starts.
"""
from __future__ import annotations

import base64
import hashlib
import html
import inspect
import json
import pkgutil
import re
import uuid
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypedDict,
    Union,
)
from urllib.parse import parse_qs

from .. import _validation as validation
from .._errors import ConfigError
from .._logs import component_logger
from .._messages import LLM_WARNING, Message, ToolCall
from ..runs import MemoryRunLog, RunLog, RunStatus
from ._agui import AGUI_HEADERS, AgUiLogRender, AgUiStream, resume_entries, run_input
from ._aisdk import (
    UI_STREAM_HEADERS,
    UiLogRender,
    UiMessageStream,
    approval_responses,
    chat_id,
    chat_messages,
    check_ai_sdk_version,
)
from ._frames import SSE_HEADERS
from ._guard import (
    SEND,
    ClientKey,
    CrossSite,
    Headers,
    HostCheck,
    HttpError,
    RequestRejected,
    StreamLimiter,
    client_address,
    engine_refusal,
    json_response,
    may_autorun,
    messages_from_request,
    status_line,
    with_system_prompt,
)
from ._parts import PartsPolicy, checked_policy
from ._producer import APPEND_WINDOW_S
from ._runs import RUNS_PATH, ChatRun, Owner, RunRoutes, last_event_id
from ._sse import EngineLike, Framer, PublicErrors, RunOptions, SseResponse, StuckReaders, connection_dropper
from ._takeover import Taker, takes_checkpoints

if TYPE_CHECKING:  # typeshed's PEP 3333 types (wsgiref.types is Python 3.11+)
    from _typeshed.wsgi import InputStream, StartResponse, WSGIApplication, WSGIEnvironment

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


def load_page() -> Tuple[str, str]:
    """The page and a CSP allowing exactly its inline script and style (by SHA-256)."""
    data = pkgutil.get_data("streamengine", "static/index.html")
    if data is None:  # pragma: no cover - a broken installation
        raise ConfigError("streamengine/static/index.html is missing from this installation; reinstall streamengine")
    page = data.decode("utf-8")
    hashes: Dict[str, List[str]] = {"script": [], "style": []}
    for kind, content in _INLINE.findall(page):
        digest = base64.b64encode(hashlib.sha256(content.encode("utf-8")).digest()).decode("ascii")
        hashes[kind].append(f"'sha256-{digest}'")
    script = " ".join(hashes["script"]) or "'none'"
    style = " ".join(hashes["style"]) or "'none'"
    csp = (f"default-src 'none'; script-src {script}; style-src {style}; connect-src 'self'; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return page, csp


def fill_page(page: str, stream_url: str, environ: WSGIEnvironment) -> bytes:
    """The page for one request: its stream URL, whether ``?autorun=`` may start a run, the warning prefix."""
    # ?autorun=PROMPT asks on load only for a same-origin request no click made (_guard); any other only fills
    # the box.
    autorun = "on" if may_autorun(environ) else "off"
    return (page.replace("__STREAM_URL__", html.escape(stream_url, quote=True))
            .replace("__AUTORUN__", autorun)
            .replace("__LLM_WARNING__", html.escape(LLM_WARNING, quote=True)).encode("utf-8"))


class WsgiApp(Protocol):
    """A PEP 3333 app as :func:`mount` returns it: callable by position or by name.

    By name too, so it can replace a method such as Flask's ``app.wsgi_app``
    (a type checker refuses a positional-only callable there).
    """

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]: ...


def mount(host_app: WSGIApplication, prefix: str, app: WSGIApplication) -> WsgiApp:
    """A WSGI app sending ``prefix`` and everything below it to ``app``, the rest to ``host_app``.

    The way to put the stream next to an existing Flask or Django app without
    touching its routing: the prefix moves from ``PATH_INFO`` to
    ``SCRIPT_NAME`` (PEP 3333), so ``app`` sees its own paths and the page
    links to ``<prefix>/v1/chat/stream``::

        application = mount(get_wsgi_application(), "/chat", make_wsgi_app(engine))
    """
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.endswith("/") \
            or any(c in prefix for c in "?#") or not prefix.isprintable():
        raise ConfigError(f"mount prefix must look like '/chat' (leading slash, no trailing slash), got {prefix!r}")
    for name, value in (("host_app", host_app), ("app", app)):
        if not callable(value):
            raise ConfigError(f"mount {name} must be a WSGI callable, got {type(value).__name__}")

    def dispatch(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or ""
        if path == prefix or path.startswith(prefix + "/"):
            environ = dict(environ, SCRIPT_NAME=(environ.get("SCRIPT_NAME") or "") + prefix,
                           PATH_INFO=path[len(prefix):])
            return app(environ, start_response)
        return host_app(environ, start_response)

    return dispatch


STREAM_PATH = "/v1/chat/stream"
#: The AI SDK's ``useChat`` posts here (``DefaultChatTransport``'s default ``api``).
CHAT_PATH = "/api/chat"
#: ``useChat`` with ``resume: true`` asks ``{CHAT_PATH}/<chatId>{RESUME_SUFFIX}`` for a stream to rejoin.
RESUME_SUFFIX = "/stream"
#: An AG-UI client (``HttpAgent``) posts its ``RunAgentInput`` here.
AGUI_PATH = "/agui"
HEALTH_PATH = "/healthz"
PAGE_PATH = "/"

#: ``authorize(environ)``: truthy lets the request in, falsy is a 401, ``PermissionError`` a 403.
Authorize = Callable[["WSGIEnvironment"], object]
#: ``approve(call, environ)``: whether this request's run may call a tool with side effects.
Approve = Callable[[ToolCall, "WSGIEnvironment"], object]
#: ``scope(environ)``: the run's RAG scope (``conversation_id``), or None for a scope of its own.
Scope = Callable[["WSGIEnvironment"], Optional[str]]
Route = Callable[["WSGIEnvironment"], Tuple[str, Headers, Iterable[bytes]]]
#: Makes one response's framer from its :class:`PublicErrors` (None: the app's own event names).
MakeFramer = Callable[[PublicErrors], Framer]


class AppOptions(TypedDict, total=False):
    """:class:`StreamApp`'s options but ``approve``: what ``serve(engine, **options)`` passes on, checked by name."""

    system_prompt: Optional[str]
    trusted_messages: bool
    authorize: Optional[Authorize]
    allowed_hosts: Optional[Iterable[str]]
    allow_origin: Union[str, Iterable[str], None]
    get_runs: bool
    max_streams: int
    max_streams_per_client: int
    client_key: Optional[ClientKey]
    retry_after_s: int
    expose_errors: bool
    stuck_reader_timeout_s: Optional[float]
    heartbeat_s: Optional[float]
    max_body_bytes: int
    scope: Optional[Scope]
    parts: Optional[PartsPolicy]
    ai_sdk_version: int
    runs: Optional[RunLog]
    owner: Optional[Owner]
    on_disconnect: Optional[str]
    detach_grace_s: float
    lease_s: float
    retain_s: float
    approvals: bool
    max_detached_per_client: int
    append_window_s: float
    take_over: Optional[bool]


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
    ``parts``: which images, audio and files a request may bring
    (:class:`~streamengine.web._parts.PartsPolicy`; None: text only); the
    body cap grows by what it lets in.
    ``ai_sdk_version``: the major version of the ``ai`` package the
    frontend's ``useChat`` uses (5, 6 or 7): ``POST /api/chat`` writes only
    the chunks that version accepts (docs/frontends.md).  With ``runs``,
    a ``useChat`` run is a run in the log too: ``GET /api/chat/<id>/stream``
    replays the chat's active run on any worker, and (from 6, with
    ``approvals=True``) a held call is asked with ``tool-approval-request``.

    Side effects: ``approve(call, environ) -> bool`` is asked, on the thread
    driving the run (the server's), before each call of a tool with side
    effects (``@tool(side_effects=True)``, an MCP tool not marked read-only)
    in this app's runs; ``environ`` is the request's, so the answer can
    depend on who asks.  False, or an exception, refuses the call: the model
    reads that it was not run.  Without ``approve`` the engine's own hook
    decides, and an engine without one refuses every such call.

    Runs that outlive their connection (docs/runs.md): with ``runs`` (a
    :class:`~streamengine.runs.RunLog`) every run gets an id and its frames
    go to the log first; a client resumes with ``Last-Event-ID`` on any
    worker sharing the log, stops a run with ``POST /v1/runs/<id>/stop`` and
    reads its status at ``GET /v1/runs/<id>``.  ``owner(environ)`` says whose
    runs a request may see (default: one owner for everyone; the 128-bit run
    id is the secret).  ``on_disconnect``: ``"detach"`` (the default with a
    shared log) drives a run on when its client goes away, cancelled as
    ``abandoned`` when no reader came back within ``detach_grace_s``;
    ``"cancel"`` (the default with ``MemoryRunLog``) ends it as today.
    ``max_detached_per_client`` caps detached runs per client.  ``lease_s``
    and ``retain_s`` are each run's (a dead worker is noticed within
    ``lease_s`` + 1 s).  ``approvals=True`` asks the run's readers about
    side-effect calls (``approval_request``, answered by ``POST
    /v1/runs/<id>/approvals/<call_id>``) instead of an ``approve`` hook.
    ``append_window_s`` (0.1): tokens this close to the last append wait
    to go with the next (the first after a pause goes at once); a longer
    window means fewer appends and writes (CPU) for later tokens
    (docs/runs.md).
    ``take_over`` (default: on with a shared log): the worker that notices a
    dead producer goes on with its run from the last round checkpoint
    (announced with ``reset``; side-effect calls of the interrupted round are
    not run again) instead of closing it as ``producer_lost``.
    """

    def __init__(self, engine: EngineLike, *, system_prompt: Optional[str] = None, trusted_messages: bool = False,
                 authorize: Optional[Authorize] = None, allowed_hosts: Optional[Iterable[str]] = None,
                 allow_origin: Union[str, Iterable[str], None] = None, get_runs: bool = True,
                 max_streams: int = 32, max_streams_per_client: int = 4, client_key: Optional[ClientKey] = None,
                 retry_after_s: int = 5, expose_errors: bool = False,
                 stuck_reader_timeout_s: Optional[float] = 60.0, heartbeat_s: Optional[float] = 15.0,
                 max_body_bytes: int = 1_000_000, scope: Optional[Scope] = None,
                 approve: Optional[Approve] = None, parts: Optional[PartsPolicy] = None,
                 ai_sdk_version: int = 5, approvals: bool = False, runs: Optional[RunLog] = None,
                 owner: Optional[Owner] = None, on_disconnect: Optional[str] = None, detach_grace_s: float = 60.0,
                 lease_s: float = 3.0, retain_s: float = 600.0, max_detached_per_client: int = 4,
                 append_window_s: float = APPEND_WINDOW_S, take_over: Optional[bool] = None) -> None:
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
        _check_approve(engine, approve)
        # approvals=True asks over the run routes whatever the ai version; useChat's runs ask only from 6 (ai 5
        # has no approval chunks), said once at start-up below.
        self.ai_sdk_version = check_ai_sdk_version(ai_sdk_version)
        self.engine = engine
        self.system_prompt = system_prompt
        self.trusted_messages = bool(trusted_messages)
        self.expose_errors = bool(expose_errors)
        self.get_runs = bool(get_runs)
        self.heartbeat_s = validation.seconds(heartbeat_s, "heartbeat_s", allow_none=True)
        self.max_body_bytes = max_body_bytes
        self.parts = checked_policy(parts)
        self.body_limit = max_body_bytes + self.parts.body_allowance()
        self._authorize = authorize
        self._scope = scope
        self._approve = approve
        self._hosts = HostCheck(allowed_hosts)
        self._sites = CrossSite(allow_origin)
        self._limiter = StreamLimiter(max_streams, max_streams_per_client, client_key or client_address,
                                      retry_after_s)
        self._log = component_logger("streamengine.web.StreamApp")
        self._stuck = StuckReaders(validation.seconds(stuck_reader_timeout_s, "stuck_reader_timeout_s",
                                                      allow_none=True), self._log)
        self._runs = self._run_routes(runs, owner=owner, on_disconnect=on_disconnect, detach_grace_s=detach_grace_s,
                                      lease_s=lease_s, retain_s=retain_s, approvals=approvals,
                                      max_detached_per_client=max_detached_per_client,
                                      limiter_key=client_key or client_address, retry_after_s=retry_after_s,
                                      append_window_s=append_window_s)
        self._set_take_over(take_over)
        if approvals is True and self.ai_sdk_version == 5:
            self._log.warning("approvals=True: useChat runs cannot ask about held calls with ai_sdk_version=5 (ai 5 "
                              "has no approval chunks), so the engine's own approve decides there; pass "
                              "ai_sdk_version=6 or 7 (and use that 'ai' version in the frontend)")
        self._page, self._page_csp = load_page()
        self._routes: Dict[str, Dict[str, Route]] = {
            PAGE_PATH: {"GET": self._page_response},
            HEALTH_PATH: {"GET": self._health},
            STREAM_PATH: {"POST": self._stream_post, **({"GET": self._stream_get} if self.get_runs else {})},
            CHAT_PATH: {"POST": self._chat_post},
            AGUI_PATH: {"POST": self._agui_post},
        }

    def _set_take_over(self, take_over: Optional[bool]) -> None:
        """Runs taken over from their last checkpoint when their worker dies (``web._takeover``): by default with
        a shared log and an engine whose runs take checkpoints."""
        if take_over is not None and not isinstance(take_over, bool):
            raise ConfigError(f"take_over must be True, False or None (on with a shared run log), got {take_over!r}")
        able = takes_checkpoints(self.engine)
        if take_over and (self._runs is None or not able):
            raise ConfigError("take_over=True needs a shared run log (runs=SqliteRunLog(path), RedisRunLog(url) or "
                              "PostgresRunLog(dsn)) and an engine whose run() takes on_checkpoint= (StreamingEngine)")
        if self._runs is None or not (take_over or (take_over is None and able
                                                    and not isinstance(self._runs.log, MemoryRunLog))):
            return
        expose, log = self.expose_errors, self._log
        self._runs.taker = Taker(self._runs, self.engine, self._run_options,
                                 lambda request_id: PublicErrors(request_id, expose=expose, logger=log))

    def _run_routes(self, runs: Optional[RunLog], *, approvals: bool, **options: Any) -> Optional[RunRoutes]:
        """The run routes over ``runs``, or None: without a log the app serves as it always did."""
        if approvals is not False and approvals is not True:
            raise ConfigError(f"approvals must be True or False, got {approvals!r}")
        if runs is None:
            if approvals:
                raise ConfigError("approvals=True needs a run log to hold the answers: pass runs=MemoryRunLog() "
                                  "(one process) or a shared one")
            return None
        if approvals and self._approve is not None:
            raise ConfigError("pass approve= (a hook on the server) or approvals=True (the run's readers answer "
                              "over the wire), not both")
        config = getattr(self.engine, "config", None)
        return RunRoutes(runs, approvals=approvals, limiter=self._limiter, heartbeat_s=self.heartbeat_s,
                         stuck=self._stuck, logger=self._log,
                         approval_timeout_s=float(getattr(config, "approval_timeout", 300.0)),
                         max_detached_per_client=validation.count(
                             options.pop("max_detached_per_client"), "max_detached_per_client", minimum=1),
                         **options)

    @property
    def active_streams(self) -> int:
        """Streams started and not yet closed (for health pages and leak tests)."""
        return self._limiter.active

    # --- WSGI -------------------------------------------------------------------------
    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET").upper()
        cors = self._sites.cors_headers(environ)
        try:
            if path != HEALTH_PATH:  # load balancers probe health by address; it reveals nothing
                self._hosts.check(environ)
            status, headers, body = self._dispatch(path, method, environ)
        except HttpError as exc:
            status, headers, body = json_response(exc.status, exc.payload(), exc.headers)
        start_response(status, headers + cors)
        return body

    def _dispatch(self, path: str, method: str, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        if self._runs is not None and path.startswith(RUNS_PATH):
            return self._run_route(path, method, environ)
        methods = self._routes.get(path)
        if methods is None and path.startswith(CHAT_PATH + "/") and path.endswith(RESUME_SUFFIX) \
                and len(path) > len(CHAT_PATH) + len(RESUME_SUFFIX) + 1:
            methods = {"GET": self._chat_resume}
        if methods is None:
            raise HttpError(f"no such path {path!r}; this app serves GET {PAGE_PATH} (page), "
                            f"GET {HEALTH_PATH}, POST {STREAM_PATH}, POST {CHAT_PATH} (the AI SDK's useChat) "
                            f"and POST {AGUI_PATH} (AG-UI)", 404)
        allowed = sorted(methods) + (["OPTIONS"] if self._sites.cors else [])
        if method == "OPTIONS" and self._sites.cors:
            return status_line(204), self._sites.preflight_headers(allowed), []
        handler = methods.get(method)
        if handler is None:
            hint = " (GET runs are off: make_wsgi_app(get_runs=True))" if path == STREAM_PATH and not self.get_runs \
                else ""
            raise HttpError(f"method {method} is not allowed on {path}; use {' or '.join(allowed)}{hint}",
                            405, [("Allow", ", ".join(allowed))])
        return handler(environ)

    # --- routes -------------------------------------------------------------------------
    def _run_route(self, path: str, method: str, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        """``/v1/runs/...``: the same site and authorization checks as a run's start, then the run routes."""
        assert self._runs is not None
        if method == "OPTIONS" and self._sites.cors:
            return status_line(204), self._sites.preflight_headers(["GET", "POST", "OPTIONS"]), []
        if method == "POST":
            self._sites.refuse_post(environ)
        elif path.endswith("/events"):
            self._sites.refuse_get(environ)
        else:  # a status poll may close a lost run or take it over (with this request's environ): this site's only
            self._sites.refuse_other_sites(environ)
        self._check_authorized(environ)
        return self._runs.route(path, method, environ, lambda env: _decode_json(self._read_body(env)))

    def _page_response(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
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

    def _health(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        return json_response(200, {"status": "ok"})

    def _stream_get(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        self._sites.refuse_get(environ)
        self._check_authorized(environ)
        query = parse_qs(_wsgi_text(environ.get("QUERY_STRING", "")), keep_blank_values=True)
        values = query.get("q")
        if not values or not values[0].strip():
            raise HttpError(f"missing query parameter q; use GET {STREAM_PATH}?q=your+question, "
                            f"or POST {STREAM_PATH} with {SEND}", field="q")
        resumed = last_event_id(environ) if self._runs is not None else None
        if self._runs is not None and resumed is not None:  # EventSource reconnecting: the same run, not a new one
            return self._runs.resume(resumed[0], resumed[1], environ)
        if len(values[0].encode("utf-8")) > self.max_body_bytes:
            raise HttpError(f"q is longer than {self.max_body_bytes} bytes; send a shorter question", field="q")
        return self._stream(with_system_prompt([Message(role="user", content=values[0])], self.system_prompt),
                            environ)

    def _stream_post(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        payload = self._checked_body(environ)
        try:
            messages = messages_from_request(payload, system_prompt=self.system_prompt,
                                             trusted=self.trusted_messages, parts=self.parts)
        except RequestRejected as exc:
            raise HttpError(str(exc), field=exc.field) from exc
        return self._stream(messages, environ)

    def _chat_post(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        """``useChat``'s request, answered with the UI message stream of the app's ``ai_sdk_version``.

        With a run log, a request whose last message answers held calls
        (``approval-responded``) continues the chat's parked run instead.
        """
        payload = self._checked_body(environ)
        answers = approval_responses(payload) if self._runs is not None else []
        if answers and self._runs is not None:
            try:
                chat = chat_id(payload)
            except RequestRejected as exc:
                raise HttpError(str(exc), field=exc.field) from exc
            return self._runs.answer_chat(chat, environ, answers, self._chat_render, UI_STREAM_HEADERS)
        try:
            messages = chat_messages(payload, system_prompt=self.system_prompt, parts=self.parts)
            chat = chat_id(payload) if self._runs is not None else ""
        except RequestRejected as exc:
            raise HttpError(str(exc), field=exc.field) from exc
        message_id = f"msg-{uuid.uuid4().hex}"
        if self._runs is not None:  # a run in the log, encoded as the UI message stream as it is read
            version = self.ai_sdk_version
            run = ChatRun(chat, {"message_id": message_id},
                          lambda request: UiLogRender(message_id, version, request), UI_STREAM_HEADERS, version >= 6)
            return self._runs.start(self.engine, messages, environ, self._run_options(environ), self._new_errors(),
                                    run)
        return self._stream(messages, environ,
                            lambda errors: UiMessageStream(errors, message_id, self.ai_sdk_version),
                            UI_STREAM_HEADERS)

    def _chat_resume(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        """``useChat``'s reconnect (``resume: true``): the chat's active run replayed, then live; 204 when none.

        Without a run log no run outlives its request, so the answer is always
        204, "no active stream" (a 404 would show as an error in ``useChat``).
        """
        self._check_authorized(environ)  # it starts nothing: a cross-site page cannot read it without CORS
        if self._runs is None:
            return status_line(204), [("Cache-Control", "no-store")], []
        path = environ.get("PATH_INFO") or ""
        chat = path[len(CHAT_PATH) + 1:-len(RESUME_SUFFIX)]
        return self._runs.resume_chat(chat, environ, self._chat_render, UI_STREAM_HEADERS)

    def _chat_render(self, status: RunStatus, held: Sequence[str], settled: Sequence[str]) -> UiLogRender:
        """A chat run's frames as the UI message stream, on the message the run was started with."""
        message_id = status.meta.get("message_id")
        request_id = status.meta.get("request_id")
        return UiLogRender(message_id if isinstance(message_id, str) else f"msg-{status.run_id}",
                           self.ai_sdk_version, request_id if isinstance(request_id, str) else "?", held, settled)

    def _agui_post(self, environ: WSGIEnvironment) -> Tuple[str, Headers, Iterable[bytes]]:
        """An AG-UI ``RunAgentInput``, answered with AG-UI events.

        With a run log the run is a run in the log, its thread's latest; an
        input with ``resume`` entries answers the thread's held calls and
        continues that run instead.
        """
        payload = self._checked_body(environ)
        try:
            resuming = resume_entries(payload) if self._runs is not None else None
            run = resuming[0] if resuming is not None else \
                run_input(payload, system_prompt=self.system_prompt, parts=self.parts)
        except RequestRejected as exc:
            raise HttpError(str(exc), field=exc.field) from exc
        if self._runs is None:
            return self._stream(run.messages, environ, lambda errors: AgUiStream(errors, run), AGUI_HEADERS)
        thread = f"agui\0{run.thread_id}"  # never a useChat chat's id (printable)
        errors = self._new_errors()
        if resuming is not None:
            return self._runs.answer_chat(thread, environ, resuming[1],
                                          lambda status, held, settled: AgUiLogRender(run, errors.request_id, held),
                                          AGUI_HEADERS)
        logged = ChatRun(thread, {}, lambda request: AgUiLogRender(run, request), AGUI_HEADERS, True)
        return self._runs.start(self.engine, run.messages, environ, self._run_options(environ), errors, logged)

    def _checked_body(self, environ: WSGIEnvironment) -> Any:
        """A POST run's checks before its messages: cross-site, ``authorize``, then the JSON body."""
        self._sites.refuse_post(environ)
        self._check_authorized(environ)
        return _decode_json(self._read_body(environ))

    def _new_errors(self) -> PublicErrors:
        """What a client may learn of its request's failures, under a fresh request id."""
        return PublicErrors(uuid.uuid4().hex[:12], expose=self.expose_errors, logger=self._log)

    def _stream(self, messages: List[Message], environ: WSGIEnvironment, framer: Optional[MakeFramer] = None,
                headers: Optional[Headers] = None) -> Tuple[str, Headers, Iterable[bytes]]:
        """A run answered on this connection; with a run log, a run in the log (the frontends' routes start
        theirs with their own render, so ``framer`` is only for a run without one)."""
        errors = self._new_errors()
        request_id = errors.request_id
        if self._runs is not None:
            return self._runs.start(self.engine, messages, environ, self._run_options(environ), errors)
        release = self._limiter.acquire(environ)
        probe = environ.get("waitress.client_disconnected")
        holder: List[SseResponse] = []

        def closed() -> None:
            release()
            if holder:
                self._stuck.remove(holder[0])

        try:
            response = SseResponse(self.engine, messages, heartbeat_s=self.heartbeat_s,
                                   disconnected=probe if callable(probe) else None, on_close=closed,
                                   errors=errors, logger=self._log, run_options=self._run_options(environ),
                                   drop_connection=connection_dropper(environ),
                                   framer=framer(errors) if framer is not None else None)
        except ConfigError as exc:  # the messages were checked: the engine refuses them (or is closed)
            release()
            raise engine_refusal(exc) from exc
        except BaseException:
            release()
            raise
        holder.append(response)
        self._stuck.add(response)
        self._log.info("request {}: stream started for {}", request_id, environ.get("REMOTE_ADDR", "?"))
        return status_line(200), [*(headers if headers is not None else SSE_HEADERS),
                                  ("X-Request-Id", request_id)], response

    # --- request checks ---------------------------------------------------------------------
    def _check_authorized(self, environ: WSGIEnvironment) -> None:
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

    def _run_options(self, environ: WSGIEnvironment) -> RunOptions:
        """The run's ``approve`` (the app's, asked with this request's environ) and ``conversation_id``."""
        options: RunOptions = {}
        approve = self._approve
        if approve is not None:
            options["approve"] = lambda call: approve(call, environ)
        if self._scope is None:
            return options
        try:
            scope = self._scope(environ)
            if scope is not None and (not isinstance(scope, str) or not scope.strip()):
                raise TypeError(f"the scope hook must return a non-empty str or None, got {scope!r}")
            options["conversation_id"] = scope
            return options
        except Exception as exc:
            request_id = uuid.uuid4().hex[:12]
            self._log.opt(exception=exc).error("request {}: the scope hook failed: {}", request_id, exc)
            raise HttpError(f"the request's scope could not be determined (request id {request_id}); try again "
                            "later or ask the operator to look at the server log", 500) from exc

    def _read_body(self, environ: WSGIEnvironment) -> bytes:
        media_type = (environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise HttpError(f"Content-Type must be application/json, got {media_type or 'none'!r}; {SEND}",
                            field="Content-Type")
        raw_length = (environ.get("CONTENT_LENGTH") or "").strip()
        try:
            length = int(raw_length) if raw_length else 0
        except ValueError as exc:
            raise HttpError(f"invalid Content-Length {raw_length!r}; {SEND}", field="Content-Length") from exc
        if length > self.body_limit:
            raise HttpError(f"body too large: {length} bytes, the limit is {self.body_limit}; "
                            "send fewer or shorter messages", field="body")
        if length <= 0:
            raise HttpError(f"empty body; {SEND}", field="body")
        stream: InputStream = environ["wsgi.input"]
        body = stream.read(length)
        if len(body) < length:
            raise HttpError(f"body ended after {len(body)} of {length} bytes; resend the request", field="body")
        return body


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


def _wsgi_text(native: str) -> str:
    """A PEP 3333 native string holds the raw bytes as latin-1; raw (unescaped) UTF-8 is decoded."""
    try:
        return native.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a server that already decoded it
        return native


def _check_approve(engine: EngineLike, approve: Optional[Approve]) -> None:
    """``approve`` is a function, and the engine's runs take it (one that would not must not serve unasked)."""
    if approve is None:
        return
    if not callable(approve):
        raise ConfigError(f"approve must be a function (call, environ) -> bool, got {type(approve).__name__}")
    run = engine.run
    try:
        parameters = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature cannot be read: its first run will tell
        return
    if not any(p.name == "approve" or p.kind is p.VAR_KEYWORD for p in parameters):
        raise ConfigError(f"approve= needs an engine whose run() takes approve= (StreamingEngine does); "
                          f"{type(engine).__name__}.run does not")


#: ``make_wsgi_app(engine, **options)`` is the app's documented name; the
#: class is the one place its options and their defaults are written.
make_wsgi_app = StreamApp
