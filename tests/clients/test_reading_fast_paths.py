"""The reading layer's fast paths give what its general paths give, on the same bytes.

Three fast paths stand in for general code on the shape nearly every read
has: a read of one (or several) whole HTTP chunks (``SocketBody._dechunk``),
a read of whole one-line ``data:`` events (``SseFramer.feed_fields``), and a
text-only OpenAI frame (``StreamParser._chunk_from_frame``, ``text_chunk``).
Each is checked against an oracle that shares no code with it (http.client,
the WHATWG parser of tests/support/sse_spec_parser.py, the general frame path), on
the common shape and the odd ones, split at every offset; and over real HTTP
(a raw socket server, FakeProvider), where a wrong fast path changes the answer.
Last, the connection's cancel tracker on a plain ``requests`` session.

Private on purpose: these are the transport's own algorithms (chunked decoding,
SSE framing, the frame parser, aborting a request before its headers), each
checked against an oracle at byte offsets no HTTP test can choose; what a user
sees of them is in test_openai.py, test_anthropic.py and the fault tests.
"""
from __future__ import annotations

import dataclasses
import http.client
import io
import itertools
import json
import pickle
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Sequence, Tuple

import pytest
import requests
from faultkit_rawserver import STREAM_HEADERS_CHUNKED, RawConn, RawServer, chunk
from http_support import MESSAGES
from sse_spec_parser import parse_pieces

from streamengine import Chunk, OpenAICompatibleClient
from streamengine._clients import openai as openai_parse
from streamengine._clients.http.body import SocketBody
from streamengine._clients.http.connection import RequestTracker, mount_cancellable, tracking
from streamengine._clients.http.sse_read import SseFramer, iter_event_batches
from streamengine._messages import text_chunk
from streamengine._wait import Wait
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s


def frame(delta: Any, finish: Any = None, **extra: Any) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def splits(wire: bytes, pieces: int = 2) -> Iterator[List[bytes]]:
    """``wire`` whole, byte by byte, and cut at every offset (every pair of offsets for ``pieces=3``)."""
    yield [wire]
    yield [wire[i:i + 1] for i in range(len(wire))]
    for cuts in itertools.combinations(range(1, len(wire)), pieces - 1):
        bounds = (0,) + cuts + (len(wire),)
        yield [wire[a:b] for a, b in zip(bounds, bounds[1:])]


# --- SSE: whole one-line data events are split at once ------------------------------------------

PACED = frame({"content": " w"}) * 3
SSE_WIRES = {
    "paced": PACED,
    "non-ascii": "data: t\u00e9\u20ac\U0001F600\n\ndata: \u4f60\u597d\n\n".encode(),
    "odd-events": (b"data: a\n\ndata:b\n\n: comment\n\ndata: x\ndata: y\n\nevent: e\ndata: f\n\n"
                   b"data: \n\ndata: z\n\n\n\ndata: after\n\n"),
    "three-newlines": b"data: a\n\ndata: b\n\n\ndata: c\n\n",
    "other-fields": b"data: a\n\nevent: x\n\n: comment\n\ndata:b\n\nid: 1\n\nretry: 5\n\n",
    "data-like-value": b"data: a data: b\n\ndata: data: \n\n",
    "cr": b"data: x\n\ndata: a\rdata: b\n\ndata: c\r\n\r\ndata: d\n\n",
    "invalid-utf8": b"data: \xff\n\ndata: \xe2\x82\xac\n\ndata: \xed\xa0\x80\n\n",
    "bom": b"\xef\xbb\xbf" + PACED,
    "unfinished": PACED + b"data: cut",
}


def framed(reads: Sequence[bytes]) -> List[Tuple[str, str]]:
    return list(itertools.chain.from_iterable(iter_event_batches(reads, SseFramer())))


@pytest.mark.parametrize("name", sorted(SSE_WIRES))
def test_the_events_are_what_a_browser_dispatches_wherever_the_reads_split(name):
    wire = SSE_WIRES[name]
    for reads in splits(wire, pieces=3 if len(wire) < 80 else 2):
        expected = [(e.type, e.data) for e in parse_pieces(reads).events]
        assert framed(reads) == expected, reads


def test_reads_of_whole_events_take_the_fast_path_after_the_first(monkeypatch):
    held = []
    general = SseFramer._feed_held
    monkeypatch.setattr(SseFramer, "_feed_held", lambda self, data: held.append(data) or general(self, data))
    reads = [frame({"content": f" t{i}"}) for i in range(5)] + ["data: \u00e9\n\n".encode() * 3]
    assert framed(reads) == [("message", r[6:-2].decode()) for r in reads[:5]] + [("message", "\u00e9")] * 3
    assert held == reads[:1]  # only the stream's first bytes (they might start with a BOM)


def test_after_a_held_event_or_a_cr_the_general_path_reads_on():
    framer = SseFramer()
    assert framer.feed_fields(b"data: a\n\ndata: b") == [("message", "a")]
    assert framer.feed_fields(b"c\n\n") == [("message", "bc")]  # held bytes first
    assert framer.feed_fields(b"data: d\n\n") == [("message", "d")]
    assert framer.feed_fields(b"data: e\r\n\r\n") == [("message", "e")]
    assert framer.feed_fields(b"data: f\rdata: g\n\n") == [("message", "f\ng")]  # CR: never the fast path again


# --- HTTP chunks: a read of whole chunks is sliced at once --------------------------------------

CHUNKED_WIRES = {
    "one-chunk-reads": chunk(b"hello") + chunk(b"data: x\n\n") + chunk(b"w" * 300) + b"0\r\n\r\n",
    "extension-and-case": b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n1a \r\n" + b"z" * 26 + b"\r\n0\r\n\r\n",
    "lf-lines": b"5\nhello\r\n3\nabc\r\n0\n\n",
    "data-like-a-chunk": b"5\r\n3\nabc\r\n0\r\n\r\n",  # read from inside the data, "3\nabc\r\n" is not a chunk
    "trailers": chunk(b"abc") + b"0\r\nX-Trailer: 1\r\n\r\n",
}


def http_client_payload(wire: bytes) -> bytes:
    """What http.client makes of the chunked body ``wire``: the oracle (it shares no code with ours)."""
    class Sock:
        def makefile(self, mode: str) -> io.BytesIO:
            return io.BytesIO(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire)
    resp = http.client.HTTPResponse(Sock())  # type: ignore[arg-type]
    resp.begin()
    return resp.read()


def socket_payload(reads: Sequence[bytes]) -> Tuple[bytes, SocketBody]:
    """The body's payload read from a real socket, each of ``reads`` arriving as one read."""
    ours, theirs = socket.socketpair()
    try:
        body = SocketBody(None, ours, b"", True, None)  # type: ignore[arg-type]
        items = iter(body.reads())
        assert next(items).__class__ is Wait
        out = []
        for data in reads:
            theirs.sendall(data)
            for item in items:
                if item.__class__ is Wait:
                    break
                out.append(item)
        return b"".join(out), body
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("name", sorted(CHUNKED_WIRES))
def test_the_payload_is_what_http_client_reads_wherever_the_reads_split(name):
    wire = CHUNKED_WIRES[name]
    expected = http_client_payload(wire)
    for reads in splits(wire, pieces=3 if len(wire) < 40 else 2):
        payload, body = socket_payload(reads)
        assert (payload, body.ended, body.extra) == (expected, True, False), reads


def test_bytes_after_the_end_in_its_read_keep_the_connection_from_the_pool():
    end = chunk(b"abc") + b"0\r\n\r\n"
    for reads, extra in [([end + b"HTTP/1.1"], True), ([chunk(b"abc"), b"0\r\n\r\nHTTP"], True), ([end], False)]:
        payload, body = socket_payload(reads)
        assert (payload, body.ended, body.extra) == (b"abc", True, extra), reads


def test_a_read_of_one_whole_chunk_is_sliced_without_the_steps(monkeypatch):
    steps, scans = [], []
    general, whole = SocketBody._step, SocketBody._whole_chunks
    monkeypatch.setattr(SocketBody, "_step", lambda self, *a: steps.append(a[1]) or general(self, *a))
    monkeypatch.setattr(SocketBody, "_whole_chunks", staticmethod(lambda *a: scans.append(a[1]) or whole(*a)))
    reads = [chunk(b"data: %d\n\n" % i) for i in range(20)]
    assert socket_payload(reads + [chunk(b"a") + chunk(b"bc") + b"0\r\n\r\n"])[0] == b"".join(
        b"data: %d\n\n" % i for i in range(20)) + b"abc"
    assert len(steps) == 2  # the last read only: its last chunk's size line, then the empty line
    assert scans == [0]  # a read of one chunk is sliced at once; the last read, of several, is scanned


def test_garbage_and_a_too_long_size_line_are_refused_as_before():
    with pytest.raises(http.client.IncompleteRead):
        socket_payload([b"zz\r\nhello\r\n"])
    with pytest.raises(http.client.IncompleteRead):
        socket_payload([b"-2\r\n"])
    with pytest.raises(http.client.LineTooLong):
        socket_payload([b"1" * 5000])


# --- over real HTTP: the client's answer is the same however the provider cuts its bytes ---------

TOKENS = [f" t{i}\u00e9" if i % 7 == 0 else f" t{i}" for i in range(40)]
FRAMES = [frame({"content": t}) for t in TOKENS]
FINISH = frame({}, "stop") + b"data: [DONE]\n\n"


def _sends(kind: str) -> List[bytes]:
    if kind == "one-chunk-per-frame":
        return [chunk(f) for f in FRAMES] + [chunk(FINISH) + b"0\r\n\r\n"]
    if kind == "burst":
        return [b"".join(chunk(f) for f in FRAMES) + chunk(FINISH) + b"0\r\n\r\n"]
    if kind == "frames-across-chunks":  # an SSE frame cut by an HTTP chunk's end
        wire = b"".join(FRAMES) + FINISH
        return [chunk(wire[i:i + 37]) for i in range(0, len(wire), 37)] + [b"0\r\n\r\n"]
    # chunks cut by the reads: in the size line, in the data, in the CRLF after it
    wire = b"".join(chunk(f) for f in FRAMES) + chunk(FINISH) + b"0\r\n\r\n"
    return [wire[i:i + 53] for i in range(0, len(wire), 53)]


@pytest.mark.parametrize("kind", ["one-chunk-per-frame", "burst", "frames-across-chunks", "chunks-across-reads"])
def test_a_stream_reads_the_same_however_the_provider_cuts_it(kind):
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CHUNKED)
        for data in _sends(kind):
            if not conn.send(data) or not conn.pause(0.002):
                return

    with RawServer(script) as server, OpenAICompatibleClient(server.base_url) as client:
        chunks = list(client.stream(MESSAGES))
    assert [c.content for c in chunks[:-2]] == TOKENS
    assert chunks[-2].finish_reason == "stop" and not chunks[-2].is_meaningful
    assert chunks[-1].is_completed and chunks[-1].finish_reason == "stop" and chunks[-1].model == "m"


# --- frames: the text-only fast path makes the Chunk the general path makes ---------------------

ODD_FRAMES = [
    frame({"content": "plain"}),
    frame({"role": "assistant", "content": "with role"}),
    frame({"content": ""}),
    frame({"content": None}),
    frame({"content": 5}),
    frame({"content": [{"type": "text", "text": "parts"}]}),
    frame({"content": "and reasoning", "reasoning_content": "thought"}),
    frame({"content": "refused", "refusal": "no"}),
    frame({"content": "finishing"}, "length"),
    frame({"content": "with usage"}, usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
    frame({"content": "usage null"}, usage=None),
    frame({"content": "call", "tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]}),
    b'data: {"choices":[{"index":"0","delta":{"content":"index as text"}}]}\n\n',
    b'data: {"choices":[{"index":null,"delta":{"content":"index null"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"no index"}}]}\n\n',
    b'data: {"choices":[{"index":true,"delta":{"content":"index true"}}]}\n\n',
    b'data: {"choices":[{"index":0.0,"delta":{"content":"index float"}}]}\n\n',
    b'data: {"choices":[{"index":1,"delta":{"content":"second"}},{"index":0,"delta":{"content":"first"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"two choices"}},{"index":1,"delta":{"content":"x"}}]}\n\n',
    b'data: {"model":7,"choices":[{"index":0,"delta":{"content":"model not text"}}]}\n\n',
    b'data: {"model":"m2","choices":[{"index":0,"delta":{"content":"new model"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":null}]}\n\n',
    b'data: {"choices":{"0":{"delta":{"content":"choices object"}}}}\n\n',
    b'data: {"choices":"text"}\n\n',
    b'data: {"choices":[]}\n\n',
    b'data: {"choices":[["list"]]}\n\n',
    b'data: {"choices":[{"index":0,"delta":"text"}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"finish null"},"finish_reason":null}]}\n\n',
]


def _stream_chunks(steps: List[Any]) -> List[Tuple[Chunk, bool]]:
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(*steps)
        return [(c, c.is_meaningful) for c in client.stream(MESSAGES)]


def test_every_frame_shape_gives_the_chunk_of_the_general_path_over_http(monkeypatch):
    steps: List[Any] = []
    for raw in ODD_FRAMES:
        steps += [s.raw(raw), s.delay(0.002)]  # one HTTP chunk, nearly always one read, per frame
    made = []
    monkeypatch.setattr(openai_parse, "text_chunk", lambda *a: made.append(a) or text_chunk(*a))
    fast = _stream_chunks(steps)
    assert len(made) == 7  # the text-only frames went the fast way
    monkeypatch.setattr(openai_parse.StreamParser, "_chunk_from_frame",
                        openai_parse.StreamParser._chunk_of_any_frame)
    assert fast == _stream_chunks(steps)


def test_a_text_chunk_is_the_chunk_init_makes():
    made, expected = text_chunk("hi", "m"), Chunk("hi", model="m")
    assert made == expected and hash(made) == hash(expected) and repr(made) == repr(expected)
    assert vars(made) == vars(expected) and list(vars(made)) == list(vars(expected))
    assert made.is_meaningful is True and text_chunk("x", None).model is None
    assert pickle.loads(pickle.dumps(made)) == expected
    assert dataclasses.replace(made, content=None) == Chunk(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.content = "changed"  # type: ignore[misc]


# --- the connection's cancel tracker, on its own --------------------------------------------------

def test_request_tracker_aborts_a_plain_requests_call_before_headers():
    outcome: dict = {}
    with FakeProvider() as fp, requests.Session() as session:
        fp.add_turn(s.stall_before_headers())
        mount_cancellable(session)
        tracker = RequestTracker()

        def call() -> None:
            try:
                with tracking(tracker):
                    session.post(fp.base_url + "/chat/completions", json={"stream": True}, stream=True)
            except requests.ConnectionError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        assert fp.wait_for_requests(1)
        tracker.abort()
        thread.join(2)
        assert not thread.is_alive() and "error" in outcome and tracker.aborted
        tracker.release()
        tracker.abort()  # after release: touches nothing


def test_an_aborted_tracker_shuts_a_new_connection_at_birth():
    with FakeProvider() as fp, requests.Session() as session:
        fp.add_turn(*s.reply("never read"))
        mount_cancellable(session)
        tracker = RequestTracker()
        tracker.abort()
        with pytest.raises(requests.ConnectionError), tracking(tracker):
            session.post(fp.base_url + "/chat/completions", json={}, stream=True)


# --- TLS: the socket reader takes SSLSocket.pending() bytes before it waits ---------------------

TLS_DIR = Path(__file__).resolve().parents[1] / "support" / "tls"
TLS_MESSAGES = [{"role": "user", "content": "question"}]


def _chunked(data: str) -> bytes:
    raw = data.encode()
    return b"%x\r\n%s\r\n" % (len(raw), raw)


def _sse(delta: dict, finish=None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


class _TlsProvider:
    """A loopback HTTPS server: per request, 300 frames at once (many TLS records, one read), then 20 paced."""

    def __init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(str(TLS_DIR / "cert.pem"), str(TLS_DIR / "key.pem"))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads = [threading.Thread(target=self._accept, name="test-tls-accept")]
        self.threads[0].start()

    def _accept(self) -> None:
        try:
            raw, _ = self.listener.accept()
        except OSError:
            return  # closed
        with self.context.wrap_socket(raw, server_side=True) as conn:
            while self._answer(conn):
                pass

    def _answer(self, conn: ssl.SSLSocket) -> bool:
        request = b""
        while b"\r\n\r\n" not in request:
            data = conn.recv(65536)
            if not data:
                return False
            request += data
        head, _, body = request.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(body) < length:
            body += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"".join(_chunked(_sse({"content": f" b{i}"})) for i in range(300)))
        for i in range(20):
            conn.sendall(_chunked(_sse({"content": f" p{i}"})))
            time.sleep(0.005)
        conn.sendall(_chunked(_sse({}, "stop")) + _chunked("data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    def close(self) -> None:
        self.listener.close()
        for thread in self.threads:
            thread.join(5)


def test_a_stream_over_tls_is_read_from_the_socket_whole_and_the_connection_is_reused():
    import requests

    from streamengine import EngineConfig, StreamingEngine
    from streamengine._clients.http import body as body_module

    readers = []
    original = body_module.SocketBody.of.__func__

    def spy(cls, resp):
        reader = original(cls, resp)
        readers.append(type(reader._sock).__name__ if reader is not None else None)
        return reader

    provider = _TlsProvider()
    session = requests.Session()
    session.verify, session.trust_env = str(TLS_DIR / "cert.pem"), False
    try:
        body_module.SocketBody.of = classmethod(spy)
        client = OpenAICompatibleClient(f"https://127.0.0.1:{provider.port}/v1", session=session)
        config = EngineConfig(models=["m"], idle_timeout=10, completion_timeout=20)
        with StreamingEngine(client, config=config) as engine:
            answers = [engine.complete(TLS_MESSAGES).answer.split() for _ in range(2)]
    finally:
        body_module.SocketBody.of = classmethod(original)
        session.close()
        provider.close()
    expected = [f"b{i}" for i in range(300)] + [f"p{i}" for i in range(20)]
    assert answers == [expected, expected]
    # both answers came through the socket reader, on one connection (the server answers one only)
    assert readers == ["SSLSocket", "SSLSocket"]
