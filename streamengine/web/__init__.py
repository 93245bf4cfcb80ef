"""The engine as a WSGI app serving Server-Sent Events; see :mod:`.app` for routes and options.

Modules: ``app`` (routes, checks, make_wsgi_app), ``policy`` (which messages a
request may bring), ``guard`` (Host check, authorize, stream limits),
``response`` (one stream: batching, cancel on disconnect, stuck readers),
``mount`` (under a prefix next to Flask/Django), ``http`` (JSON refusals).
"""
from __future__ import annotations

from .app import STREAM_PATH, StreamApp, make_wsgi_app
from .guard import client_address
from .mount import mount
from .policy import RequestRejected, messages_from_request
from .response import SseResponse

__all__ = ["STREAM_PATH", "RequestRejected", "SseResponse", "StreamApp", "client_address", "make_wsgi_app",
           "messages_from_request", "mount"]
