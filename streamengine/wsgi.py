"""The WSGI/SSE app's stable import path; the code lives in :mod:`streamengine.web`.

``from streamengine.wsgi import make_wsgi_app, mount, messages_from_request``
keeps working whatever the package's inner layout.  Deployment (threads per
stream, limits, auth hooks, Flask/Django): docs/deployment.md.
"""
from __future__ import annotations

from .web import AGUI_PATH as AGUI_PATH
from .web import CHAT_PATH as CHAT_PATH
from .web import STREAM_PATH as STREAM_PATH
from .web import PartsPolicy as PartsPolicy
from .web import PublicErrors as PublicErrors
from .web import RequestRejected as RequestRejected
from .web import SseResponse as SseResponse
from .web import StreamApp as StreamApp
from .web import client_address as client_address
from .web import encode_stream as encode_stream
from .web import make_wsgi_app as make_wsgi_app
from .web import messages_from_request as messages_from_request
from .web import mount as mount

__all__ = [
    "AGUI_PATH", "CHAT_PATH", "PartsPolicy", "PublicErrors", "RequestRejected", "STREAM_PATH", "SseResponse",
    "StreamApp", "client_address", "encode_stream", "make_wsgi_app", "messages_from_request", "mount",
]
