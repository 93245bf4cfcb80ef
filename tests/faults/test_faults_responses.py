"""The fault cases, on the Responses wire: stalls, cut streams, HTTP classes, in-band errors, garbage.

The same guarantees as the other wires, tested the same way: through
``StreamingCallStrategy`` (idle timer 0.2 s, meaningful chunks only) and
``ModelFailover``, against ``FakeProvider(wire="responses")`` and a
byte-exact raw server.  ``response.in_progress``, structural events and
keep-alive comments are not meaningful, so a model that only sends those is
"unavailable" at the idle timeout; a hosted tool's progress is the model
working.  Failover's back-offs are recorded and fast-forwarded (``RecordedBackoffs``), never waited.
"""
from __future__ import annotations

import json
import threading

import pytest
from backoff_support import RecordedBackoffs
from faultkit import GUARD_S, MESSAGES, stream_threads, streaming
from rawwire import outcomes_of, random_bodies

from streamengine._calls.failover import ErrorClass, ErrorClassifier, ModelFailover
from streamengine._calls.strategies import BufferedCallStrategy
from streamengine._clients.responses.client import OpenAIResponsesClient
from streamengine._errors import AllModelsFailedError, LlmCancelledError, LlmHttpError, LlmStreamError, LlmTimeoutError
from streamengine._messages import CompletionOptions
from streamengine._wait import drive
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

IDLE, CAP = 0.2, 0.8
OPTIONS = CompletionOptions(model="gpt-test")
NO_RESPONSE = "LLM streaming: no response received within {:g}s (model may be unavailable or overloaded)"
IDLE_MSG = "LLM streaming idle timeout: no meaningful chunk received for {:g}s (after {:g} chunks)"
CAP_MSG = "LLM streaming completion timeout: stream exceeded the {:g}s cap (after {:g} chunks)"
classify = ErrorClassifier().classify


def raw_event(kind: str, **payload) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


IN_PROGRESS = s.raw(raw_event("response.in_progress", response={"id": "resp_1", "status": "in_progress"}))
SEARCHING = s.raw(raw_event("response.web_search_call.searching", item_id="ws_1", output_index=0))


@pytest.fixture
def fp():
    with FakeProvider(wire="responses") as provider:
        yield provider


@pytest.fixture
def client(fp):
    with OpenAIResponsesClient(fp.base_url, api_key="sk-faults") as c:
        yield c


@pytest.fixture(scope="module", autouse=True)
def warm_wire():
    """One call first: its one-off costs (imports, connection set-up) must not land inside a 0.2 s idle timer."""
    with FakeProvider(wire="responses") as provider, OpenAIResponsesClient(provider.base_url) as c:
        provider.add_turn(s.text("warm"))
        assert "".join(chunk.content or "" for chunk in c.stream(MESSAGES, options=OPTIONS)) == "warm"


def failover(client, models=("a", "b"), **kwargs):
    return ModelFailover(streaming(client, 5.0, 10.0), list(models), **kwargs)


# --- stalls ---------------------------------------------------------------------------------------

STALLS = [
    ("stall-before-headers", [s.stall_before_headers()], NO_RESPONSE.format(IDLE)),
    ("headers-then-stall", [s.stall()], NO_RESPONSE.format(IDLE)),
    ("keep-alive-forever", [s.forever(s.comment())], NO_RESPONSE.format(IDLE)),
    ("in-progress-forever", [s.forever(IN_PROGRESS)], NO_RESPONSE.format(IDLE)),
    ("empty-delta-forever", [s.forever(s.empty_delta())], NO_RESPONSE.format(IDLE)),
    ("trickle", [s.trickle(raw_event("response.output_text.delta", delta="x"), 0.5)], NO_RESPONSE.format(IDLE)),
    ("text-then-keep-alives", [s.text("a"), s.forever(s.comment())], IDLE_MSG.format(IDLE, 1)),
    ("reasoning-then-stall", [s.reasoning("hmm"), s.stall()], IDLE_MSG.format(IDLE, 1)),
]
STALL_MATRIX = [(framing, *case) for framing in ("chunked", "close") for case in STALLS] + [
    ("length", *case) for case in STALLS if case[0] in ("headers-then-stall", "in-progress-forever")]


@pytest.mark.parametrize("framing, turn, message", [c[:1] + c[2:] for c in STALL_MATRIX],
                         ids=[f"{c[1]}-{c[0]}" for c in STALL_MATRIX])
def test_a_stall_fires_the_idle_timer_and_closes_the_connection(framing, turn, message):
    with FakeProvider(framing=framing, wire="responses") as fp, OpenAIResponsesClient(fp.base_url) as client:
        fp.add_turn(*turn)
        with pytest.raises(LlmTimeoutError) as info:
            drive(streaming(client, IDLE, CAP).stream_call(MESSAGES, options=OPTIONS))
        assert stream_threads() == []
        assert fp.wait_for_client_disconnects(1, GUARD_S), "the provider never saw the client go away"
    assert str(info.value) == message
    assert classify(info.value) is ErrorClass.TRANSIENT_ADVANCE


def test_hosted_tool_progress_is_the_model_working_until_the_cap(fp, client):
    fp.add_turn(s.empty_delta(), s.forever(SEARCHING, every=0.02))
    with pytest.raises(LlmTimeoutError) as info:
        drive(streaming(client, IDLE, CAP).stream_call(MESSAGES, options=OPTIONS))
    assert stream_threads() == [] and fp.wait_for_client_disconnects(1, GUARD_S)
    error = info.value
    assert error.chunks_received > 0 and str(error) == CAP_MSG.format(CAP, error.chunks_received)


def test_text_that_never_stops_hits_the_cap(fp, client):
    fp.add_turn(s.forever(s.text("x"), every=0.02))
    with pytest.raises(LlmTimeoutError) as info:
        drive(streaming(client, IDLE, CAP).stream_call(MESSAGES, options=OPTIONS))
    assert stream_threads() == [] and fp.wait_for_client_disconnects(1, GUARD_S)
    assert str(info.value) == CAP_MSG.format(CAP, info.value.chunks_received)


def test_a_stalled_model_fails_over_to_the_next(fp, client):
    fp.add_turn(s.forever(IN_PROGRESS))
    fp.add_turn(s.text("from b"))
    result = drive(ModelFailover(streaming(client, IDLE, 10.0), ["a", "b"]).stream_call(MESSAGES))
    assert (result.model, result.response.content) == ("b", "from b")
    assert [(m, type(e)) for m, e in result.attempts] == [("a", LlmTimeoutError)]


def test_a_caller_cancel_during_a_stall_ends_the_call_and_the_connection(fp, client):
    fp.add_turn(s.text("a"), s.forever(s.comment()))
    cancel = threading.Event()
    timer = threading.Timer(0.1, cancel.set)
    timer.start()
    with pytest.raises(LlmCancelledError):
        drive(streaming(client, 30.0, 60.0).stream_call(MESSAGES, options=OPTIONS, cancel=cancel))
    timer.join()
    assert stream_threads() == [] and fp.wait_for_client_disconnects(1, GUARD_S)


# --- truncation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_a_dropped_stream_fails_over_and_only_the_next_answer_is_returned(framing):
    with FakeProvider(framing=framing, wire="responses") as fp, OpenAIResponsesClient(fp.base_url) as client:
        fp.add_turn(s.text("partial from a "), s.drop())
        fp.add_turn(s.text("whole answer from b"))
        result = drive(failover(client).stream_call(MESSAGES))
    assert result.model == "b" and result.response.content == "whole answer from b"
    assert [(model, type(exc)) for model, exc in result.attempts] == [("a", LlmStreamError)]


UNFINISHED = "without response.completed or response.incomplete after"
CUTS = [
    ("clean-end-in-an-item", [s.text("a"), s.end()], UNFINISHED),
    ("cut-mid-event", [s.text("a"), s.raw(b'event: response.output_text.delta\ndata: {"type":"resp'), s.end()],
     "bytes of an unfinished event were dropped"),
    ("completed-without-blank-line", [s.text("a"), s.raw(b'data: {"type":"response.completed","response":{}}\n'),
                                      s.end()], UNFINISHED),
    ("call-arguments-cut", [s.tool_call(0, id="call_1", name="t", arguments='{"q": "hal'), s.end()], UNFINISHED),
    ("every-item-done-but-no-completed", [s.text("a"), s.tool_call(0, id="call_1", name="t", arguments="{}"),
                                          s.tool_call(1, id="call_2", name="u", arguments="{}"), s.text("b"),
                                          s.end()], UNFINISHED),
]


@pytest.mark.parametrize("turn, says", [c[1:] for c in CUTS], ids=[c[0] for c in CUTS])
def test_a_cut_stream_is_a_broken_stream_never_an_answer(turn, says):
    with FakeProvider(framing="close", wire="responses") as fp, OpenAIResponsesClient(fp.base_url) as client:
        fp.add_turn(*turn)
        with pytest.raises(LlmStreamError, match=says) as info:
            drive(streaming(client, 5.0, 10.0).stream_call(MESSAGES, options=OPTIONS))
    assert classify(info.value) is ErrorClass.TRANSIENT_ADVANCE


def test_every_model_cut_off_is_all_models_failed(fp, client):
    fp.add_turn(s.text("a1"), s.end())
    fp.add_turn(s.text("b1"), s.drop())
    with pytest.raises(AllModelsFailedError) as info:
        drive(failover(client).stream_call(MESSAGES))
    assert [m for m, _ in info.value.attempts] == ["a", "b"]
    assert all(isinstance(exc, LlmStreamError) for _, exc in info.value.attempts)


# --- HTTP classes ---------------------------------------------------------------------------------

def test_429_waits_the_retry_after_then_retries_the_same_model(fp, client):
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down", "type": "requests",
                                             "code": "rate_limit_exceeded"}}, headers={"retry-after": "2"}))
    fp.add_turn(s.text("answer"))
    waits = RecordedBackoffs()
    result = waits.call(failover(client), MESSAGES)
    assert waits.waits == [2.0]
    assert (result.model, result.response.content, result.failovers) == ("a", "answer", 0)
    assert [r.json["model"] for r in fp.requests] == ["a", "a"]


@pytest.mark.parametrize("status", [500, 503, 404])
def test_server_side_statuses_fail_over_to_the_next_model(fp, client, status):
    fp.add_turn(s.http_error(status, {"error": {"message": "nope", "type": "server_error"}}))
    fp.add_turn(s.text("from b"))
    result = drive(failover(client).stream_call(MESSAGES))
    assert (result.model, result.response.content) == ("b", "from b")
    assert "nope" in str(result.attempts[0][1])


@pytest.mark.parametrize("status, hint", [(400, "check the model name"), (401, "OPENAI_API_KEY"),
                                          (403, "not allowed")])
def test_request_errors_are_fatal_and_stop_at_once(fp, client, status, hint):
    body = {"error": {"message": f"provider says {status}", "type": "invalid_request_error"}}
    fp.add_turn(s.http_error(status, body))
    fp.add_turn(s.text("must never be asked"))
    with pytest.raises(LlmHttpError) as info:
        drive(failover(client).stream_call(MESSAGES))
    assert classify(info.value) is ErrorClass.FATAL
    assert f"provider says {status}" in str(info.value) and hint in str(info.value)
    assert fp.request_count == 1


# --- in-band errors after a 200 -------------------------------------------------------------------

def test_a_server_error_event_mid_answer_fails_over_with_only_the_next_answer(fp, client):
    fp.add_turn(s.text("half of a"), s.error_frame("The server had an error", type="server_error"))
    fp.add_turn(s.text("all of b"))
    result = drive(failover(client).stream_call(MESSAGES))
    assert (result.model, result.response.content) == ("b", "all of b")
    assert isinstance(result.attempts[0][1], LlmStreamError)


def test_an_in_band_rate_limit_is_retried_on_the_same_model(fp, client):
    fp.add_turn(s.error_frame("Rate limit reached", type="tokens", code="rate_limit_exceeded"))
    fp.add_turn(s.text("answer"))
    waits = RecordedBackoffs()
    result = waits.call(failover(client), MESSAGES)
    assert (result.model, result.response.content) == ("a", "answer") and len(waits.waits) == 1


def test_an_in_band_insufficient_quota_is_fatal_not_a_rate_limit(fp, client):
    fp.add_turn(s.error_frame("You exceeded your current quota", type="insufficient_quota"))
    fp.add_turn(s.text("must never be asked"))
    with pytest.raises(LlmHttpError, match="exceeded your current quota") as info:
        drive(failover(client).stream_call(MESSAGES))
    assert info.value.status_code == 402 and fp.request_count == 1


def test_a_context_length_error_event_is_fatal(fp, client):
    fp.add_turn(s.error_frame("Your input exceeds the context window", type="invalid_request_error",
                              code="context_length_exceeded"))
    fp.add_turn(s.text("must never be asked"))
    with pytest.raises(LlmHttpError) as info:
        drive(failover(client).stream_call(MESSAGES))
    assert info.value.status_code == 400 and fp.request_count == 1


# --- garbage --------------------------------------------------------------------------------------

def test_only_llm_errors_leave_the_client_for_random_bytes():
    """Random Responses-ish bytes after valid headers: an LlmError or an answer, never anything else."""
    alphabet = [b"event: ", b"data: ", b"\n", b"\r", b"\n\n", b"{", b"}", b'"', b":", b"\xff", b"\x00",
                b"response.created", b"response.output_text.delta", b"response.completed", b"error",
                b'{"type":"response.output_text.delta","delta":"x"}',
                b'{"type":"response.output_item.added","output_index":[],"item":{"type":"function_call"}}',
                b'{"type":"response.function_call_arguments.delta","item_id":7,"delta":{}}',
                b'{"type":"response.output_item.done","item":{"type":"function_call","arguments":5}}',
                b'{"type":"response.completed","response":{"usage":{"input_tokens":-1}}}',
                b'{"type":"response.incomplete","response":{"incomplete_details":[]}}',
                b'{"type":"error"}', b'{"type":"response.failed","response":null}',
                b'{"type":"response.completed","response":{}}', b"[1]", b"null"]
    bodies = random_bodies(25, alphabet, 80)
    bodies.append(b"data: " + alphabet[-3] + b"\n\n")  # and one well-formed (empty) answer
    outcomes = outcomes_of(OpenAIResponsesClient, bodies, options=OPTIONS)
    assert len(outcomes) == len(bodies)
    assert {"answer", "LlmStreamError", "LlmProtocolError"} <= set(outcomes)


# --- buffered calls -------------------------------------------------------------------------------

def test_a_buffered_call_answers_and_a_stalled_one_times_out_and_closes_the_connection(fp, client):
    fp.add_turn(s.text("whole"), s.tool_call(0, id="call_1", name="f", arguments='{"a": 1}'))
    fp.add_turn(s.stall_before_headers())
    strategy = BufferedCallStrategy(client, completion_timeout=5.0)
    response = drive(strategy.stream_call(MESSAGES, options=OPTIONS))
    assert (response.content, [c.args() for c in response.tool_calls]) == ("whole", [{"a": 1}])
    with pytest.raises(LlmTimeoutError, match="buffered completion timeout"):
        drive(BufferedCallStrategy(client, completion_timeout=IDLE).stream_call(MESSAGES, options=OPTIONS))
    assert fp.wait_for_client_disconnects(1, GUARD_S)
    assert [t for t in threading.enumerate() if t.name.startswith("streamengine-complete")] == []
