"""FakeProvider: a real loopback HTTP server speaking the OpenAI (or Anthropic) wire format from a script.

Public, for streamengine's own tests, its demo and CLI harness, and your
tests.  It is a real threaded HTTP/1.1 server on 127.0.0.1 (keep-alive,
chunked / close-delimited / Content-Length bodies), because the bugs worth
catching live in the transport: reads that wait for a full buffer, CRLF or a
UTF-8 character split across packets, a connection dropped mid-answer.

::

    from streamengine.testing import FakeProvider, steps as s

    with FakeProvider() as fp:
        fp.add_turn(s.text("Hel"), s.delay(0.05), s.text("lo"))
        fp.add_turn(s.http_error(503, {"error": {"message": "overloaded"}}))
        client = OpenAICompatibleClient(fp.base_url)
        ...
        fp.requests[0].json["messages"]

Each chat-completions request (streamed or not) takes the next turn, first
in, first out.  A turn is a list of steps (``steps`` below), run in order;
consecutive frames with no timing step between them go out in one write.
A turn without a terminal step (``done``, ``end``, ``stall``, ``forever``,
``drop``, ``http_error``, ``stall_before_headers``) gets ``finish`` (``"tool_calls"``
when the turn has tool calls, else ``"stop"``), ``usage`` and ``[DONE]``
appended, leaving out the ones the turn already has.

``FakeProvider(wire="anthropic")`` serves ``POST /v1/messages`` instead and
speaks the same steps as the Anthropic Messages API (``_wires.py``);
``FakeProvider(wire="responses")`` serves ``POST /v1/responses`` and speaks
them as OpenAI's Responses API (``_wires.py``).

Response headers go out at once, like a real provider, unless the first
step that is not a timing step (``delay``/``wait``/``signal``) is
``http_error``, ``stall_before_headers`` or ``drop``: then the timing steps
run first and the connection answers (or not) accordingly.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import json
import math
import re
import select
import selectors
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Deque, Dict, List, Literal, Mapping, Optional, Sequence, Set, Tuple, get_args

from requests.structures import CaseInsensitiveDict

from .._messages import StopReason
from . import _steps as wire_steps
from ._exchange import Exchange, shut_down
from ._steps import Step, StepLike, done, finish, usage


@dataclass(frozen=True)
class Turn:
    """The steps answering one chat-completions request."""

    steps: Tuple[Step, ...]

    def has(self, *kinds: str) -> bool:
        return any(step.kind in kinds for step in self.steps)

    def has_tool_calls(self) -> bool:
        return any(step.kind == "delta" and "tool_calls" in step.value for step in self.steps)


def _build_turn(items: Sequence[StepLike], auto_finish: bool) -> Turn:
    body = wire_steps._flatten(items)
    first = next((i for i, st in enumerate(body) if st.kind not in wire_steps._TIMING), None)
    for i, st in enumerate(body):
        if st.kind in ("http_error", "stall_before_headers") and i != first:
            raise ValueError(f"{st.kind}() must be the first step of a turn (after timing steps only)")
    turn = Turn(tuple(body))
    if auto_finish and not turn.has(*wire_steps._TERMINAL):
        extra = []
        if not turn.has("finish"):
            extra.append(finish(StopReason.TOOL_CALLS if turn.has_tool_calls() else StopReason.STOP))
        if not turn.has("usage"):
            extra.append(usage())
        extra.append(done())
        turn = Turn(turn.steps + tuple(extra))
    return turn


# -- recorded requests and embeddings ---------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """What the provider received; ``headers`` is case-insensitive, ``json`` None if not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    json: Any
    body: bytes = b""

    @property
    def parts(self) -> List[Dict[str, Any]]:
        """The images, audio and files the request carried, in order, each in its wire's own shape.

        Every typed block of a message's content (``messages``; the Responses
        API's ``input``) that is neither text nor a tool call or result: what
        a test checks to see what reached the wire.
        """
        payload = self.json if isinstance(self.json, dict) else {}
        turns = payload.get("messages", payload.get("input"))
        found: List[Dict[str, Any]] = []
        for turn in turns if isinstance(turns, list) else ():
            content = turn.get("content") if isinstance(turn, dict) else None
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") not in _NOT_PARTS:
                    found.append(block)
        return found


#: Content blocks that are not parts: text, and the tool calls and results of each wire.
_NOT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "tool_use", "tool_result", "thinking",
                        "redacted_thinking"})


def fake_embedding(text: str, dim: int = 16) -> List[float]:
    """The deterministic unit vector FakeProvider returns for ``text``.

    A bag of hashed, lower-cased words: texts sharing words point the same way,
    so similarity search over it behaves plausibly in tests.
    """
    vector = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        vector[int.from_bytes(digest[:4], "big") % dim] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=4).digest()
        vector = [0.0] * dim
        vector[int.from_bytes(digest, "big") % dim] = 1.0
        return vector
    return [x / norm for x in vector]


# -- the server ------------------------------------------------------------------------

#: The wire format a FakeProvider speaks: OpenAI Chat Completions, Anthropic Messages or OpenAI Responses.
Wire = Literal["openai", "anthropic", "responses"]
#: How a FakeProvider delimits a streamed body.
Framing = Literal["chunked", "close", "length"]
#: A function answering a request (its JSON body) with the steps of its turn.
Responder = Callable[[Dict[str, Any]], Sequence[StepLike]]
WIRES: Tuple[Wire, ...] = get_args(Wire)
_CHAT_PATHS = {"openai": "/chat/completions", "anthropic": "/messages", "responses": "/responses"}
_ID_PREFIXES = {"openai": "chatcmpl-fake-", "anthropic": "msg_fake_", "responses": "resp_fake_"}


class FakeProvider:
    """A scripted OpenAI-compatible (or ``wire="anthropic"``: Anthropic; ``"responses"``: OpenAI Responses) server.

    It listens on ``127.0.0.1:<free port>``.

    ``framing`` picks how streamed bodies are delimited: ``"chunked"``,
    ``"close"`` (the connection ends the body) or ``"length"``
    (Content-Length, computed from the turn).  ``max_recorded`` bounds
    :attr:`requests` to the latest N (``request_count`` still counts all).  :meth:`close` ends every open
    connection, stalled ones included, and joins all server threads.  ``GET /models`` lists ``models``
    (Anthropic's ``/v1/models`` in pages of ``models_per_page``).
    """

    def __init__(self, framing: Framing = "chunked", embedding_dim: int = 16, *,
                 reverse_embeddings: bool = False, max_recorded: Optional[int] = None,
                 wire: Wire = "openai", models: Sequence[str] = ("fake-model",),
                 models_per_page: int = 1000) -> None:
        if framing not in ("chunked", "close", "length"):
            raise ValueError(f"framing must be 'chunked', 'close' or 'length', got {framing!r}")
        if wire not in WIRES:
            raise ValueError(f"wire must be one of {', '.join(WIRES)}, got {wire!r}")
        self.framing = framing
        self.wire = wire
        self.embedding_dim = embedding_dim
        self.reverse_embeddings = reverse_embeddings
        self.models = list(models)
        self.models_per_page = models_per_page
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._turns: Deque[Turn] = collections.deque()
        self._responder: Optional[Responder] = None
        self._responder_auto_finish = True
        # ``max_recorded`` keeps only the latest requests: a soak test sending
        # thousands must not see the recorder's memory as a leak.
        self._requests: Deque[RecordedRequest] = collections.deque(maxlen=max_recorded)
        self._request_total = 0
        self._embedding_failures: Deque[int] = collections.deque()
        self._sockets: Set[socket.socket] = set()
        self._threads: List[threading.Thread] = []
        self._closing = threading.Event()
        self._closed = False
        self._ids = itertools.count(1)
        self._connections = 0
        self._client_gone = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.provider = self
        self.port: int = self._server.server_address[1]
        # A socket pair wakes the accept loop at once on close (serve_forever polls).
        self._wake_r, self._wake_w = socket.socketpair()
        self._serve_thread = threading.Thread(
            target=self._serve, name=f"FakeProvider-{self.port}-serve", daemon=True)
        self._serve_thread.start()

    # -- script and records ---------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root a client takes: ``.../v1`` for OpenAI, the bare root for Anthropic."""
        root = f"http://127.0.0.1:{self.port}"
        return root if self.wire == "anthropic" else root + "/v1"

    def add_turn(self, *items: StepLike, auto_finish: bool = True) -> FakeProvider:
        """Queue the answer to one chat-completions request; returns self for chaining."""
        turn = _build_turn(items, auto_finish)
        with self._lock:
            self._turns.append(turn)
        return self

    def respond_with(self, responder: Optional[Responder],
                     *, auto_finish: bool = True) -> FakeProvider:
        """Answer every request for which no turn is queued with ``responder(request_json)``.

        For concurrent clients, whose requests arrive in no fixed order: the
        responder looks at the request (e.g. its last message) and returns the
        steps of the answer.  Queued turns still go first.
        """
        with self._lock:
            self._responder = responder
            self._responder_auto_finish = auto_finish
        return self

    @property
    def turns_left(self) -> int:
        with self._lock:
            return len(self._turns)

    def fail_embeddings(self, status: int = 500, times: int = 1) -> None:
        """Make the next ``times`` embeddings requests answer HTTP ``status``."""
        with self._lock:
            self._embedding_failures.extend([status] * times)

    @property
    def requests(self) -> List[RecordedRequest]:
        """A snapshot of every request received, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def connection_count(self) -> int:
        """TCP connections accepted so far (keep-alive reuse shows as fewer than requests)."""
        with self._lock:
            return self._connections

    @property
    def request_count(self) -> int:
        with self._lock:
            return self._request_total

    @property
    def client_disconnects(self) -> int:
        """Answers cut short because the client went away (closed or shut down its socket).

        How a test sees, from the server's side, that a timeout or a cancel
        really closed the connection instead of leaving it open.
        """
        with self._lock:
            return self._client_gone

    def wait_for_client_disconnects(self, n: int, timeout: float = 5.0) -> bool:
        """Block until ``n`` answers were cut short by their client; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._client_gone >= n, timeout)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        """Block until ``n`` requests have arrived; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._request_total >= n, timeout)

    # -- lifecycle ------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, end every connection (stalled ones too), join the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        deadline = time.monotonic() + timeout
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._serve_thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            shut_down(sock)
        self._server.server_close()
        self._wake_r.close()
        self._wake_w.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FakeProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FakeProvider(base_url={self.base_url!r}, framing={self.framing!r}, wire={self.wire!r})"

    # -- used by the server and the handler ----------------------------------------------

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._server.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._closing.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._server.socket and not self._closing.is_set():
                        self._server._handle_request_noblock()

    def _track(self, sock: socket.socket, thread: threading.Thread) -> None:
        with self._lock:
            self._connections += 1
            self._sockets.add(sock)
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        if self._closing.is_set():
            shut_down(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)

    def _record(self, request: RecordedRequest) -> None:
        with self._changed:
            self._requests.append(request)
            self._request_total += 1
            self._changed.notify_all()

    def _next_turn(self, payload: Dict[str, Any]) -> Optional[Turn]:
        with self._lock:
            if self._turns:
                return self._turns.popleft()
            responder, auto_finish = self._responder, self._responder_auto_finish
        if responder is None:
            return None
        return _build_turn(list(responder(payload)), auto_finish)

    def _note_client_gone(self) -> None:
        with self._changed:
            self._client_gone += 1
            self._changed.notify_all()

    def _next_embedding_failure(self) -> Optional[int]:
        with self._lock:
            return self._embedding_failures.popleft() if self._embedding_failures else None

    def _next_id(self) -> str:
        return f"{_ID_PREFIXES[self.wire]}{next(self._ids)}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    provider: FakeProvider
    # socketserver.BaseServer's own one-request step (what handle_request() runs after its
    # select); typeshed leaves it out, so it is declared here for _serve().
    _handle_request_noblock: Callable[[], None]

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup that can
        # take seconds on some machines; the name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, self.server_port = self.server_address[:2]
        self.server_name = host if isinstance(host, str) else host.decode("ascii")  # str for AF_INET/AF_INET6

    def process_request(self, request: Any, client_address: Any) -> None:
        # Our own thread, so close() can join it and tests can name it in leaks.
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                                  name=f"FakeProvider-{self.provider.port}-conn", daemon=True)
        self.provider._track(request, thread)
        thread.start()

    def shutdown_request(self, request: Any) -> None:
        self.provider._untrack(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away mid-answer is the normal case here, not news.
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        # Frames go out as written, as from a real streaming server: with Nagle
        # on, a small write after another one waits for the client's delayed
        # ACK (40 ms), which would show up as latency that is not the client's.
        try:
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._read_and_record()
        path, _, query = self.path.partition("?")
        if path.rstrip("/").endswith("/models"):
            self._send_json(200, self._model_list(urllib.parse.parse_qs(query)))
        else:
            self._send_json(404, {"error": {"message": f"FakeProvider: no route for GET {self.path}"}})

    def do_POST(self) -> None:
        payload = self._read_and_record()
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith(_CHAT_PATHS[self.provider.wire]):
            Exchange(self, payload).run()
        elif path.endswith("/embeddings") and self.provider.wire != "anthropic":
            self._embeddings(payload)
        else:
            self._send_json(404, {"error": {"message": f"FakeProvider: no route for POST {self.path}"}})

    def _model_list(self, query: Dict[str, List[str]]) -> Dict[str, Any]:
        """``provider.models`` as the wire lists them: OpenAI's one list, Anthropic's pages."""
        if self.provider.wire != "anthropic":
            return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"}
                                               for m in self.provider.models]}
        models = self.provider.models
        after = query.get("after_id", [""])[0]
        start = models.index(after) + 1 if after in models else 0
        size = min(int(query.get("limit", ["20"])[0]), self.provider.models_per_page)
        page = models[start:start + size]
        return {"data": [{"type": "model", "id": m, "display_name": m, "created_at": "2026-01-01T00:00:00Z"}
                         for m in page],
                "has_more": start + size < len(models), "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None}

    # -- plumbing -------------------------------------------------------------------

    @property
    def provider(self) -> FakeProvider:
        return self.server.provider

    def _read_and_record(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            payload = None
        self.provider._record(RecordedRequest(
            self.command, self.path, CaseInsensitiveDict(self.headers.items()), payload, body))
        return payload

    def _send_json(self, status: int, payload: Any, headers: Optional[Mapping[str, str]] = None) -> None:
        self._send_body(status, json.dumps(payload).encode("utf-8"), "application/json", headers)

    def _send_body(self, status: int, body: bytes, content_type: str,
                   headers: Optional[Mapping[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _embeddings(self, payload: Any) -> None:
        status = self.provider._next_embedding_failure()
        if status is not None:
            message = f"FakeProvider: scripted embeddings failure {status}"
            self._send_json(status, {"error": {"message": message}})
            return
        inputs = payload.get("input") if isinstance(payload, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            message = "FakeProvider: 'input' must be a string or a list of strings"
            self._send_json(400, {"error": {"message": message}})
            return
        dim = self.provider.embedding_dim
        data = [{"object": "embedding", "index": i, "embedding": fake_embedding(t, dim)}
                for i, t in enumerate(inputs)]
        if self.provider.reverse_embeddings:
            data.reverse()
        tokens = sum(len(t.split()) for t in inputs)
        self._send_json(200, {"object": "list", "data": data,
                              "model": payload.get("model") or "fake-embedding",
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def pause(self, seconds: Optional[float] = None, event: Optional[threading.Event] = None) -> bool:
        """Wait for ``seconds`` or ``event``; False if the provider closes or the client left."""
        closing = self.provider._closing
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            if event is not None and event.is_set():
                return True
            if closing.is_set():
                return False
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return True
            slice_s = wire_steps._POLL_S if remaining is None else min(remaining, wire_steps._POLL_S)
            (event or closing).wait(slice_s)
            if self.client_gone():
                return False

    def client_gone(self) -> bool:
        """True once the client closed its end (a readable socket that peeks empty)."""
        sock: socket.socket = self.connection
        try:
            if hasattr(select, "poll"):  # select() fails on descriptors above 1023
                poller = select.poll()
                poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
                if not poller.poll(0):
                    return False
            elif not select.select([sock], [], [], 0)[0]:
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True
