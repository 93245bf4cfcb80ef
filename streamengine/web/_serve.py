"""Serve a WSGI app under waitress until Ctrl-C or until a ``stop`` event is set.

Waitress has no public way to stop a server from another thread (its
maintainers point to webtest's ``StopableWSGIServer``), so this module binds
the socket itself, hands it to ``waitress.create_server`` and, on ``stop``,
closes channels and listeners from the server's own loop through its trigger,
the way webtest does.  It is the only module that knows waitress.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable, Dict, Optional, Sequence, TextIO

from .._errors import ConfigError
from .._messages import PROG


#: Open connections at most (each a file descriptor and a little memory, no thread):
#: far above any stream cap, so connections that sit half-sent never starve
#: ``/healthz``; past it a client gets a 503 at once (see ``_RefuseOverLimit``).
CONNECTION_LIMIT = 1000
#: Bytes a channel buffers for a client that does not read before the app's
#: write blocks (waitress's default is 16 MiB: 71 MB of RSS per idle reader measured).
OUTBUF_HIGH_WATERMARK = 1 << 20
#: A connection with no request in progress and no activity for this long is closed
#: (a request half sent counts as none in progress).  Open streams send a
#: heartbeat well within it, and are never closed by it.
CHANNEL_TIMEOUT_S = 30
#: The request body waitress accepts when the app does not say: the app's own default cap.
DEFAULT_BODY_LIMIT = 1_000_000

_REFUSAL_BODY = b"the server is at its connection limit; retry in 5 s\n"
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Retry-After: 5\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(_REFUSAL_BODY)) + _REFUSAL_BODY


def _write(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()


def server_limits(app: Any, threads: int, connection_limit: Optional[int] = None) -> Dict[str, Any]:
    """Waitress's options for an internet-facing stream server (its defaults suit neither).

    The body limit is the app's ``max_body_bytes``, so an oversized body is
    refused while it arrives instead of being spooled to disk first.  ``poll``
    instead of ``select``: select cannot watch more than 1024 descriptors.
    """
    limit = CONNECTION_LIMIT if connection_limit is None else connection_limit
    return {
        "threads": threads, "channel_request_lookahead": 1, "ident": PROG,
        # waitress's own limit (which stops accepting: clients hang in the backlog) sits past ours
        "connection_limit": limit + 8, "asyncore_use_poll": True,
        "max_request_body_size": int(getattr(app, "max_body_bytes", DEFAULT_BODY_LIMIT)),
        "outbuf_high_watermark": OUTBUF_HIGH_WATERMARK, "channel_timeout": CHANNEL_TIMEOUT_S,
        "cleanup_interval": max(1, CHANNEL_TIMEOUT_S // 3),
    }


class _RefuseOverLimit:
    """Stands in for the server's channel class: past ``limit`` open connections, answer 503 and close.

    Waitress at its own limit stops calling ``accept()``, so the next clients
    sit in the kernel's backlog with no answer at all; a quick refusal lets
    a client (or a load balancer) go elsewhere.
    """

    def __init__(self, server: Any, limit: int) -> None:
        self._server = server
        self._channel_class = server.channel_class
        self._limit = limit

    def __call__(self, server: Any, conn: socket.socket, addr: Any, adj: Any, map: Any = None) -> Any:
        if len(self._server.active_channels) < self._limit:
            return self._channel_class(server, conn, addr, adj, map=map)
        try:
            conn.settimeout(0)
            conn.send(_REFUSAL)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()
        return None


def serve_app(app: Any, *, host: str, port: int, threads: int, out: TextIO, banner: Sequence[str] = (),
              stop: Optional[threading.Event] = None, ready: Optional[Callable[[str], None]] = None,
              connection_limit: Optional[int] = None) -> None:
    """Serve a WSGI app under waitress until Ctrl-C or until ``stop`` is set.

    Every open SSE stream holds one waitress thread for its whole length, so
    ``threads`` must exceed the concurrent streams you expect.
    ``channel_request_lookahead`` lets waitress notice a closed tab at once.
    The other limits (connections, body size, output buffer, idle channels)
    are :func:`server_limits`.
    """
    try:
        from waitress import wasyncore
        from waitress.server import create_server
    except ImportError as exc:
        raise ConfigError("serving needs waitress: pip install 'streamengine[serve]'") from exc
    sock = _listen_socket(host, port)
    try:
        # Bound here, not by waitress: a busy port then fails before waitress starts its threads.
        server = create_server(app, sockets=[sock], **server_limits(app, threads, connection_limit))
        server.channel_class = _RefuseOverLimit(server, server.adj.connection_limit - 8)
    except BaseException:
        sock.close()
        raise
    bound_host, bound_port = (server.effective_host, server.effective_port) if hasattr(server, "effective_port") \
        else server.effective_listen[0]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    url = f"http://{shown}:{bound_port}/"
    _write(out, f"{PROG}: serving on {url}  (Ctrl-C to stop)\n")
    for line in banner:
        _write(out, line + "\n")
    socket_map = getattr(server, "_map", None)
    if socket_map is None:
        socket_map = server.map
    finished = threading.Event()
    watcher = None
    if stop is not None:
        watcher = threading.Thread(target=_stop_when_set, args=(stop, finished, server, socket_map, wasyncore),
                                   name="streamengine-serve-stop", daemon=True)
        watcher.start()
    if ready is not None:
        ready(url)
    try:
        server.run()
    finally:
        finished.set()
        server.task_dispatcher.shutdown(timeout=5)
        _close_all(socket_map, wasyncore)
        if watcher is not None:
            watcher.join(timeout=10)
    _write(out, f"{PROG}: stopped\n")


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
    dispatcher and return.
    """
    while not stop.wait(0.1):
        if finished.is_set():
            return
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
        if hasattr(dispatcher, "pull_trigger"):
            if keep_trigger:
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
