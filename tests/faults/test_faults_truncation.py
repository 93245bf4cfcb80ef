"""Truncation: a cut body is a broken stream, never a complete answer.

Byte-exact through a raw-socket server: closed mid-JSON on chunked and
close-delimited bodies, a Content-Length never reached, a trailing frame
without its blank line (WHATWG: not dispatched), a clean end with neither
``[DONE]`` nor a finish reason.  Each must raise ``LlmStreamError``
(classified ``TRANSIENT_ADVANCE``) from the call, with no partial
``Response``; through failover the next model's answer is returned alone.
"""
from __future__ import annotations

import pytest
from faultkit import DONE, MESSAGES, content_frame, finish_frame, stream_threads, streaming
from faultkit_rawserver import STREAM_HEADERS_CHUNKED, STREAM_HEADERS_CLOSE, RawConn, RawServer, chunk

from streamengine._calls.failover import ErrorClass, ErrorClassifier, ModelFailover
from streamengine._clients.openai.client import OpenAICompatibleClient
from streamengine._errors import AllModelsFailedError, LlmStreamError
from streamengine._wait import drive
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

CUT_JSON = b'data: {"choices":[{"index":0,"delta":{"content":"cut he'
LENGTH_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 4096\r\n\r\n"


def answer(headers: bytes, body: bytes):
    """A script that sends ``headers`` and ``body`` and then closes the connection."""
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(headers + body)
    return script


BROKEN = [
    # id, headers, body (the connection is closed right after), what the message must say
    ("chunked-closed-mid-json", STREAM_HEADERS_CHUNKED, chunk(content_frame("a")) + chunk(CUT_JSON),
     "broke after 1 events"),
    ("chunked-closed-mid-chunk", STREAM_HEADERS_CHUNKED, chunk(content_frame("a")) + b"200\r\n" + CUT_JSON,
     "broke after 1 events"),
    ("chunked-closed-before-terminator", STREAM_HEADERS_CHUNKED, chunk(content_frame("a")),
     "broke after 1 events"),
    ("close-delimited-closed-mid-json", STREAM_HEADERS_CLOSE, content_frame("a") + CUT_JSON,
     f"ended without a finish reason or [DONE] after 1 events ({len(CUT_JSON)} bytes of an unfinished"),
    ("content-length-never-reached", LENGTH_HEADERS, content_frame("a") + finish_frame(),
     "broke after 2 events"),
    ("trailing-finish-frame-without-blank-line-close", STREAM_HEADERS_CLOSE,
     content_frame("a") + finish_frame()[:-1], "ended without a finish reason or [DONE] after 1 events"),
    ("trailing-finish-frame-without-blank-line-chunked", STREAM_HEADERS_CHUNKED,
     chunk(content_frame("a") + finish_frame()[:-1]) + b"0\r\n\r\n",
     "ended without a finish reason or [DONE] after 1 events"),
    ("trailing-done-without-blank-line", STREAM_HEADERS_CLOSE, content_frame("a") + DONE[:-1],
     "ended without a finish reason or [DONE] after 1 events (12 bytes of an unfinished"),
    ("clean-end-without-finish-or-done-chunked", STREAM_HEADERS_CHUNKED, chunk(content_frame("a")) + b"0\r\n\r\n",
     "ended without a finish reason or [DONE] after 1 events;"),
    ("clean-end-without-finish-or-done-close", STREAM_HEADERS_CLOSE, content_frame("a") + content_frame("b"),
     "ended without a finish reason or [DONE] after 2 events;"),
]


@pytest.mark.parametrize("headers, body, says", [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_a_cut_stream_is_a_broken_stream_never_an_answer(headers, body, says):
    seen = []
    with RawServer(answer(headers, body)) as server, OpenAICompatibleClient(server.base_url) as client:
        with pytest.raises(LlmStreamError) as info:
            drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES, on_chunk=seen.append))
        assert stream_threads() == []
    assert says in str(info.value)
    assert "retry or fail over" in str(info.value)
    assert ErrorClassifier().classify(info.value) is ErrorClass.TRANSIENT_ADVANCE
    assert not any(c.is_completed for c in seen)  # the caller never saw a completion


COMPLETE = [
    # The control group: these are complete, and must stay so.
    ("finish-then-clean-end", STREAM_HEADERS_CLOSE, content_frame("a") + finish_frame()),
    ("finish-then-done-without-blank-line", STREAM_HEADERS_CLOSE, content_frame("a") + finish_frame() + DONE[:-1]),
    ("done", STREAM_HEADERS_CHUNKED, chunk(content_frame("a") + DONE) + b"0\r\n\r\n"),
]


@pytest.mark.parametrize("headers, body", [c[1:] for c in COMPLETE], ids=[c[0] for c in COMPLETE])
def test_a_finish_reason_or_done_completes(headers, body):
    with RawServer(answer(headers, body)) as server, OpenAICompatibleClient(server.base_url) as client:
        response = drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES))
    assert response.content == "a"


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_a_broken_stream_fails_over_and_only_the_next_answer_is_returned(framing):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("partial from a "), s.drop())
        fp.add_turn(s.text("whole answer from b"))
        result = drive(ModelFailover(streaming(client, 5.0, 10.0), ["a", "b"]).stream_call(MESSAGES))
    assert result.model == "b" and result.response.content == "whole answer from b"
    assert [(model, type(exc)) for model, exc in result.attempts] == [("a", LlmStreamError)]


def test_every_model_cut_off_is_all_models_failed_not_an_answer():
    with FakeProvider(framing="close") as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("a1"), s.end())
        fp.add_turn(s.text("b1"), s.raw(finish_frame()[:-1]), s.end())
        with pytest.raises(AllModelsFailedError) as info:
            drive(ModelFailover(streaming(client, 5.0, 10.0), ["a", "b"]).stream_call(MESSAGES))
    assert [m for m, _ in info.value.attempts] == ["a", "b"]
    assert all(isinstance(exc, LlmStreamError) for _, exc in info.value.attempts)


# --- after [DONE] ---------------------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_streams_reuse_one_connection(framing):
    """The rest of a chunked body after [DONE] is read (briefly), so urllib3 can pool the connection:
    closing it unread had cost every streamed call a new TCP (and TLS) handshake."""
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.respond_with(lambda payload: [s.text("x")])
        for _ in range(5):
            assert drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES)).content == "x"
        assert fp.request_count == 5 and fp.connection_count == 1


def test_a_provider_that_holds_the_body_open_after_done_does_not_hold_the_answer():
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.text("complete"), s.done(), s.stall())
        fp.add_turn(s.text("next"))
        assert drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES)).content == "complete"
        assert fp.wait_for_client_disconnects(1)  # that connection was closed, not pooled half-read
        assert drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES)).content == "next"
        assert fp.connection_count == 2
