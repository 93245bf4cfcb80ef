"""A loopback OpenAI-compatible server that replays pre-rendered SSE bodies, in its own process.

Why a separate, dumb server: the numbers must measure the *client*.  The body
of every answer is rendered before the clock starts (bytes, already framed
as HTTP chunks), so serving costs one ``sendall`` per 64 KiB, and the server
runs in its own process so it does not share the client's GIL.

A *script* is a list of segments ``{"data": str, "repeat": n, "delay": s,
"mark": name, "frame_chunks": bool}``: sleep ``delay``, write ``data`` ``repeat``
times, and if ``mark`` is set record ``(name, time.monotonic())`` right after
the ``sendall`` of that segment returned (CLOCK_MONOTONIC is system-wide on
Linux, so the client process can compare its own ``time.monotonic()``).

Routes:
  POST /_script          {"name", "segments", "followup": [segments] | null}: register
  GET  /_marks           the marks recorded so far, as JSON; ``?clear=1`` empties them
  POST /v1/chat/completions
                         the script named by the request's ``model`` (or, when no script has
                         that name, by its first user message: runs of one engine share a
                         model but not their prompt); a request whose
                         messages hold an assistant turn (a continuation round) gets
                         the script's ``followup`` (default: a one-token answer).

Run: ``python -m bench.server`` prints ``PORT <n>`` on stdout, then serves
until stdin closes (so it never outlives the benchmark).
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

HTTP_CHUNK = 65536
_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n")


def frame(data: str) -> str:
    return "data: " + data + "\n\n"


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


class Segment:
    """One pre-encoded piece of a body: the bytes to write, already HTTP-chunked."""

    __slots__ = ("delay", "mark", "writes")

    def __init__(self, spec: Dict[str, Any]) -> None:
        self.delay = float(spec.get("delay") or 0.0)
        self.mark = spec.get("mark")
        data = spec["data"].encode("utf-8") if spec.get("data") else b""
        repeat = int(spec.get("repeat", 1))
        self.writes: List[Tuple[bytes, int]] = []  # (bytes, times)
        if not data or repeat <= 0:
            return
        if spec.get("frame_chunks"):
            # One HTTP chunk per SSE frame, as a server that flushes each event does.
            frames = [f + b"\n\n" for f in data.split(b"\n\n") if f]
            one = b"".join(_http_chunk(f) for f in frames)
            self._batched(one, repeat)
            return
        per = max(1, HTTP_CHUNK // len(data))
        full, rest = divmod(repeat, per)
        if full:
            self.writes.append((_http_chunk(data * per), full))
        if rest:
            self.writes.append((_http_chunk(data * rest), 1))

    def _batched(self, unit: bytes, repeat: int) -> None:
        per = max(1, HTTP_CHUNK // len(unit))
        full, rest = divmod(repeat, per)
        if full:
            self.writes.append((unit * per, full))
        if rest:
            self.writes.append((unit * rest, 1))


class Script:
    def __init__(self, segments: List[Dict[str, Any]], followup: Optional[List[Dict[str, Any]]]) -> None:
        self.segments = [Segment(s) for s in segments]
        if followup is None:
            followup = [{"data": frame(json.dumps({"choices": [{"index": 0, "delta": {"content": "ok"}}]}))},
                        {"data": frame(json.dumps({"choices": [{"index": 0, "delta": {},
                                                                "finish_reason": "stop"}]}))
                         + frame("[DONE]")}]
        self.followup = [Segment(s) for s in followup]


def _first_user_text(request: Dict[str, Any]) -> Optional[str]:
    for message in request.get("messages", ()):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return message["content"]
    return None


class BenchServer:
    def __init__(self) -> None:
        self.scripts: Dict[str, Script] = {}
        self.marks: List[Tuple[str, float]] = []
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]

    def serve_forever(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    # --- one connection, keep-alive -------------------------------------------------
    def _connection(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                while len(buf) < length:
                    data = conn.recv(max(65536, length - len(buf)))
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                keep = self._handle(conn, method, target, body)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _handle(self, conn: socket.socket, method: str, target: str, body: bytes) -> bool:
        path = target.split("?", 1)[0]
        if method == "POST" and path == "/_script":
            spec = json.loads(body)
            script = Script(spec["segments"], spec.get("followup"))
            with self.lock:
                self.scripts[spec["name"]] = script
            return self._json(conn, {"ok": True})
        if method == "GET" and path == "/_marks":
            with self.lock:
                marks = list(self.marks)
                if "clear=1" in target:
                    self.marks.clear()
            return self._json(conn, {"marks": marks})
        if method == "POST" and path.endswith("/chat/completions"):
            request = json.loads(body)
            script = self.scripts.get(request.get("model")) or self.scripts.get(_first_user_text(request))
            if script is None:
                return self._json(conn, {"error": {"message": f"no script {request.get('model')!r}"}}, 404)
            followup = any(m.get("role") == "assistant" for m in request.get("messages", ()))
            self._stream(conn, script.followup if followup else script.segments)
            return True
        return self._json(conn, {"error": {"message": f"no route {method} {path}"}}, 404)

    def _stream(self, conn: socket.socket, segments: List[Segment]) -> None:
        conn.sendall(_HEAD)
        for segment in segments:
            if segment.delay:
                time.sleep(segment.delay)
            for data, times in segment.writes:
                for _ in range(times):
                    conn.sendall(data)
            if segment.mark is not None:
                now = time.monotonic()
                with self.lock:
                    self.marks.append((segment.mark, now))
        conn.sendall(b"0\r\n\r\n")

    @staticmethod
    def _json(conn: socket.socket, payload: Any, status: int = 200) -> bool:
        data = json.dumps(payload).encode()
        reason = "OK" if status == 200 else "Not Found"
        conn.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (status, reason.encode(), len(data)) + data)
        return True


def main() -> None:
    server = BenchServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdout.write(f"PORT {server.port}\n")
    sys.stdout.flush()
    sys.stdin.read()  # the parent closes stdin (or dies): stop


if __name__ == "__main__":
    main()
