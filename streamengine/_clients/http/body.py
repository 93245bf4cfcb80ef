"""Reading an HTTP response body as it arrives, boundedly, and giving the connection back.

The body is read with ``read1``: it returns whatever has arrived, on chunked,
close-delimited and Content-Length bodies alike, where
``requests.Response.iter_content(n)`` would wait to fill ``n`` bytes.
"""
from __future__ import annotations

import http.client
import threading
from typing import Callable, List, Optional

import requests
import urllib3.exceptions

from .sse_read import read1_iter
from ..._errors import LlmProtocolError
from .connection import RequestTracker

__all__ = ["READ_SIZE", "STREAM_ERRORS", "cancelled", "drain_after_done", "excerpt", "read1_of", "read_limited"]

READ_SIZE = 65536
#: What reading or sending may raise underneath requests: all become streamengine errors.
STREAM_ERRORS = (
    requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
)


def cancelled(cancel: Optional[threading.Event], tracker: RequestTracker) -> bool:
    return tracker.aborted or (cancel is not None and cancel.is_set())


def read1_of(resp: requests.Response) -> Callable[[int], bytes]:
    """``read1`` of the body: returns what has arrived instead of waiting to fill a buffer.

    urllib3 >= 2 has it (decoding any content encoding); on urllib3 1.x the
    http.client response underneath has it (we ask for no encoding).
    """
    raw = resp.raw
    if hasattr(raw, "read1"):
        return lambda n: raw.read1(n, decode_content=True)
    fp = getattr(raw, "_fp", None)
    if fp is not None and hasattr(fp, "read1"):
        return fp.read1
    return raw.read  # last resort: correct, but may wait for a full buffer


#: After ``[DONE]``, how long to wait for the rest of the body (a chunked body's
#: ``0\r\n\r\n``) so the connection can be reused.  It is nearly always there
#: already; a provider that holds the body open after [DONE] costs this once,
#: and its connection is closed instead of reused.
DRAIN_AFTER_DONE_S = 0.05
DRAIN_AFTER_DONE_BYTES = 64 * 1024


def drain_after_done(resp: requests.Response, tracker: RequestTracker) -> bool:
    """Read what follows ``[DONE]`` (briefly, boundedly) so urllib3 can pool the connection.

    Closing a chunked response before its terminating chunk closes the
    connection: every streamed call would pay a new TCP (and TLS) handshake.
    Returns True when the body ended and the connection went back to the pool.
    """
    tracker.set_read_timeout(DRAIN_AFTER_DONE_S)
    read1 = read1_of(resp)
    drained = 0
    try:
        while drained <= DRAIN_AFTER_DONE_BYTES:
            data = read1(READ_SIZE)
            if not data:
                return True
            drained += len(data)
    except STREAM_ERRORS:
        pass  # timed out or broke after [DONE]: the answer is complete; the connection is closed
    return False


def excerpt(resp: requests.Response, limit: int = 300) -> str:
    """The start of a body for an error message; unreadable is not a second error."""
    try:
        return read_limited(resp, limit, truncate=True).decode("utf-8", errors="replace")
    except STREAM_ERRORS as exc:
        return f"<body unreadable: {exc}>"


def read_limited(resp: requests.Response, limit: int, truncate: bool) -> bytes:
    """Read the body up to ``limit`` bytes; over it, cut (``truncate``) or refuse."""
    parts: List[bytes] = []
    size = 0
    for data in read1_iter(read1_of(resp), READ_SIZE):
        parts.append(data)
        size += len(data)
        if size > limit:
            if truncate:
                break
            raise LlmProtocolError(
                f"the answer from {resp.url} is over {limit} bytes; refusing to buffer it"
            )
    return b"".join(parts)[:limit]
