"""Stalls: the right timeout fires, the socket is shut down, the producer thread ends.

Through calls as the engine makes them (``engine_calls``) with a small idle timer (0.2 s) and cap
(0.8 s), against a raw-socket server (byte-exact) and FakeProvider.

Which timeout, and why (issue 2's rules):

* Only a *meaningful* chunk resets the idle timer.  Headers then nothing,
  keep-alive comments, ``event: ping`` frames and empty deltas all bring
  zero meaningful chunks, so the idle timer fires first, with the
  zero-chunk message: ``no response received within 0.2s`` -- verb
  ``unavailable``.  A socket read timeout could never catch the keep-alive
  cases (each frame resets it); the timer lives where chunks are read.
* One byte every 0.5 s never completes a frame: bytes arrive (again, no
  socket timeout would fire), yet no chunk is ever parsed, let alone a
  meaningful one.  So it is the same case: the idle timer fires with the
  zero-chunk message at 0.2 s.  When the idle timeout is longer than the
  cap, the cap fires first and the zero-chunk message names the cap: when
  the cap fires before any meaningful chunk, the "no response received
  within Ns" message is used with the cap as N.
* Meaningful chunks, then only keep-alives: the idle message with M.
* Meaningful chunks that never stop: the cap message with M.
"""
from __future__ import annotations

import threading

import pytest
from engine_calls import Cancelled
from faultkit import EMPTY_DELTA, GUARD_S, KEEP_ALIVE, MESSAGES, PING, content_frame, stream_threads, streaming
from faultkit_rawserver import STREAM_HEADERS_CHUNKED, STREAM_HEADERS_CLOSE, RawConn, RawServer, chunk

from streamengine import ErrorClass, ErrorClassifier, LlmTimeoutError, OpenAICompatibleClient
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

IDLE, CAP = 0.2, 0.8
NO_RESPONSE = "LLM streaming: no response received within {:g}s (model may be unavailable or overloaded)"
IDLE_MSG = "LLM streaming idle timeout: no meaningful chunk received for {:g}s (after {} chunks)"
CAP_MSG = "LLM streaming completion timeout: stream exceeded the {:g}s cap (after {} chunks)"


# --- byte-exact scripts -------------------------------------------------------------------------

def headers_then_nothing(headers: bytes):
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(headers)
        conn.wait_gone()
    return script


def no_headers(conn: RawConn) -> None:
    conn.read_request()
    conn.wait_gone()


def forever(frame: bytes, every: float = 0.05, first: bytes = b""):
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CHUNKED)
        if first:
            conn.send(chunk(first))
        while conn.send(chunk(frame)) and conn.pause(every):
            pass
    return script


def one_byte_every(interval: float):
    def script(conn: RawConn) -> None:
        conn.read_request()
        conn.send(STREAM_HEADERS_CLOSE)
        for byte in content_frame("never completes in time"):
            if not conn.pause(interval) or not conn.send(bytes([byte])):
                return
    return script


CASES = [
    # id, script, idle, cap, expected message, verb, meaningful chunks
    ("headers-then-nothing-chunked", headers_then_nothing(STREAM_HEADERS_CHUNKED), IDLE, CAP,
     NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("headers-then-nothing-close", headers_then_nothing(STREAM_HEADERS_CLOSE), IDLE, CAP,
     NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("no-headers-at-all", no_headers, IDLE, CAP, NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("keep-alive-comments-forever", forever(KEEP_ALIVE), IDLE, CAP, NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("ping-events-forever", forever(PING), IDLE, CAP, NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("empty-deltas-forever", forever(EMPTY_DELTA), IDLE, CAP, NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("one-byte-every-0.5s", one_byte_every(0.5), IDLE, CAP, NO_RESPONSE.format(IDLE), "unavailable", 0),
    ("one-byte-every-0.5s-cap-first", one_byte_every(0.5), 5.0, 0.4, NO_RESPONSE.format(0.4), "unavailable", 0),
    ("chunks-then-keep-alives", forever(KEEP_ALIVE, first=content_frame("a") + content_frame("b")), IDLE, CAP,
     IDLE_MSG.format(IDLE, 2), "timed out", 2),
    ("chunks-then-pings", forever(PING, first=content_frame("a")), IDLE, CAP, IDLE_MSG.format(IDLE, 1),
     "timed out", 1),
]


@pytest.mark.parametrize("script, idle, cap, message, verb, meaningful",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_stall_fires_the_right_timeout_and_closes_the_socket(script, idle, cap, message, verb, meaningful):
    with RawServer(script) as server, OpenAICompatibleClient(server.base_url) as client:
        with pytest.raises(LlmTimeoutError) as info:
            streaming(client, idle, cap).call(MESSAGES)
        # The producer thread was joined before the error was raised.
        assert stream_threads() == []
        # The server sees the connection go away (shut down, not left open until the guard).
        assert server.peer_closed.wait(GUARD_S)
    error = info.value
    assert str(error) == message
    fired = cap if f"{cap:g}s" in message else idle  # which limit the message names
    assert (error.verb, error.timeout_s, error.chunks_received) == (verb, fired, meaningful)
    assert ErrorClassifier().classify(error) is ErrorClass.TRANSIENT_ADVANCE


def test_meaningful_chunks_that_never_stop_hit_the_cap():
    with RawServer(forever(content_frame("x"))) as server, OpenAICompatibleClient(server.base_url) as client:
        with pytest.raises(LlmTimeoutError) as info:
            streaming(client, IDLE, CAP).call(MESSAGES)
        assert stream_threads() == []
        assert server.peer_closed.wait(GUARD_S)
    error = info.value
    assert error.chunks_received > 0
    assert str(error) == CAP_MSG.format(CAP, error.chunks_received)
    assert (error.verb, error.timeout_s) == ("timed out", CAP)


# --- the same through FakeProvider ----------------------------------------------------------------

FAKE_IDLE = 0.2
FAKE_CASES = [
    ("stall-before-headers", [s.stall_before_headers()], NO_RESPONSE.format(FAKE_IDLE)),
    ("headers-then-stall", [s.stall()], NO_RESPONSE.format(FAKE_IDLE)),
    ("keep-alive-forever", [s.forever(s.comment())], NO_RESPONSE.format(FAKE_IDLE)),
    ("ping-forever", [s.forever(s.ping_event())], NO_RESPONSE.format(FAKE_IDLE)),
    ("empty-delta-forever", [s.forever(s.empty_delta())], NO_RESPONSE.format(FAKE_IDLE)),
    ("trickle", [s.trickle('data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', 0.5)],
     NO_RESPONSE.format(FAKE_IDLE)),
    ("text-then-keep-alives", [s.text("a"), s.forever(s.comment())], IDLE_MSG.format(FAKE_IDLE, 1)),
]


# Every case on chunked and close-delimited bodies; two on Content-Length bodies (enough
# to show the length is never reached: keep them cheap, each case costs an idle timeout).
FAKE_MATRIX = [(framing, *case) for framing in ("chunked", "close") for case in FAKE_CASES] + [
    ("length", *case) for case in FAKE_CASES if case[0] in ("headers-then-stall", "keep-alive-forever")]


@pytest.mark.parametrize("framing, turn, message", [c[:1] + c[2:] for c in FAKE_MATRIX],
                         ids=[f"{c[1]}-{c[0]}" for c in FAKE_MATRIX])
def test_stalls_through_fake_provider(framing, turn, message):
    with FakeProvider(framing=framing) as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(*turn)
        with pytest.raises(LlmTimeoutError) as info:
            streaming(client, FAKE_IDLE, CAP).call(MESSAGES)
        assert stream_threads() == []
        assert fp.wait_for_client_disconnects(1, GUARD_S), "the provider never saw the client go away"
    assert str(info.value) == message


def test_a_caller_cancel_during_a_stall_closes_the_socket_and_ends_the_producer():
    with RawServer(forever(KEEP_ALIVE)) as server, OpenAICompatibleClient(server.base_url) as client:
        cancel = threading.Event()  # a plain Event: bridged by a watcher thread, which must end too
        timer = threading.Timer(0.1, cancel.set)
        timer.start()
        with pytest.raises(Cancelled) as info:
            streaming(client, 30.0, 60.0).call(MESSAGES, cancel=cancel)
        assert info.value.result.telemetry.stop_reason == "cancelled"
        timer.join()
        assert stream_threads() == []
        assert server.peer_closed.wait(GUARD_S)


# --- a provider that does not even accept the connection ----------------------------------------------

@pytest.fixture
def full_queue():
    from faultkit_rawserver import FullAcceptQueue

    with FullAcceptQueue() as queue:
        if not queue.stalls:
            pytest.skip("this OS completes connects to a full accept queue; cannot make a connect hang")
        yield queue


def test_a_connect_that_hangs_fires_the_idle_timer_on_time_and_ends_the_producer(full_queue):
    """The connect is abortable: the call ends at the idle timeout, not at the connect timeout.

    Before the fix, urllib3 kept the connecting socket to itself: the error
    came only after the producer join gave up (2 s) and the producer thread
    lived on until the 10 s connect timeout.
    """
    with OpenAICompatibleClient(full_queue.base_url, connect_timeout=GUARD_S) as client:
        with pytest.raises(LlmTimeoutError) as info:
            streaming(client, IDLE, CAP).call(MESSAGES)
        assert stream_threads() == []  # joined, not abandoned mid-connect
    assert str(info.value) == NO_RESPONSE.format(IDLE)


def test_a_connect_that_hangs_ends_at_the_connect_timeout_as_a_connection_error(full_queue):
    from streamengine import LlmConnectionError

    with OpenAICompatibleClient(full_queue.base_url, connect_timeout=0.2) as client, \
            pytest.raises(LlmConnectionError, match="ConnectTimeout") as info:
        list(client.stream(MESSAGES))
    assert ErrorClassifier().classify(info.value) is ErrorClass.TRANSIENT_ADVANCE


def test_cancel_during_a_hanging_connect_is_prompt(full_queue):
    from streamengine import CancelToken, LlmCancelledError

    cancel = CancelToken()
    with OpenAICompatibleClient(full_queue.base_url, connect_timeout=GUARD_S) as client:
        timer = threading.Timer(0.1, cancel.set)
        timer.start()
        # Waiting out the connect timeout would raise LlmConnectionError (ConnectTimeout), not a cancel.
        with pytest.raises(LlmCancelledError):
            list(client.stream(MESSAGES, cancel=cancel))
        timer.join()
