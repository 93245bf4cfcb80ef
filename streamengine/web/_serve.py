"""Serve the engine (``serve``) or a WSGI app (``serve_app``) under waitress until Ctrl-C, SIGTERM or ``stop``.

Waitress has no public way to stop a server from another thread (its
maintainers point to webtest's ``StopableWSGIServer``), so this module binds
the socket itself, hands it to ``waitress.create_server`` and, on ``stop``,
closes channels and listeners from the server's own loop through its trigger,
the way webtest does.  SIGTERM sets ``stop`` too, so the caller's cleanup
(closing MCP servers) runs.  Connections are capped in total and per client
(``_ConnectionGate``), each refused at once with an answer.  It is the only
module that drives waitress (``_response`` reads the socket of its channel).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, TextIO, Tuple

from .. import _validation as validation
from .._errors import ConfigError
from .._messages import PROG
from ..runs._local import local_runs, shutdown_runs

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication
    from typing_extensions import Unpack

    from ._app import AppOptions, Approve
    from ._sse import EngineLike

#: Open connections at most (each a file descriptor and a little memory, no thread):
#: far above any stream cap, so connections that sit half-sent never starve
#: ``/healthz``; past it a client gets a 503 at once (see ``_ConnectionGate``).
CONNECTION_LIMIT = 1000
#: Open connections one client may hold (an IPv4 address, or an IPv6 /64: one host has a whole /64):
#: a client dribbling its headers (slowloris) takes at most this share of ``CONNECTION_LIMIT``.
#: A browser opens at most six per site; behind a proxy every client has the proxy's address.
CONNECTIONS_PER_CLIENT = 64
#: Bytes a channel buffers for a client that does not read before the app's
#: write blocks (waitress's default is 16 MiB: 71 MB of RSS per idle reader measured).
OUTBUF_HIGH_WATERMARK = 1 << 20
#: A connection with no request in progress and no activity for this long is closed
#: (a request half sent counts as none in progress).  Open streams send a
#: heartbeat well within it, and are never closed by it.
CHANNEL_TIMEOUT_S = 30
#: The request body waitress accepts when the app does not say: the app's own default cap.
DEFAULT_BODY_LIMIT = 1_000_000


def _refusal(status: str, text: str) -> bytes:
    body = text.encode("utf-8") + b"\n"
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 5\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode("ascii") + body


_AT_LIMIT = _refusal("503 Service Unavailable", "the server is at its connection limit; retry in 5 s")


def _write(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()


def server_limits(app: object, threads: int, connection_limit: Optional[int] = None) -> Dict[str, Any]:
    """Waitress's options for an internet-facing stream server (its defaults suit neither).

    The body limit is the app's (``max_body_bytes`` and what its parts policy lets in), so an oversized body is
    refused while it arrives instead of being spooled to disk first.  ``poll``
    instead of ``select``: select cannot watch more than 1024 descriptors.
    """
    limit = CONNECTION_LIMIT if connection_limit is None else connection_limit
    return {
        "threads": threads, "channel_request_lookahead": 1, "ident": PROG,
        # waitress's own limit (which stops accepting: clients hang in the backlog) sits past ours
        "connection_limit": limit + 8, "asyncore_use_poll": True,
        "max_request_body_size": int(getattr(app, "body_limit", getattr(app, "max_body_bytes", DEFAULT_BODY_LIMIT))),
        "outbuf_high_watermark": OUTBUF_HIGH_WATERMARK, "channel_timeout": CHANNEL_TIMEOUT_S,
        "cleanup_interval": max(1, CHANNEL_TIMEOUT_S // 3),
    }


def client_of(addr: Tuple[Any, ...]) -> str:
    """Whose connection this is: its IPv4 address, or its IPv6 /64 (an IPv4-mapped one is its IPv4 address)."""
    host = str(addr[0])
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class _ConnectionGate:
    """Stands in for the server's channel class: refuses a connection past the total or the per-client cap.

    Waitress at its own limit stops calling ``accept()``, so the next clients
    sit in the kernel's backlog with no answer at all; a quick refusal (503,
    or 429 for one client over its share) lets a client, or a load balancer,
    go elsewhere.  Each client's open connections are counted as they open
    and as waitress closes them (``_counted``).
    """

    def __init__(self, server: Any, limit: int, per_client: Optional[int]) -> None:
        self._server = server
        self._channel_class = _counted(server.channel_class)
        self._limit = limit
        self._per_client = per_client
        self._open: Dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, server: Any, conn: socket.socket, addr: Any, adj: Any, map: Any = None) -> Any:
        if len(self._server.active_channels) >= self._limit:
            return _refuse(conn, _AT_LIMIT)
        client = client_of(addr)
        with self._lock:
            held = self._open.get(client, 0)
            if self._per_client is not None and held >= self._per_client:
                refusal = _refusal("429 Too Many Requests", f"this address has {held} open connections (the "
                                   f"limit per client); close some and retry in 5 s")
            else:
                refusal = None
                self._open[client] = held + 1
        if refusal is not None:
            return _refuse(conn, refusal)
        closed = _Once(lambda: self._closed(client))
        try:
            return self._channel_class(server, conn, addr, adj, map=map, on_closed=closed)
        except BaseException:
            closed()
            raise

    def _closed(self, client: str) -> None:
        with self._lock:
            left = self._open.get(client, 1) - 1
            if left > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)


def _counted(channel_class: Any) -> Any:
    """Waitress's channel class, calling ``on_closed`` once when the channel leaves the server's map."""

    class CountedChannel(channel_class):  # type: ignore[misc]  # a base class known only at run time (waitress's)
        def __init__(self, server: Any, sock: socket.socket, addr: Any, adj: Any, map: Any = None,
                     on_closed: Optional[Callable[[], None]] = None) -> None:
            self._on_closed = on_closed  # before the base class: it may close the channel while it starts
            super().__init__(server, sock, addr, adj, map=map)

        def del_channel(self, map: Any = None) -> None:
            on_closed, self._on_closed = self._on_closed, None
            super().del_channel(map)
            if on_closed is not None:
                on_closed()

    return CountedChannel


class _Once:
    """A callable that calls ``action`` the first time only (a channel may be closed more than once)."""

    __slots__ = ("_action",)

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Optional[Callable[[], None]] = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


def _refuse(conn: socket.socket, answer: bytes) -> None:
    try:
        conn.settimeout(0)
        conn.send(answer)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()


def serve(engine: EngineLike, *, host: str = "127.0.0.1", port: int = 8000, threads: int = 32,
          approve: Optional[Approve] = None, out: Optional[TextIO] = None,
          stop: Optional[threading.Event] = None, ready: Optional[Callable[[str], None]] = None,
          max_connections_per_client: Optional[int] = CONNECTIONS_PER_CLIENT,
          **app_options: Unpack[AppOptions]) -> None:
    """Serve ``make_wsgi_app(engine, approve=approve, **app_options)`` under waitress until stopped.

    It stops on Ctrl-C, on SIGTERM (when run in the main thread) or when
    ``stop`` is set, and then returns, so the caller's cleanup runs: close
    the engine and its MCP servers after it (``with engine: serve(engine)``).
    ``approve(call, environ) -> bool`` lets side-effect tools run for the
    requests it says yes to; without it they are refused (see
    :class:`~streamengine.web.StreamApp`).  Streams are capped at ``threads
    - 4`` unless ``max_streams`` says otherwise, so the page and ``/healthz``
    always find a thread.  ``max_connections_per_client`` caps one address's
    open connections (None: no cap; behind a proxy every client has the
    proxy's address).  ``ready(url)`` is called once listening; the URL is
    also printed to ``out`` (default stdout).
    """
    from ._app import StreamApp

    validation.count(threads, "threads", minimum=1)
    app_options.setdefault("max_streams", max(1, threads - 4))
    app = StreamApp(engine, approve=approve, **app_options)
    serve_app(app, host=host, port=port, threads=threads, out=out if out is not None else sys.stdout,
              stop=stop, ready=ready, max_connections_per_client=max_connections_per_client)


def serve_app(app: WSGIApplication, *, host: str, port: int, threads: int, out: TextIO, banner: Sequence[str] = (),
              stop: Optional[threading.Event] = None, ready: Optional[Callable[[str], None]] = None,
              connection_limit: Optional[int] = None,
              max_connections_per_client: Optional[int] = CONNECTIONS_PER_CLIENT) -> None:
    """Serve a WSGI app under waitress until Ctrl-C, SIGTERM, or until ``stop`` is set.

    Every open SSE stream holds one waitress thread for its whole length, so
    ``threads`` must exceed the concurrent streams you expect.
    ``channel_request_lookahead`` lets waitress notice a closed tab at once.
    The other limits (connections, body size, output buffer, idle channels)
    are :func:`server_limits`; one client's connections are capped at
    ``max_connections_per_client`` (None: no cap).
    """
    try:
        from waitress import wasyncore
        from waitress.server import create_server
    except ImportError as exc:
        raise ConfigError("serving needs waitress: pip install 'streamengine[serve]'") from exc
    if max_connections_per_client is not None:
        validation.count(max_connections_per_client, "max_connections_per_client", minimum=1)
    sock = _listen_socket(host, port)
    try:
        # Bound here, not by waitress: a busy port then fails before waitress starts its threads.
        # Any: waitress's stubs say MultiSocketServer | BaseWSGIServer with a channel_class that is a type; with
        # one socket it is a BaseWSGIServer, and its channel_class becomes the gate (a callable, not a type).
        server: Any = create_server(app, sockets=[sock], **server_limits(app, threads, connection_limit))
        server.channel_class = _ConnectionGate(server, server.adj.connection_limit - 8, max_connections_per_client)
    except BaseException:
        sock.close()
        raise
    socket_map = getattr(server, "_map", None)
    if socket_map is None:
        socket_map = server.map
    stop = stop if stop is not None else threading.Event()
    finished = threading.Event()
    watcher = threading.Thread(target=_stop_when_set, args=(stop, finished, server, socket_map, wasyncore),
                               name="streamengine-serve-stop", daemon=True)
    restore = _stop_on_sigterm(stop)  # before the URL is out: from then on a SIGTERM may come
    try:
        watcher.start()
        url = _announce(server, out, banner)
        if ready is not None:
            ready(url)
        server.run()
    finally:
        restore()
        finished.set()
        server.task_dispatcher.shutdown(timeout=5)
        _close_all(socket_map, wasyncore)
        if watcher.is_alive():
            watcher.join(timeout=10)
    _write(out, f"{PROG}: stopped\n")


def _announce(server: Any, out: TextIO, banner: Sequence[str]) -> str:
    """Print where the server listens (and the banner); returns its URL."""
    bound_host, bound_port = (server.effective_host, server.effective_port) if hasattr(server, "effective_port") \
        else server.effective_listen[0]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    url = f"http://{shown}:{bound_port}/"
    _write(out, f"{PROG}: serving on {url}  (Ctrl-C to stop)\n")
    for line in banner:
        _write(out, line + "\n")
    return url


def _stop_on_sigterm(stop: threading.Event) -> Callable[[], None]:
    """Make SIGTERM stop the server like ``stop`` does; returns the function that puts the old handler back.

    By default SIGTERM (``kill``, ``docker stop``, systemd) ends the process
    on the spot: no ``finally`` runs, so the engine's stdio MCP servers that
    do not exit on EOF outlive it.  Stopping instead lets ``serve`` return
    and its caller close them.  Only the main thread may set a handler, and
    one the application set is left alone.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


#: How long a stopping server gives its runs to end (``shutdown_runs``) before it closes the connections.
RUNS_SHUTDOWN_S = 5.0


def _listen_socket(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    try:
        if os.name == "posix":  # a restart may reuse a port still in TIME_WAIT
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def _stop_when_set(stop: threading.Event, finished: threading.Event, server: Any, socket_map: Dict[Any, Any],
                   wasyncore: Any) -> None:
    """Stop the server from another thread, in the order waitress can take it.

    The socket map belongs to the loop's thread, so changes go through the
    trigger.  Listeners and client channels close first (a closed channel
    makes its stream's next write, or the app's disconnect probe, end the
    run); the task threads are joined while the trigger still exists (a
    finishing task pulls it); only then does the loop lose its last
    dispatcher and return.  Runs this process produces (``runs=``) end
    first, with ``done`` or ``error{worker_shutdown}``, while their clients
    can still read it.
    """
    while not stop.wait(0.1):
        if finished.is_set():
            return
    if local_runs():  # before the channels close: a closed channel would detach its run, not end it
        shutdown_runs(RUNS_SHUTDOWN_S)
    trigger = next((d for d in list(socket_map.values()) if hasattr(d, "pull_trigger")), None)
    if trigger is None or finished.is_set():
        return
    trigger.pull_trigger(lambda: _close_all(socket_map, wasyncore, keep_trigger=True))
    server.task_dispatcher.shutdown(timeout=5)
    finish_closing(trigger, socket_map, wasyncore)


def finish_closing(trigger: Any, socket_map: Dict[Any, Any], wasyncore: Any) -> None:
    """Close what is left, the trigger last, from the loop's thread when the trigger still works.

    A trigger already closed (waitress closes it with the last dispatcher in
    some orders) means the loop has nothing left to serve: close the rest here.
    """
    try:
        trigger.pull_trigger(lambda: _close_all(socket_map, wasyncore))
    except OSError:
        _close_all(socket_map, wasyncore)


def _close_all(socket_map: Dict[Any, Any], wasyncore: Any, keep_trigger: bool = False) -> None:
    for dispatcher in list(socket_map.values()):
        if hasattr(dispatcher, "pull_trigger") and keep_trigger:
            continue
        try:
            if hasattr(dispatcher, "write_soon"):
                dispatcher.handle_close()  # a channel: wakes task threads blocked writing to it
            elif keep_trigger and hasattr(dispatcher, "trigger"):
                # The server: its own close() closes the trigger too, which finishing tasks still pull.
                wasyncore.dispatcher.close(dispatcher)
            else:
                dispatcher.close()
        except OSError:
            pass
    if not keep_trigger:
        wasyncore.close_all(socket_map, ignore_all=True)
