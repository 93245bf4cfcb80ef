"""A paced OpenAI-compatible upstream: many streams, one frame per write, one thread, its own process.

Why not bench/server.py: that server replays pre-rendered bodies with one
thread per connection, which is right for bursts but would spend more CPU
pacing 200 streams (200 threads waking 30 times a second) than the app under
test.  This one is a single ``selectors`` loop with a timer heap: every frame
is its own HTTP chunk and its own ``send``, written when it is due.

The request's ``model`` says what to stream: ``paced:<tokens>:<rate>:<tag>:<stamp>``

* ``rate`` tokens per second; ``0`` = a burst, written as fast as the socket
  takes it (non-blocking: a client that does not read holds the upstream back,
  as a real provider's TCP connection would).
* ``tag`` names the stream for ``GET /_progress`` (frames written so far).
* ``stamp`` 1: each token's text is ``" t<time.monotonic() at the write>"``, so
  the reader can tell how late it got the token (CLOCK_MONOTONIC is
  system-wide on Linux); 0: each token is ``" w"``.

``GET /_stats`` reports how late the upstream itself was against its schedule
(if it falls behind, the harness, not the app, is the bottleneck).

Run: ``python -m bench.upstream`` prints ``PORT <n>``; it stops when stdin closes.
"""
from __future__ import annotations

import heapq
import json
import selectors
import socket
import time
from typing import Any, Dict, List, Optional, Tuple

_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")
_ID = ('{"id":"chatcmpl-bench0123456789","object":"chat.completion.chunk","created":1700000000,'
       '"model":"bench-model","system_fingerprint":"fp_bench01","choices":[{"index":0,"delta":{"content":"')
_TAIL = '"},"logprobs":null,"finish_reason":null}]}'
_FINISH = (b'data: {"id":"chatcmpl-bench0123456789","object":"chat.completion.chunk","created":1700000000,'
           b'"model":"bench-model","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n'
           b'data: [DONE]\n\n')
BURST_BATCH = 256  # frames per send in a burst


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


def token_frame(text: str) -> bytes:
    return ("data: " + _ID + text + _TAIL + "\n\n").encode()


class Stream:
    """One response being written: how many tokens are left, when the next is due."""

    __slots__ = ("conn", "due", "interval", "left", "stamp", "tag", "written")

    def __init__(self, conn: Connection, tokens: int, rate: float, tag: str, stamp: bool) -> None:
        self.conn, self.left, self.tag, self.stamp = conn, tokens, tag, stamp
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.due = time.monotonic()
        self.written = 0


class Connection:
    __slots__ = ("inbuf", "outbuf", "sock", "stream")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.inbuf, self.outbuf = sock, b"", b""
        self.stream: Optional[Stream] = None


class Upstream:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.timers: List[Tuple[float, int, Stream]] = []
        self.seq = 0
        self.progress: Dict[str, int] = {}
        self.lags: List[float] = []  # how late each paced write was against its schedule

    # --- the loop ------------------------------------------------------------------
    def serve_forever(self) -> None:
        while True:
            timeout = None
            if self.timers:
                timeout = max(0.0, self.timers[0][0] - time.monotonic())
            for key, mask in self.sel.select(timeout):
                if key.data is None:
                    self._accept()
                    continue
                conn = key.data
                if mask & selectors.EVENT_READ:
                    self._readable(conn)
                if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                    self._flush(conn)
                    self._resume_burst(conn)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, stream = heapq.heappop(self.timers)
                self._write_due(stream, now)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock)
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: Connection) -> None:
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        conn.stream = None

    def _readable(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        self._maybe_request(conn)

    def _maybe_request(self, conn: Connection) -> None:
        if conn.stream is not None or b"\r\n\r\n" not in conn.inbuf:
            return
        head, rest = conn.inbuf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip() or 0)
        if len(rest) < length:
            return
        body, conn.inbuf = rest[:length], rest[length:]
        self._route(conn, method, target, body)

    def _route(self, conn: Connection, method: str, target: str, body: bytes) -> None:
        path = target.split("?", 1)[0]
        if method == "GET" and path == "/_progress":
            return self._json(conn, self.progress)
        if method == "GET" and path == "/_stats":
            return self._json(conn, self._stats("clear=1" in target))
        if method == "POST" and path.endswith("/chat/completions"):
            model = str(json.loads(body or b"{}").get("model", ""))
            try:
                _, tokens, rate, tag, stamp = model.split(":")
                stream = Stream(conn, int(tokens), float(rate), tag, stamp == "1")
            except ValueError:
                return self._json(conn, {"error": {"message": f"model must be paced:<n>:<rate>:<tag>:<stamp>, "
                                                              f"got {model!r}"}}, 404)
            conn.stream = stream
            self.progress[tag] = 0
            self._send(conn, _HEAD)
            self._schedule(stream)
            return None
        return self._json(conn, {"error": {"message": f"no route {method} {path}"}}, 404)

    def _stats(self, clear: bool) -> Dict[str, Any]:
        lags = sorted(self.lags)
        if clear:
            self.lags = []
        if not lags:
            return {"n": 0}
        return {"n": len(lags), "p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1e3, "max_ms": lags[-1] * 1e3}

    # --- writing -------------------------------------------------------------------
    def _schedule(self, stream: Stream) -> None:
        self.seq += 1
        heapq.heappush(self.timers, (stream.due, self.seq, stream))

    def _write_due(self, stream: Stream, now: float) -> None:
        conn = stream.conn
        if conn.stream is not stream:  # the connection closed meanwhile
            return
        if stream.interval == 0.0:
            self._burst(stream)
            return
        self.lags.append(now - stream.due)
        text = f" t{time.monotonic():.6f}" if stream.stamp else " w"
        self._send(conn, chunk(token_frame(text)))
        self._count(stream, 1)
        if stream.left:
            stream.due += stream.interval
            self._schedule(stream)

    def _burst(self, stream: Stream) -> None:
        """Fill the socket; come back when it can take more (or, if it took all, on the next loop)."""
        conn = stream.conn
        if conn.outbuf:
            return  # _flush calls back when the socket drained
        unit = chunk(token_frame(" w"))
        n = min(BURST_BATCH, stream.left)
        self._send(conn, unit * n)
        self._count(stream, n)
        if stream.left and not conn.outbuf and conn.stream is stream:
            stream.due = time.monotonic()
            self._schedule(stream)

    def _count(self, stream: Stream, n: int) -> None:
        stream.left -= n
        stream.written += n
        self.progress[stream.tag] = stream.written
        if stream.left == 0:
            self._send(stream.conn, chunk(_FINISH) + b"0\r\n\r\n")
            stream.conn.stream = None
            self._maybe_request(stream.conn)

    def _send(self, conn: Connection, data: bytes) -> None:
        conn.outbuf += data
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.outbuf = conn.outbuf[sent:]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        try:
            self.sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError):
            return

    def _resume_burst(self, conn: Connection) -> None:
        """The socket drained what a burst left in the buffer: write the next batch."""
        stream = conn.stream
        if not conn.outbuf and stream is not None and stream.interval == 0.0 and stream.left:
            stream.due = time.monotonic()
            self._schedule(stream)

    def _json(self, conn: Connection, payload: Any, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        reason = b"OK" if status == 200 else b"Not Found"
        self._send(conn, b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (status, reason, len(data)) + data)
        self._maybe_request(conn)


def main() -> None:
    from .common import announce_and_serve
    upstream = Upstream()
    announce_and_serve(upstream.port, upstream.serve_forever)


if __name__ == "__main__":
    main()
