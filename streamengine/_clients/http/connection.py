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
socket the request holds at that moment.

The TCP connect is made here, not by urllib3: its ``create_connection``
keeps the new socket to itself until ``connect()`` returns, so a provider
whose accept queue is full (SYNs dropped) would hold a cancelled call for
the whole connect timeout.  Here the socket is published first and the
connect is non-blocking, waited for in short slices that look at the
tracker, so an abort ends it at once (a TLS handshake runs on the published
socket and is shut down like any read).

Limits: name resolution (``getaddrinfo``) cannot be interrupted.  SOCKS
proxies use other connection classes and are not tracked.
"""
from __future__ import annotations

import contextlib
import errno
import select
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection as _u3conn

try:  # urllib3 >= 2
    from urllib3.exceptions import NameResolutionError as _NameResolutionError
except ImportError:  # pragma: no cover - urllib3 1.26
    _NameResolutionError = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    # The mixins below are only ever combined with these urllib3 classes; the
    # checker sees them as subclasses so ``self.host``, ``super().connect()``
    # etc. are checked.  At run time they stay plain ``object`` mixins.
    from typing_extensions import TypeAlias  # read by the checker only, never imported at run time

    _ConnectionBase: TypeAlias = HTTPConnection
    _PoolBase: TypeAlias = HTTPConnectionPool
else:
    _ConnectionBase = _PoolBase = object

# How often a connect in progress looks at its tracker; a shutdown wakes it sooner.
_CONNECT_SLICE_S = 0.05

_local = threading.local()


class RequestTracker:
    """The connections one request is using, so another thread can abort them.

    A connection is tracked from the moment the pool hands it out until it
    goes back to the pool, so an abort can never reach a connection that
    another request is using by then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: List[_TrackedMixin] = []
        self._aborted = False
        #: When the call using this request gives up (monotonic): a connect still going then ends
        #: (the run's thread is waiting in it, and nothing else would stop it before the connect timeout).
        self.deadline = float("inf")

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

    def set_read_timeout(self, seconds: Optional[float]) -> None:
        """Give the sockets of this request a read timeout (urllib3 resets it on the next request)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with conn._se_lock:
                for sock in {id(s): s for s in (getattr(conn, "sock", None), conn._se_sock) if s is not None}.values():
                    try:
                        sock.settimeout(seconds)
                    except OSError:
                        pass  # already closed: nothing to time out

    def release(self) -> None:
        """The request is over: forget its connections (an abort then does nothing)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            if conn._se_tracker is self:
                conn._se_tracker = None

    def _attach(self, conn: _TrackedMixin) -> None:
        with self._lock:
            if conn not in self._connections:
                self._connections.append(conn)
            conn._se_tracker = self
            aborted = self._aborted
        if aborted:
            conn._se_shutdown()

    def _detach(self, conn: _TrackedMixin) -> None:
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


def _connect_abortably(sock: socket.socket, address: Any, timeout: Optional[float],
                       tracker: RequestTracker) -> None:
    """Connect without blocking in the kernel: wait in slices, stop when the tracker is aborted."""
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code in (0, errno.EISCONN):
        return
    if code not in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
        raise OSError(code, f"{errno.errorcode.get(code, code)}: connect to {address} failed")
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if tracker.aborted:
            raise OSError(errno.ECONNABORTED, "connect aborted: the request was cancelled")
        if time.monotonic() >= tracker.deadline:
            raise socket.timeout("timed out: the call's deadline passed while connecting")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise socket.timeout("timed out")
        if _writable(sock, _CONNECT_SLICE_S if left is None else min(left, _CONNECT_SLICE_S)):
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if tracker.aborted:
                raise OSError(errno.ECONNABORTED, "connect aborted: the request was cancelled")
            if code:
                raise OSError(code, f"{errno.errorcode.get(code, code)}: connect to {address} failed")
            return


def _writable(sock: socket.socket, wait: float) -> bool:
    """True once a connecting socket is done (connected or failed); poll() where there is one,
    as select() fails on descriptors above 1023, which busy servers have."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLOUT | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(wait * 1000))
    _, writable, failed = select.select([], [sock], [sock], wait)
    return bool(writable or failed)


class _TrackedMixin(_ConnectionBase):
    """Connection behaviour: report to the tracker and shut down on request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._se_tracker: Optional[RequestTracker] = None
        # The socket of the current connection, kept even after http.client
        # drops ``self.sock``: on a ``Connection: close`` answer it hands the
        # socket over to the response, which is exactly where reads block.
        self._se_sock: Any = None
        self._se_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        tracker = self._se_tracker
        if tracker is None:  # not part of a tracked request: urllib3's own way
            sock = super()._new_conn()
            self._se_sock = sock
            return sock
        # The same errors urllib3's _new_conn raises, so requests maps them alike.
        try:
            sock = self._se_connect(tracker)
        except socket.gaierror as exc:
            if _NameResolutionError is not None:
                raise _NameResolutionError(self.host, self, exc) from exc
            raise NewConnectionError(self, f"Failed to resolve {self.host}: {exc}") from exc  # pragma: no cover
        except socket.timeout as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock

    def _se_connect(self, tracker: RequestTracker) -> socket.socket:
        """urllib3's create_connection, with the socket published before the connect starts."""
        host, port = self._dns_host, self.port
        if host.startswith("["):
            host = host.strip("[]")
        timeout = self.timeout
        if not isinstance(timeout, (int, float)) and timeout is not None:  # urllib3's "default" sentinel
            timeout = socket.getdefaulttimeout()
        error: Optional[OSError] = None
        for family, kind, proto, _, address in socket.getaddrinfo(
                host, port, _u3conn.allowed_gai_family(), socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                with self._se_lock:
                    self._se_sock = sock
                _u3conn._set_socket_options(sock, self.socket_options)
                if self.source_address:
                    sock.bind(self.source_address)
                _connect_abortably(sock, address, timeout, tracker)
                sock.settimeout(timeout)
                return sock
            except OSError as exc:
                error = exc
                with self._se_lock:  # never free a descriptor number an abort is about to shut down
                    self._se_sock = None
                    sock.close()
        if error is not None:
            raise error
        raise OSError("getaddrinfo returned no address")

    def connect(self) -> None:
        super().connect()
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
            super().close()


class TrackedHTTPConnection(_TrackedMixin, HTTPConnection):
    """An urllib3 HTTP connection that a :class:`RequestTracker` can abort."""


class TrackedHTTPSConnection(_TrackedMixin, HTTPSConnection):
    """An urllib3 HTTPS connection that a :class:`RequestTracker` can abort."""


class _TrackedPoolMixin(_PoolBase):
    def _get_conn(self, timeout: Optional[float] = None) -> Any:
        conn = super()._get_conn(timeout)
        tracker = _current_tracker()
        if tracker is not None and isinstance(conn, _TrackedMixin):
            tracker._attach(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if isinstance(conn, _TrackedMixin):
            tracker = conn._se_tracker
            if tracker is not None:
                tracker._detach(conn)
        super()._put_conn(conn)


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

    def close(self) -> None:
        """Close every pooled connection now, then drop the pools.

        urllib3 2's ``PoolManager.clear()`` only forgets its pools; their idle
        keep-alive sockets close when the pools are garbage collected -- and
        a pool is easily held by a reference cycle (an exception's traceback
        keeps its frames, ``MaxRetryError.pool``...), so the sockets, and the
        provider's threads serving them, lived on until the next full GC.
        Connections in flight are closed when they come back.
        """
        managers = [self.poolmanager, *self.proxy_manager.values()]
        for manager in managers:
            pools = getattr(manager, "pools", None)
            if pools is None:
                continue
            for key in list(pools.keys()):
                try:
                    pool = pools[key]
                except KeyError:
                    continue
                pool.close()
        super().close()


# Many concurrent streams (an SSE server) would overflow requests' default of
# 10 pooled connections per host: each stream past the pool's size then opens
# a new connection and closes it at its end (a TCP, and TLS, handshake per
# call), and urllib3 warns on every overflow.  A pool only holds as many
# connections as were in use at once, so a large size costs nothing idle.
POOL_MAXSIZE = 256


def mount_cancellable(session: requests.Session, prefixes: Sequence[str] = ("http://", "https://")) -> None:
    """Mount a :class:`CancellableAdapter` on ``session`` for each prefix.

    A prefix already served by a cancellable adapter is left alone, so calling
    this twice (or on a session the user prepared) costs nothing.
    """
    for prefix in prefixes:
        current = session.adapters.get(prefix)
        if not isinstance(current, CancellableAdapter):
            session.mount(prefix, CancellableAdapter(pool_maxsize=POOL_MAXSIZE))
