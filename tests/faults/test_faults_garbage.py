"""Garbage on the wire: invalid UTF-8, invalid JSON, wrong shapes, lines larger than the buffer cap.

Rules: invalid UTF-8 is replaced (U+FFFD), never fatal; a frame that is not
JSON (or not a JSON object) is a protocol error; a JSON object of the wrong
shape is ignored field by field, never a crash (nothing but an ``LlmError``
may leave the client); a line over the event cap is refused with a clear
error while memory stays bounded and the socket is closed, so the server
cannot make the client read (or hold) the rest.
"""
from __future__ import annotations

import json

import pytest
from faultkit import DONE, GUARD_S, MESSAGES, finish_frame, frame, stream_threads, streaming
from faultkit_rawserver import STREAM_HEADERS_CLOSE, RawConn, RawServer
from http_support import provider_fixtures
from rawwire import outcomes_of, peak_while_refused, random_bodies

from streamengine._calls.failover import ErrorClass, ErrorClassifier
from streamengine._clients.http.sse_read import MAX_EVENT_BYTES
from streamengine._clients.openai.client import OpenAICompatibleClient
from streamengine._errors import LlmHttpError, LlmProtocolError
from streamengine._wait import drive
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MB = 1 << 20
fp, client = provider_fixtures("openai")


# --- invalid UTF-8 --------------------------------------------------------------------------------

def _content_bytes(raw_text: bytes) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + raw_text + b'"}}]}\n\n'


UTF8 = [
    (b"a\xffb", "a\ufffdb"),  # a byte that is never UTF-8
    (b"a\xc3(b", "a\ufffd(b"),  # a lead byte without its continuation
    (b"\xc0\xaf", "\ufffd\ufffd"),  # an overlong "/"
    (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),  # an encoded surrogate
    (b"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"),  # beyond U+10FFFF
    (b"caf\xc3\xa9 \xe2\x82\xac", "caf\u00e9 \u20ac"),  # valid, for contrast
]


@pytest.mark.parametrize("raw_text, expected", UTF8, ids=[repr(r) for r, _ in UTF8])
def test_invalid_utf8_is_replaced_even_when_written_one_byte_at_a_time(raw_text, expected):
    body = _content_bytes(raw_text) + finish_frame() + DONE

    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CLOSE)
        for i in range(len(body)):  # every character split across reads
            if not conn.send(body[i:i + 1]):
                return

    with RawServer(script) as server, OpenAICompatibleClient(server.base_url) as client:
        response = drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES))
    assert response.content == expected


# --- invalid JSON and wrong shapes --------------------------------------------------------------------

NOT_JSON = [
    ("data: {oops\n\n", "not JSON"),
    ("data: {\"choices\": [}\n\n", "not JSON"),
    ("data: \n\n", "not JSON"),
    ("data: [1, 2]\n\n", "not a JSON object"),
    ("data: \"a string\"\n\n", "not a JSON object"),
    ("data: null\n\n", "not a JSON object"),
    ("data: <html>\n\n", "not JSON"),
]


@pytest.mark.parametrize("wire, says", NOT_JSON, ids=[w.strip() for w, _ in NOT_JSON])
def test_a_frame_that_is_not_a_json_object_is_a_protocol_error(client, fp, wire, says):
    seen = []
    fp.add_turn(s.text("before"), s.raw(wire), s.text("after"))
    with pytest.raises(LlmProtocolError, match=says) as info:
        drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES, on_chunk=seen.append))
    assert ErrorClassifier().classify(info.value) is ErrorClass.TRANSIENT_ADVANCE
    assert [c.content for c in seen if c.content] == ["before"]


WRONG_SHAPES = [
    {"choices": "x"}, {"choices": [5, None]}, {"choices": [{"delta": "x"}]},
    {"choices": [{"delta": {"content": 5}}]}, {"choices": [{"delta": {"content": {"a": 1}}}]},
    {"choices": [{"delta": {"tool_calls": "x"}}]}, {"choices": [{"delta": {"tool_calls": [5, None, "a"]}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": "0", "id": 5, "function": {"name": 5}}]}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": True, "id": "z", "function": "f"}]}}]},
    {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": ["n"]}}]}}]},
    {"choices": [{"delta": {"reasoning_content": 5, "reasoning": ["x"]}}]},
    {"choices": [{"finish_reason": 7}]}, {"choices": [{"finish_reason": {"a": 1}}]},
    {"usage": "x"}, {"usage": {"prompt_tokens": "x"}}, {"usage": {"prompt_tokens": -5}},
    {"usage": {"total_tokens": [1]}}, {"model": 5}, {"error": None}, {"error": 0}, {"error": []},
]


def test_frames_of_the_wrong_shape_are_ignored_never_a_crash(client, fp):
    wire = "".join("data: " + json.dumps(f) + "\n\n" for f in WRONG_SHAPES)
    # 1e400 is not valid JSON for json.dumps, but json.loads reads it as inf: an int() of it overflows.
    wire += 'data: {"usage": {"prompt_tokens": 1e400, "completion_tokens": 1}}\n\n'
    wire += 'data: {"usage": {"prompt_tokens": NaN}}\n\n'
    fp.add_turn(s.text("a"), s.raw(wire), s.text("b"))
    response = drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES))
    assert response.content == "ab"
    assert response.tool_calls == ()
    assert response.usage is not None and response.usage.prompt_tokens == 1  # FakeProvider's own usage frame
    assert response.finish_reason == "stop"


def test_sloppy_but_meaningful_shapes_are_kept(client, fp):
    """Lose nothing: a choice with a null or "0" index, content as a list of text parts."""
    fp.add_turn(s.raw(frame({"choices": [{"index": None, "delta": {"content": "one "}}]})),
                s.raw(frame({"choices": [{"index": "0", "delta": {"content": "two "}}]})),
                s.raw(frame({"choices": [{"index": 0, "delta": {"content": [
                    {"type": "text", "text": "three"}, {"type": "image_url", "image_url": {}}]}}]})),
                s.raw(frame({"choices": [{"index": 1, "delta": {"content": "other choice"}}]})))
    assert drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES)).content == "one two three"


def test_garbage_through_the_whole_complete_path(client, fp):
    fp.add_turn(s.raw(json.dumps({"choices": [{"index": 0, "message": {
        "content": [{"type": "text", "text": "whole"}],
        "tool_calls": [{"id": 7, "function": {"name": ["x"], "arguments": {"a": 1}}}]}}],
        "usage": {"prompt_tokens": 1e300 * 10}})))
    response = client.complete(MESSAGES)
    assert response.content == "whole" and response.usage is None
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("call_0", "", '{"a": 1}')]


# --- a line larger than the buffer cap --------------------------------------------------------------

def _endless_line(total: int, sent: list):
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CLOSE + b"data: ")
        piece = b"x" * 65536
        while sent[0] < total:
            if not conn.send(piece):
                return
            sent[0] += len(piece)
    return script


def test_a_50mb_line_without_newline_is_refused_with_bounded_memory():
    sent = [0]
    with RawServer(_endless_line(50 * MB, sent)) as server, OpenAICompatibleClient(server.base_url) as client:
        info, peak = peak_while_refused(lambda: drive(streaming(client, GUARD_S, GUARD_S).stream_call(MESSAGES)),
                                        LlmProtocolError)
        assert stream_threads() == []
        assert server.peer_closed.wait(GUARD_S)  # the client hung up instead of reading on
    assert f"an SSE event grew past {MAX_EVENT_BYTES} bytes" in str(info.value)
    assert "not sending SSE events one by one" in str(info.value)
    assert peak < 3 * MAX_EVENT_BYTES, f"peak {peak / MB:.1f} MB while refusing one line"
    # The server could only push what fits in the cap plus socket buffers: far from 50 MB.
    assert sent[0] < 50 * MB


def test_a_huge_error_body_is_cut_and_memory_stays_bounded():
    sent = [0]

    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        piece = b"overloaded " * 6000
        while sent[0] < 50 * MB:
            if not conn.send(piece):
                return
            sent[0] += len(piece)

    with RawServer(script) as server, OpenAICompatibleClient(server.base_url) as client:
        info, peak = peak_while_refused(lambda: drive(streaming(client, GUARD_S, GUARD_S).stream_call(MESSAGES)),
                                        LlmHttpError)
        assert server.peer_closed.wait(GUARD_S)
    assert info.value.status_code == 503 and len(info.value.body) <= 1024
    assert info.value.body.startswith("overloaded overloaded")
    assert peak < 4 * MB
    assert sent[0] < 50 * MB


def test_only_llm_errors_leave_the_client_for_random_bytes():
    """Random bytes after valid headers: whatever happens, it is an LlmError or an answer."""
    alphabet = [b"data: ", b"\n", b"\r", b"\n\n", b"{", b"}", b"[DONE]", b'"', b":", b"event: error",
                b"\xff", b"\x00", b'{"choices":[{"delta":{"content":"x"}}]}', b'{"error":{}}', b"0"]
    bodies = random_bodies(7, alphabet, 60)
    outcomes = outcomes_of(OpenAICompatibleClient, bodies)
    assert len(outcomes) == len(bodies)


def test_a_lone_surrogate_in_the_conversation_is_sent_escaped(client, fp):
    """A model can send ``\\ud83d`` (JSON-escaped) and it comes back in the next round's messages."""
    fp.add_turn(s.text("ok"))
    drive(streaming(client, 5.0, 10.0).stream_call([{"role": "user", "content": "lone \ud83d surrogate"}]))
    body = fp.requests[0].body
    assert body.isascii() and b"\\ud83d" in body
    assert json.loads(body)["messages"][0]["content"] == "lone \ud83d surrogate"
