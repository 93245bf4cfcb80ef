"""A hostile MCP server for the tests: JSON-RPC written by hand, so it can send what an SDK never would.

Run as ``python hostile.py stdio RECORD [--ignore-eof] [--ignore-term]`` or
``python hostile.py http PORT RECORD`` (streamable HTTP on 127.0.0.1,
handshake era only: it refuses ``server/discover``).  Its tools:

* ``echo(text)``: read-only, answers at once.
* ``huge(size, sse=False)``: a text result of ``size`` bytes, written as it
  goes (never held whole; over HTTP a JSON body, or one SSE event with
  ``sse``); RECORD gets ``{"event": "wrote", "bytes": N}`` with how much of
  it the client took before it stopped reading.
  With ``id_last`` the id comes at the end of the message (as some SDKs write it).
* ``flood(seconds, pings)``: writes ``notifications/tools/list_changed`` as fast as
  it can for ``seconds`` (over HTTP on the GET stream); with ``pings`` (stdio), ping
  requests instead, and stops reading (see ``Stdio.flood``).
* ``bomb()`` (HTTP): a gzip-compressed answer of 32 MiB, sent though the client asked for none.
* ``leak()`` (HTTP): an error result quoting the URL path it was called at
  and its ``Authorization`` header, as a careless server might.

``tools/list`` is answered one at a time, each after :data:`LIST_DELAY` s;
RECORD gets ``{"event": "list", "waiting": N}``: how many lists the client
had asked for and not yet got, counting this one.  ``--ignore-eof`` keeps
running after stdin closes; ``--ignore-term`` records SIGTERM
(``{"event": "term"}``) and carries on.  ``--listing odd`` adds tools no
client should take whole (a bad name, a huge description, a huge schema,
300 more), ``--listing duplicate`` lists ``echo`` twice.
"""
from __future__ import annotations

import gzip
import json
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional

LIST_DELAY = 0.05
CHUNK = 64 * 1024
CHANGED = b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}'
TOOLS = [
    {"name": "echo", "description": "Says the text back.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "huge", "description": "A result of `size` bytes.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}, "sse": {"type": "boolean"}}}},
    {"name": "flood", "description": "Floods the client with list_changed.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "bomb", "description": "A compressed answer.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "leak", "description": "Fails, quoting its URL and credentials.",
     "inputSchema": {"type": "object", "properties": {}}},
]


class Record:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def note(self, **fields: Any) -> None:
        with self.lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps({**fields, "t": time.time(), "pid": os.getpid()}) + "\n")


def reply(rid: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()


def error(rid: Any, code: int, message: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}).encode()


def initialized(params: Dict[str, Any]) -> Dict[str, Any]:
    return {"protocolVersion": params.get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "hostile", "version": "1"}}


def text_result(text: str) -> Dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def huge_parts(rid: Any, size: int, id_last: bool = False):
    """The bytes of a ``size``-byte text result, head, filler chunks, tail: never held whole."""
    rid_json = json.dumps(rid).encode()
    yield (b'{"result"' if id_last else b'{"jsonrpc":"2.0","id":' + rid_json + b',"result"') + \
        b':{"content":[{"type":"text","text":"'
    left = size
    while left > 0:
        step = min(CHUNK, left)
        yield b"x" * step
        left -= step
    yield b'"}],"isError":false}' + (b',"jsonrpc":"2.0","id":' + rid_json + b"}" if id_last else b"}")


def listing(kind: str) -> list:
    if kind == "duplicate":
        return TOOLS + [TOOLS[0]]
    if kind != "odd":
        return TOOLS
    plain = {"type": "object", "properties": {}}
    odd = [{"name": "bad name!", "description": "A name providers refuse.", "inputSchema": plain},
           {"name": "wordy", "description": "w" * 100_000, "inputSchema": plain},
           {"name": "sprawling", "description": "A huge schema.",
            "inputSchema": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}}]
    return TOOLS + odd + [{"name": f"extra_{i}", "inputSchema": plain} for i in range(300)]


class Lister:
    """Answers ``tools/list`` one at a time and records how many the client is waiting for."""

    def __init__(self, record: Record, send: Callable[[bytes], None], kind: str = "") -> None:
        self.record, self.send, self.tools = record, send, listing(kind)
        self.asked: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            rid, done = self.asked.get()
            self.record.note(event="list", waiting=self.asked.qsize() + 1)
            time.sleep(LIST_DELAY)
            done(reply(rid, {"tools": self.tools}))


# --------------------------------------------------------------------------- stdio

class Stdio:
    def __init__(self, record: Record, kind: str) -> None:
        self.record = record
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()
        self.lister = Lister(record, self.send, kind)
        self.deaf = False  # stopped reading stdin (a ping flood)

    def send(self, data: bytes) -> None:
        with self.lock:
            self.out.write(data + b"\n")
            self.out.flush()

    def serve(self, ignore_eof: bool) -> None:
        for line in sys.stdin.buffer:
            while self.deaf:
                time.sleep(3600)
            if line.strip():
                self.handle(json.loads(line))
        while ignore_eof:
            time.sleep(3600)

    def handle(self, message: Dict[str, Any]) -> None:
        method, rid, params = message.get("method"), message.get("id"), message.get("params") or {}
        if rid is None or method is None:
            return  # a notification, or an answer to nothing we asked
        if method == "initialize":
            self.send(reply(rid, initialized(params)))
        elif method == "tools/list":
            self.lister.asked.put((rid, self.send))
        elif method == "tools/call":
            threading.Thread(target=self.call, args=(rid, params), daemon=True).start()
        else:
            self.send(error(rid, -32601, f"method not found: {method}"))

    def call(self, rid: Any, params: Dict[str, Any]) -> None:
        name, args = params.get("name"), params.get("arguments") or {}
        if name == "huge":
            wrote = 0
            with self.lock:
                for part in huge_parts(rid, int(args["size"]), bool(args.get("id_last"))):
                    self.out.write(part)
                    wrote += len(part)
                self.out.write(b"\n")
                self.out.flush()
            self.record.note(event="wrote", bytes=wrote)
        elif name == "flood":
            what = CHANGED if not args.get("pings") else None
            threading.Thread(target=self.flood, args=(float(args.get("seconds", 1)), what, args.get("pings")),
                             daemon=True).start()
            self.send(reply(rid, text_result("flooding")))
        else:
            self.send(reply(rid, text_result(str(args.get("text", "")))))

    def flood(self, seconds: float, what: Optional[bytes], pings: Any = None) -> None:
        """``what`` as fast as possible; ``None``: ping requests, while no longer reading stdin.

        ``pings="same"`` gives every ping the one id ``"p"``; ``pings="cancelled"`` cancels each ping
        right after sending it (its answer is stuck behind the unread ones all the same)."""
        until = time.monotonic() + seconds
        sent = 0
        if what is None:
            self.deaf = True
        while time.monotonic() < until:
            rid = b'"p"' if pings == "same" else b'"p%d"' % sent
            self.send(what or b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % rid)
            if what is None and pings == "cancelled":
                self.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%s}}' % rid)
            sent += 1
        self.record.note(event="flooded", sent=sent)


# --------------------------------------------------------------------------- streamable HTTP

class HttpState:
    def __init__(self, record: Record) -> None:
        self.record = record
        self.flood_until = 0.0
        self.lister = Lister(record, lambda data: None)


def http_handler(state: HttpState) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_DELETE(self) -> None:
            self._plain(200, b"")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            method, rid, params = body.get("method"), body.get("id"), body.get("params") or {}
            if rid is None:
                self._plain(202, b"")
            elif method == "initialize":
                self._json(reply(rid, initialized(params)), {"Mcp-Session-Id": "hostile-session"})
            elif method == "tools/list":
                done: queue.Queue[bytes] = queue.Queue()
                state.lister.asked.put((rid, done.put))
                self._json(done.get())
            elif method == "tools/call":
                self._call(rid, params.get("name"), params.get("arguments") or {})
            else:
                self._json(error(rid, -32601, f"method not found: {method}"))

        def _call(self, rid: Any, name: str, args: Dict[str, Any]) -> None:
            if name == "huge":
                self._huge(rid, int(args["size"]), bool(args.get("sse")))
            elif name == "flood":
                state.flood_until = time.monotonic() + float(args.get("seconds", 1))
                self._json(reply(rid, text_result("flooding")))
            elif name == "bomb":  # 32 MiB of text in ~32 KiB of gzip, sent though the client asked for none
                body = gzip.compress(b"".join(huge_parts(rid, 32 * 1024 * 1024)))
                self.send_response(200)
                for key, value in (("Content-Type", "application/json"), ("Content-Encoding", "gzip"),
                                   ("Content-Length", str(len(body)))):
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)
            elif name == "leak":
                text = f"denied: {self.path} with {self.headers.get('Authorization')}"
                self._json(reply(rid, {"content": [{"type": "text", "text": text}], "isError": True}))
            else:
                self._json(reply(rid, text_result(str(args.get("text", "")))))

        def _huge(self, rid: Any, size: int, sse: bool) -> None:
            """A close-delimited body, written until done or until the client stops reading."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            wrote = 0
            try:
                if sse:
                    self.wfile.write(b"event: message\ndata: ")
                for part in huge_parts(rid, size):
                    self.wfile.write(part)
                    wrote += len(part)
                if sse:
                    self.wfile.write(b"\n\n")
                self.wfile.flush()
            except OSError:
                pass
            state.record.note(event="wrote", bytes=wrote)

        def do_GET(self) -> None:
            """The server-to-client stream: pings, and the flood while one is asked for."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            frame = b"event: message\ndata: " + CHANGED + b"\n\n"
            last_ping = 0.0
            try:
                while True:
                    if time.monotonic() < state.flood_until:
                        self.wfile.write(frame)
                    elif time.monotonic() - last_ping > 0.5:
                        self.wfile.write(b": ping\n\n")
                        self.wfile.flush()
                        last_ping = time.monotonic()
                    else:
                        time.sleep(0.01)
            except OSError:
                pass

        def _json(self, data: bytes, headers: Optional[Dict[str, str]] = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _plain(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main(argv: list) -> None:
    if argv[1] == "http":
        server = ThreadingHTTPServer(("127.0.0.1", int(argv[2])), http_handler(HttpState(Record(argv[3]))))
        server.daemon_threads = True
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        server.serve_forever()
        return
    record = Record(argv[2])
    if "--ignore-term" in argv:
        signal.signal(signal.SIGTERM, lambda *_: record.note(event="term"))
    kind = argv[argv.index("--listing") + 1] if "--listing" in argv else ""
    Stdio(record, kind).serve("--ignore-eof" in argv)


if __name__ == "__main__":
    main(sys.argv)
