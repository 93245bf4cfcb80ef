"""The WSGI/SSE app's stable import path; the code lives in :mod:`streamengine.web`.

``from streamengine.wsgi import make_wsgi_app, mount, messages_from_request``
keeps working whatever the package's inner layout.  Deployment (threads per
stream, limits, auth hooks, Flask/Django): docs/deployment.md.
"""
from __future__ import annotations

from .web import (
    STREAM_PATH,
    PublicErrors,
    RequestRejected,
    SseResponse,
    StreamApp,
    client_address,
    encode_stream,
    make_wsgi_app,
    messages_from_request,
    mount,
)

__all__ = [
    "PublicErrors", "RequestRejected", "STREAM_PATH", "SseResponse", "StreamApp", "client_address",
    "encode_stream", "make_wsgi_app", "messages_from_request", "mount",
]
