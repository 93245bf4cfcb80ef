"""The engine as a PEP 3333 WSGI app: Server-Sent Events to a browser, standard library only.

Routes (relative to where the app is mounted, ``SCRIPT_NAME``)::

    GET  /                     a self-contained page (inline CSS/JS, no external assets)
    GET  /healthz              {"status": "ok"}
    POST /v1/chat/stream       body {"messages": [{"role": "user", "content": "..."}, ...]}
    GET  /v1/chat/stream?q=…   the same for one user message (what EventSource can send)
    OPTIONS <any route>        CORS preflight, only when ``allow_origin`` is set

A stream answers ``200 text/event-stream`` at once with ``: ok``, then one frame
per engine event (see :mod:`streamengine.sse`) and ``data: [DONE]`` last.

Why it is built this way:

* **A disconnect must cancel the run.**  PEP 3333 servers call the response
  iterable's ``close()`` when the client has gone away (or after the last
  frame); :meth:`SseResponse.close` closes the engine's event generator, which
  shuts the provider's socket down, cancels the tools and ends the run's
  threads.  A server only *notices* a disconnect when a write fails, so the
  stream writes ``: ping`` every ``heartbeat_s`` while the model and tools are
  silent.  Under waitress the app also polls ``waitress.client_disconnected``
  a few times a second, which turns the notice into a fraction of a second
  once waitress knows the socket is dead (see below).
* **Nothing is buffered**: no ``Content-Length``, ``Cache-Control: no-cache``
  and ``X-Accel-Buffering: no`` (nginx), so each frame leaves when it is made.
  Do not put a gzip middleware in front of the stream.
* **Bad requests fail before the stream starts**, with a 400 JSON body that
  names the problem and what to send; once the 200 is out, errors travel as an
  ``event: error`` frame followed by ``[DONE]`` (``sse.encode_stream``).
* **The page is hostile-text safe**: tokens are inserted as text, never HTML,
  and the page is served with a Content-Security-Policy that allows only its
  own inline script and style (by hash) and connections to its own origin.
* **Other sites cannot start runs**: a run costs money and may call tools, so a
  browser request that says (``Sec-Fetch-Site``) it comes from another site
  gets a 403 unless ``allow_origin`` admits its origin, and a link from
  another site to ``/?autorun=...`` only fills the prompt box.

Deploying — every open stream holds one server thread for its whole length:

* **waitress**: ``threads=`` must exceed the number of concurrent streams
  (the default, 4, is full with four open browser tabs).  Add
  ``channel_request_lookahead=1`` so waitress keeps reading the socket while a
  stream runs: it then sees a closed tab at once and the run is cancelled
  within 0.25 s, where otherwise it takes two to three heartbeats (the first
  write after the close still succeeds; the second fails)::

      waitress.serve(app, host="127.0.0.1", port=8000, threads=64,
                     channel_request_lookahead=1)

* **Next to Flask or Django**: ``mount(host_app, "/chat", make_wsgi_app(engine))``
  serves this app under ``/chat`` and everything else from the host app.

* **gunicorn**: use ``--worker-class gthread --threads 64``; the default sync
  worker kills any response that lasts longer than ``--timeout`` (30 s), i.e.
  any long answer.
* **Behind a proxy**: disable response buffering and gzip for
  ``/v1/chat/stream`` and raise its read timeout above ``heartbeat_s``.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import pkgutil
import re
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, Tuple, Union, cast
from urllib.parse import parse_qs

from .cancel import CancelToken
from .errors import ConfigError
from .events import HeartbeatEvent
from .logs import component_logger
from .messages import Message, as_message
from .sse import encode_stream
from .text import json_type as _json_type

__all__ = ["STREAM_PATH", "SseResponse", "StreamApp", "make_wsgi_app", "mount"]

STREAM_PATH = "/v1/chat/stream"
HEALTH_PATH = "/healthz"
PAGE_PATH = "/"

StartResponse = Callable[..., Any]
Headers = List[Tuple[str, str]]
Probe = Callable[[], bool]

#: How often an idle stream asks the server whether its client is gone, when
#: the server can tell (waitress).  Cheap: one attribute read per stream per tick.
_PROBE_S = 0.25

_JSON = "application/json; charset=utf-8"
_STATUS = {200: "200 OK", 204: "204 No Content", 400: "400 Bad Request", 403: "403 Forbidden", 404: "404 Not Found",
           405: "405 Method Not Allowed", 503: "503 Service Unavailable"}
_SEND = 'send {"messages": [{"role": "user", "content": "..."}]}'
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+$")


def make_wsgi_app(engine: Any, *, allow_origin: Union[None, str, Iterable[str]] = None,
                  heartbeat_s: Optional[float] = 15.0, max_body_bytes: int = 1_000_000) -> "StreamApp":
    """A WSGI app serving ``engine`` (a :class:`~streamengine.engine.StreamingEngine`).

    ``allow_origin``: ``"*"``, one origin (``"https://app.example"``) or a
    collection of origins (the request's ``Origin`` is echoed when listed) —
    adds CORS headers and answers ``OPTIONS`` preflights; ``None`` = same
    origin only.  ``heartbeat_s``: seconds of silence before a ``: ping``
    (``None`` disables heartbeats, and with them disconnect detection while
    the run is silent).  ``max_body_bytes`` caps a POST body (and a ``q``).
    """
    return StreamApp(engine, allow_origin=allow_origin, heartbeat_s=heartbeat_s,
                     max_body_bytes=max_body_bytes)


class _HttpError(Exception):
    """A request refused before streaming (4xx/5xx); ``str()`` is the JSON error sent back."""

    def __init__(self, message: str, status: int = 400, headers: Sequence[Tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


class StreamApp:
    """The WSGI callable; one instance serves any number of concurrent streams."""

    def __init__(self, engine: Any, *, allow_origin: Union[None, str, Iterable[str]] = None,
                 heartbeat_s: Optional[float] = 15.0, max_body_bytes: int = 1_000_000) -> None:
        if not callable(getattr(engine, "run", None)):
            raise ConfigError(f"make_wsgi_app needs a StreamingEngine (something with .run()), "
                              f"got {type(engine).__name__}")
        self.engine = engine
        self.heartbeat_s = _check_heartbeat(heartbeat_s)
        if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
        self.max_body_bytes = max_body_bytes
        self._origins = _check_origins(allow_origin)
        self._page, self._page_csp = _load_page()
        self._log = component_logger("streamengine.wsgi.StreamApp")
        self._active = 0
        self._active_lock = threading.Lock()
        self._routes: Dict[str, Dict[str, Callable[[dict], Tuple[str, Headers, Iterable[bytes]]]]] = {
            PAGE_PATH: {"GET": self._page_response},
            HEALTH_PATH: {"GET": self._health},
            STREAM_PATH: {"GET": self._stream_get, "POST": self._stream_post},
        }

    @property
    def active_streams(self) -> int:
        """Streams started and not yet closed (for health pages and leak tests)."""
        return self._active

    # --- WSGI -------------------------------------------------------------------------
    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET").upper()
        cors = self._cors_headers(environ)
        try:
            status, headers, body = self._dispatch(path, method, environ)
        except _HttpError as exc:
            status, headers, body = _json_response(exc.status, {"error": str(exc)}, exc.headers)
        start_response(status, headers + cors)
        return body

    def _dispatch(self, path: str, method: str, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        methods = self._routes.get(path)
        if methods is None:
            raise _HttpError(f"no such path {path!r}; this app serves GET {PAGE_PATH} (page), "
                             f"GET {HEALTH_PATH}, and GET or POST {STREAM_PATH}", 404)
        allowed = sorted(methods) + (["OPTIONS"] if self._origins is not None else [])
        if method == "OPTIONS" and self._origins is not None:
            return _STATUS[204], self._preflight_headers(allowed), []
        handler = methods.get(method)
        if handler is None:
            raise _HttpError(f"method {method} is not allowed on {path}; use {' or '.join(allowed)}",
                             405, [("Allow", ", ".join(allowed))])
        return handler(environ)

    # --- routes -------------------------------------------------------------------------
    def _page_response(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        stream_url = (environ.get("SCRIPT_NAME") or "").rstrip("/") + STREAM_PATH
        # ?autorun=PROMPT starts a run on load; a link from another site may only fill the box.
        autorun = "off" if _cross_site(environ) else "on"
        body = (self._page.replace("__STREAM_URL__", html.escape(stream_url, quote=True))
                .replace("__AUTORUN__", autorun).encode("utf-8"))
        return _STATUS[200], [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-cache"),
            ("Content-Security-Policy", self._page_csp),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ], [body]

    def _health(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        return _json_response(200, {"status": "ok"})

    def _stream_get(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        self._refuse_cross_site(environ)
        query = parse_qs(_wsgi_text(environ.get("QUERY_STRING", "")), keep_blank_values=True)
        values = query.get("q")
        if not values or not values[0].strip():
            raise _HttpError(f"missing query parameter q; use GET {STREAM_PATH}?q=your+question, "
                             f"or POST {STREAM_PATH} with {_SEND}")
        if len(values[0].encode("utf-8")) > self.max_body_bytes:
            raise _HttpError(f"q is longer than {self.max_body_bytes} bytes; send a shorter question")
        return self._stream([Message(role="user", content=values[0])], environ)

    def _stream_post(self, environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        self._refuse_cross_site(environ)
        return self._stream(_parse_messages(self._read_body(environ)), environ)

    def _stream(self, messages: List[Message], environ: dict) -> Tuple[str, Headers, Iterable[bytes]]:
        probe = environ.get("waitress.client_disconnected")
        probe = probe if callable(probe) else None
        try:
            response = SseResponse(self.engine, messages, heartbeat_s=self.heartbeat_s, disconnected=probe,
                                   on_close=self._stream_closed, logger=self._log)
        except ConfigError as exc:  # the messages were checked: this is the engine refusing (closed)
            raise _HttpError(f"the engine cannot take requests: {exc}", 503) from exc
        with self._active_lock:
            self._active += 1
        return _STATUS[200], [
            ("Content-Type", "text/event-stream; charset=utf-8"),
            ("Cache-Control", "no-cache"),
            ("X-Accel-Buffering", "no"),
        ], response

    def _stream_closed(self) -> None:
        with self._active_lock:
            self._active -= 1

    # --- request body -----------------------------------------------------------------------
    def _read_body(self, environ: dict) -> bytes:
        media_type = (environ.get("CONTENT_TYPE") or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise _HttpError(f"Content-Type must be application/json, got {media_type or 'none'!r}; {_SEND}")
        raw_length = (environ.get("CONTENT_LENGTH") or "").strip()
        try:
            length = int(raw_length) if raw_length else 0
        except ValueError:
            raise _HttpError(f"invalid Content-Length {raw_length!r}; {_SEND}") from None
        if length > self.max_body_bytes:
            raise _HttpError(f"body too large: {length} bytes, the limit is {self.max_body_bytes}; "
                             "send fewer or shorter messages")
        if length <= 0:
            raise _HttpError(f"empty body; {_SEND}")
        body = environ["wsgi.input"].read(length)
        if len(body) < length:
            raise _HttpError(f"body ended after {len(body)} of {length} bytes; resend the request")
        return body

    # --- cross-site requests and CORS ---------------------------------------------------------
    def _refuse_cross_site(self, environ: dict) -> None:
        """Another site may start a run only if ``allow_origin`` lets its origin in.

        A run costs money and may call tools, and a GET needs no preflight: any
        page could start one with ``<img src=".../v1/chat/stream?q=...">`` from a
        visitor's browser (inside their network, with their cookies).  Browsers
        say where a request comes from in ``Sec-Fetch-Site``; clients that are
        not browsers send no such header and are not affected.
        """
        site = _cross_site(environ)
        if not site:
            return
        origin = environ.get("HTTP_ORIGIN", "")
        if self._origin_allowed(origin):
            return
        source = f" from {origin}" if origin else ""
        raise _HttpError(f"refused a {site} request{source}: another site may not start runs here; to allow "
                         "one, pass its origin as make_wsgi_app(engine, allow_origin=[...])", 403)

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


class SseResponse:
    """The response iterable of one stream: frames out, and ``close()`` cancels the run.

    ``close()`` may come from the server after the last frame, after a failed
    write (the client went away), or from another thread while a frame is
    being produced; in the last case generator ``close()`` is not allowed, so
    the run is stopped through its cancel token, which works from any thread.
    """

    def __init__(self, engine: Any, messages: Sequence[Message], *, heartbeat_s: Optional[float],
                 disconnected: Optional[Probe] = None, on_close: Optional[Callable[[], None]] = None,
                 logger: Any = None) -> None:
        self._cancel = CancelToken()
        tick = heartbeat_s
        if disconnected is not None:
            tick = _PROBE_S if heartbeat_s is None else min(heartbeat_s, _PROBE_S)
        # run() checks the messages and the engine eagerly: a ConfigError here is still a 4xx/5xx.
        events = engine.run(messages, self._cancel, heartbeat_s=tick)
        # encode_stream returns a generator (its docs promise close()), though it is annotated Iterator.
        frames = encode_stream(_paced(events, heartbeat_s, disconnected))
        self._frames = cast("Generator[bytes, None, None]", frames)
        self._on_close = on_close
        self._log = logger if logger is not None else component_logger("streamengine.wsgi.SseResponse")
        self._started = time.monotonic()
        self._frames_sent = 0
        self._finished = False
        self._closed = False

    def __iter__(self) -> "SseResponse":
        return self

    def __next__(self) -> bytes:
        if not self._closed:
            try:
                frame = next(self._frames)
            except StopIteration:
                self._finished = True
                raise
            if not self._closed:
                self._frames_sent += 1
                return frame
        # Closed, maybe from another thread while next() ran: finish the generators here,
        # in the iterating thread, where closing them is allowed.
        self._frames.close()
        raise StopIteration

    def close(self) -> None:
        """End the run (if still going) and free everything it holds; idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._log.info("stream closed by the server after {} frames and {:.3f}s (client gone?); "
                           "cancelling the run", self._frames_sent, time.monotonic() - self._started)
            self._cancel.set()
        try:
            self._frames.close()
        except ValueError:  # being iterated in another thread: the cancel token ends that run
            pass
        finally:
            if self._on_close is not None:
                self._on_close()


def _paced(events: Iterator[Any], heartbeat_s: Optional[float], disconnected: Optional[Probe]) -> Iterator[Any]:
    """Pass events through; drop heartbeats that come sooner than ``heartbeat_s`` after a write.

    The engine is asked for heartbeats more often than the wire gets pings so
    that the server's disconnect probe is consulted a few times a second; a
    stream whose client is gone ends here, and closing this generator closes
    the engine's.
    """
    last_write = time.monotonic()
    try:
        for event in events:
            if disconnected is not None and disconnected():
                return
            if isinstance(event, HeartbeatEvent):
                if heartbeat_s is None or time.monotonic() - last_write < heartbeat_s:
                    continue
            yield event
            last_write = time.monotonic()
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def mount(host_app: Callable[..., Iterable[bytes]], prefix: str,
          app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
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

    def dispatch(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or ""
        if path == prefix or path.startswith(prefix + "/"):
            environ = dict(environ, SCRIPT_NAME=(environ.get("SCRIPT_NAME") or "") + prefix,
                           PATH_INFO=path[len(prefix):])
            return app(environ, start_response)
        return host_app(environ, start_response)

    return dispatch


# --- helpers ----------------------------------------------------------------------------------

def _parse_messages(body: bytes) -> List[Message]:
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _HttpError(f"body is not UTF-8 ({exc.reason} at byte {exc.start}); {_SEND}") from None
    except RecursionError:
        raise _HttpError(f"body is nested too deeply to parse; {_SEND}") from None
    except ValueError as exc:
        raise _HttpError(f"body is not valid JSON ({str(exc)[:200]}); {_SEND}") from None
    if not isinstance(payload, dict):
        raise _HttpError(f"body must be a JSON object, got {_json_type(payload)}; {_SEND}")
    if "messages" not in payload:
        raise _HttpError(f"body has no \"messages\" field; {_SEND}")
    messages = payload["messages"]
    if not isinstance(messages, list):
        raise _HttpError(f"\"messages\" must be a list, got {_json_type(messages)}; {_SEND}")
    if not messages:
        raise _HttpError(f"\"messages\" is empty; {_SEND}")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _HttpError(f"messages[{i}] must be an object, got {_json_type(message)}; {_SEND}")
        missing = [key for key in ("role", "content") if key not in message]
        if missing:
            raise _HttpError(f"messages[{i}] has no {' or '.join(repr(k) for k in missing)}; each message "
                             "needs \"role\" (system, user, assistant or tool) and \"content\"")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            raise _HttpError(f"messages[{i}].tool_calls must be a list of objects; send null or "
                             '[{"id": "...", "function": {"name": "...", "arguments": "{}"}}]')
        try:
            parsed.append(as_message(message))
        except (ConfigError, TypeError, ValueError, AttributeError) as exc:  # the last three: odd tool_calls
            raise _HttpError(f"messages[{i}] is invalid: {_clip(str(exc), 300)}; {_SEND}") from None
    try:
        _require_unicode("messages", messages)
    except RecursionError:
        raise _HttpError(f"messages are nested too deeply; {_SEND}") from None
    return parsed


def _require_unicode(where: str, value: Any) -> None:
    """Refuse unpaired surrogates anywhere in the messages.

    JSON may carry ``\\ud83d`` alone; that is not text, has no UTF-8 form, and
    would only fail the provider request mid-run instead of here.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _HttpError(f"{where} contains an unpaired surrogate (\\u{ord(value[exc.start]):04x} at "
                             f"position {exc.start}); send valid Unicode text") from None
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _require_unicode(f"{where}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _require_unicode(f"{where} key", key)
            _require_unicode(f"{where}.{key}", item)


def _cross_site(environ: dict) -> str:
    """``"cross-site"`` or ``"same-site"`` when a browser says the request comes from elsewhere, else ``""``."""
    site = environ.get("HTTP_SEC_FETCH_SITE", "")
    return site if site in ("cross-site", "same-site") else ""


def _wsgi_text(native: str) -> str:
    """A PEP 3333 native string holds the raw bytes as latin-1; raw (unescaped) UTF-8 is decoded."""
    try:
        return native.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a server that already decoded it
        return native


def _clip(text: str, limit: int) -> str:
    """Errors quote what was sent; a megabyte of it helps nobody."""
    return text if len(text) <= limit else text[:limit - 1] + "…"



def _json_response(status: int, payload: Dict[str, Any],
                   headers: Sequence[Tuple[str, str]] = ()) -> Tuple[str, Headers, List[bytes]]:
    body = json.dumps(payload, ensure_ascii=True).encode("ascii")
    return _STATUS[status], [("Content-Type", _JSON), ("Content-Length", str(len(body)))] + list(headers), [body]


def _check_heartbeat(heartbeat_s: Optional[float]) -> Optional[float]:
    if heartbeat_s is None:
        return None
    if isinstance(heartbeat_s, bool) or not isinstance(heartbeat_s, (int, float)) \
            or not heartbeat_s > 0 or not math.isfinite(heartbeat_s):
        raise ConfigError(f"heartbeat_s must be a positive number of seconds or None, got {heartbeat_s!r}")
    return float(heartbeat_s)


def _check_origins(allow_origin: Union[None, str, Iterable[str]]) -> Union[None, str, frozenset]:
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


_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


def _load_page() -> Tuple[str, str]:
    """The page and a CSP allowing exactly its inline script and style (by SHA-256)."""
    data = pkgutil.get_data(__package__, "static/index.html")
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
