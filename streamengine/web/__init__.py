"""The engine over the web: a WSGI app serving Server-Sent Events, and SSE for your own framework.

``make_wsgi_app(engine)`` is the whole app (page, stream, health check);
``serve(engine)`` runs it under waitress with limits fit for the internet;
``mount`` puts it under a prefix beside Flask or Django; ``encode_stream``
with ``PublicErrors`` turns ``engine.run()`` into SSE frames inside a view of
your own; ``messages_from_request`` reads a browser's conversation the way
the app does.  The same app speaks the frontends' own protocols:
``POST /api/chat`` (``CHAT_PATH``) answers the AI SDK's ``useChat`` with its
UI message stream, ``POST /agui`` (``AGUI_PATH``) an AG-UI client
(docs/frontends.md).

Modules (private): ``_app`` (routes, checks in order, the page), ``_guard``
(which messages a request may bring, Host check, cross-site, authorize,
stream limits, JSON refusals), ``_frames`` (engine events as SSE frames),
``_sse`` (what a browser may learn of a failure; one stream: batching,
cancel on disconnect, stuck readers), ``_serve`` (waitress: ``serve``, and
the CLI's), ``_parts`` (``PartsPolicy``: which images, audio and files a
request may bring), ``_aisdk`` (the AI SDK's UI message stream), ``_agui``
(AG-UI), ``_runs`` (the routes of runs in a log: resume, stop, status,
approvals) and ``_producer`` (one run driven into its log; a log read back
by a frontend's framer).
"""
from __future__ import annotations

from ._app import AGUI_PATH as AGUI_PATH
from ._app import CHAT_PATH as CHAT_PATH
from ._app import STREAM_PATH as STREAM_PATH
from ._app import AppOptions as AppOptions
from ._app import StreamApp as StreamApp
from ._app import WsgiApp as WsgiApp
from ._app import make_wsgi_app as make_wsgi_app
from ._app import mount as mount
from ._guard import RequestRejected as RequestRejected
from ._guard import client_address as client_address
from ._guard import messages_from_request as messages_from_request
from ._parts import PartsPolicy as PartsPolicy
from ._serve import serve as serve
from ._sse import EngineLike as EngineLike
from ._sse import PublicErrors as PublicErrors
from ._sse import RunOptions as RunOptions
from ._sse import SseResponse as SseResponse
from ._sse import encode_stream as encode_stream

__all__ = [
    "AGUI_PATH", "AppOptions", "CHAT_PATH", "EngineLike", "PartsPolicy", "PublicErrors", "RequestRejected",
    "RunOptions", "STREAM_PATH", "SseResponse", "StreamApp", "WsgiApp", "client_address", "encode_stream",
    "make_wsgi_app", "messages_from_request", "mount", "serve",
]
