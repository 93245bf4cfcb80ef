"""Abort an HTTP request from another thread, even before its response headers.

Why this exists: a thread blocked in a socket read cannot be interrupted by
closing the ``requests`` response from another thread (measured: the read
returned only when the server closed, 10 s later).  ``shutdown(SHUT_RDWR)``
on the underlying socket unblocks it at once.  The socket, though, is buried
in urllib3's pool and only reachable through the response -- which does not
exist yet while we wait for the headers.

So :class:`CancellableAdapter` installs pool and connection classes that
hand every connection they use to the :class:`RequestTracker` of the request
in progress (found through :func:`tracking`, a thread-local context set around
``session.request``).  :meth:`RequestTracker.abort` then shuts down whatever
socket the request holds at that moment, and a connection that is still
connecting is shut down the moment its socket exists.

Limits: a TCP connect (or TLS handshake) already in progress is not
interrupted; it ends at the connect timeout, and is then shut down at once.
SOCKS proxies use other connection classes and are not tracked.
"""
from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any, Iterator, List, Optional, Sequence

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["CancellableAdapter", "RequestTracker", "mount_cancellable", "tracking"]

_local = threading.local()


class RequestTracker:
    """The connections one request is using, so another thread can abort them.

    A connection is tracked from the moment the pool hands it out until it
    goes back to the pool, so an abort can never reach a connection that
    another request is using by then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: List["_TrackedMixin"] = []
        self._aborted = False

    @property
    def aborted(self) -> bool:
        return self._aborted

    def abort(self) -> None:
        """Shut down every socket of this request now; later ones at birth."""
        with self._lock:
            self._aborted = True
            connections = list(self._connections)
        for conn in connections:
            conn._se_shutdown()

    def release(self) -> None:
        """The request is over: forget its connections (an abort then does nothing)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            if conn._se_tracker is self:
                conn._se_tracker = None

    def _attach(self, conn: "_TrackedMixin") -> None:
        with self._lock:
            if conn not in self._connections:
                self._connections.append(conn)
            conn._se_tracker = self
            aborted = self._aborted
        if aborted:
            conn._se_shutdown()

    def _detach(self, conn: "_TrackedMixin") -> None:
        with self._lock:
            try:
                self._connections.remove(conn)
            except ValueError:
                pass
            if conn._se_tracker is self:
                conn._se_tracker = None


@contextlib.contextmanager
def tracking(tracker: Optional[RequestTracker]) -> Iterator[Optional[RequestTracker]]:
    """Route the connections this thread takes from a cancellable pool to ``tracker``.

    Wrap only the call that sends the request (``session.post(..., stream=True)``):
    the connection stays tracked until it returns to the pool.
    """
    previous = getattr(_local, "tracker", None)
    _local.tracker = tracker
    try:
        yield tracker
    finally:
        _local.tracker = previous


def _current_tracker() -> Optional[RequestTracker]:
    return getattr(_local, "tracker", None)


def _shutdown_socket(sock: Any) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops
    # the SSL object that the reading thread is using at this very moment.
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError, ValueError):
        pass  # already closed or never connected: nothing left to unblock


class _TrackedMixin:
    """Connection behaviour: report to the tracker and shut down on request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._se_tracker: Optional[RequestTracker] = None
        # The socket of the current connection, kept even after http.client
        # drops ``self.sock``: on a ``Connection: close`` answer it hands the
        # socket over to the response, which is exactly where reads block.
        self._se_sock: Any = None
        self._se_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:  # type: ignore[override]
        sock = super()._new_conn()  # type: ignore[misc]
        self._se_sock = sock  # reachable during a TLS handshake too
        tracker = self._se_tracker
        if tracker is not None and tracker.aborted:
            _shutdown_socket(sock)
        return sock

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._se_sock = self.sock  # the TLS socket, once wrapped
        tracker = self._se_tracker
        if tracker is not None and tracker.aborted:
            self._se_shutdown()

    def _se_shutdown(self) -> None:
        with self._se_lock:
            sock = getattr(self, "sock", None)
            _shutdown_socket(sock)
            if self._se_sock is not sock:
                _shutdown_socket(self._se_sock)

    def close(self) -> None:
        # Under the lock so an abort never shuts down a descriptor number
        # that close() has just freed for reuse by another socket.
        with self._se_lock:
            super().close()  # type: ignore[misc]


class TrackedHTTPConnection(_TrackedMixin, HTTPConnection):
    """An urllib3 HTTP connection that a :class:`RequestTracker` can abort."""


class TrackedHTTPSConnection(_TrackedMixin, HTTPSConnection):
    """An urllib3 HTTPS connection that a :class:`RequestTracker` can abort."""


class _TrackedPoolMixin:
    def _get_conn(self, timeout: Optional[float] = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        tracker = _current_tracker()
        if tracker is not None and isinstance(conn, _TrackedMixin):
            tracker._attach(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if isinstance(conn, _TrackedMixin):
            tracker = conn._se_tracker
            if tracker is not None:
                tracker._detach(conn)
        super()._put_conn(conn)  # type: ignore[misc]


class TrackedHTTPConnectionPool(_TrackedPoolMixin, HTTPConnectionPool):
    ConnectionCls = TrackedHTTPConnection


class TrackedHTTPSConnectionPool(_TrackedPoolMixin, HTTPSConnectionPool):
    ConnectionCls = TrackedHTTPSConnection


_POOL_CLASSES = {"http": TrackedHTTPConnectionPool, "https": TrackedHTTPSConnectionPool}


class CancellableAdapter(HTTPAdapter):
    """A requests adapter whose connections can be aborted via :class:`RequestTracker`.

    Behaves exactly like :class:`requests.adapters.HTTPAdapter` otherwise.
    """

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOL_CLASSES)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if hasattr(manager, "pool_classes_by_scheme") and not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(_POOL_CLASSES)
        return manager


# Many concurrent streams (an SSE server) would overflow requests' default of
# 10 pooled connections per host, and urllib3 warns on every overflow.
POOL_MAXSIZE = 64


def mount_cancellable(session: requests.Session, prefixes: Sequence[str] = ("http://", "https://")) -> None:
    """Mount a :class:`CancellableAdapter` on ``session`` for each prefix.

    A prefix already served by a cancellable adapter is left alone, so calling
    this twice (or on a session the user prepared) costs nothing.
    """
    for prefix in prefixes:
        current = session.adapters.get(prefix)
        if not isinstance(current, CancellableAdapter):
            session.mount(prefix, CancellableAdapter(pool_maxsize=POOL_MAXSIZE))
