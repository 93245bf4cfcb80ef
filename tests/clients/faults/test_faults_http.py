"""HTTP faults: status codes, Retry-After in every form, in-band errors, and the API key.

Classification (``ErrorClassifier``): 429 retries the same model (``Retry-After`` /
``retry-after-ms`` honoured, capped, invalid values ignored); 5xx, 529 and
404 advance to the next model; 400/401/403 are fatal; a 200 that is not an
event stream is a protocol error.  The provider's own message is kept in the
error.  Everything goes through what a user has: the client, and calls as the
engine makes them (``engine_calls``), whose back-offs are read from the
engine's log and are short (fractions of a second) because they are waited
out.  The back-off cap below 30 s (``max_retry_wait``, not an engine setting)
and Retry-After date arithmetic at a given clock are in
``test_faults_retry_policy.py``.
"""
from __future__ import annotations

import email.utils
import time

import pytest
from engine_calls import AllFailed
from faultkit import MESSAGES, backoffs, captured_logs, failing_over, streaming
from http_support import provider_fixtures

from streamengine import (
    ConfigError,
    DoneEvent,
    EngineConfig,
    ErrorClass,
    ErrorClassifier,
    ErrorEvent,
    LlmError,
    LlmHttpError,
    LlmProtocolError,
    LlmStreamError,
    OpenAICompatibleClient,
    StreamingEngine,
    ToolCall,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolExecutor, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

classify = ErrorClassifier().classify
fp, client = provider_fixtures("openai", api_key="sk-test-http")


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


def failing_call(client, fp, *steps):
    fp.add_turn(*steps)
    with pytest.raises(LlmError) as info:
        list(client.stream(MESSAGES))
    return info.value


# --- 429 and Retry-After --------------------------------------------------------------------------

RETRY_AFTER = [
    ({"Retry-After": "2"}, 2.0),
    ({"Retry-After": " 7 "}, 7.0),
    ({"Retry-After": "1.5"}, 1.5),
    ({"retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),  # the precise one wins
    ({"retry-after-ms": "nan", "Retry-After": "3"}, 3.0),  # an invalid one is skipped
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past: now
    ({"Retry-After": "nan"}, None),
    ({"Retry-After": "-1"}, None),
    ({"Retry-After": "1e9"}, None),
    ({"Retry-After": "1e3"}, None),  # not delay-seconds, even though small
    ({"Retry-After": "inf"}, None),
    ({"Retry-After": "0x10"}, None),
    ({"Retry-After": "1_0"}, None),  # float() would say 10.0
    ({"Retry-After": "+5"}, None),
    ({"Retry-After": "86401"}, None),  # over a day: absurd
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, None),
    ({"Retry-After": "soon"}, None),
    ({"retry-after-ms": "-5"}, None),
    ({}, None),
]


@pytest.mark.parametrize("headers, expected", RETRY_AFTER, ids=[repr(h) for h, _ in RETRY_AFTER])
def test_429_retry_after_is_parsed_or_ignored(client, fp, headers, expected):
    error = failing_call(client, fp, s.http_error(429, {"error": {"message": "slow down"}}, headers=headers))
    assert isinstance(error, LlmHttpError) and error.status_code == 429
    assert error.retry_after == expected
    assert classify(error) is ErrorClass.TRANSIENT_RETRY
    assert "slow down" in str(error)


def test_429_retry_after_as_an_http_date(client, fp):
    error = failing_call(client, fp, s.http_error(429, {}, headers={"Retry-After": http_date(30)}))
    assert 25.0 < error.retry_after <= 30.0


WAITS = [
    # headers, the wait failover asks for before the retry (the engine's cap is 30 s)
    ({"Retry-After": "0.2"}, 0.2),
    ({"retry-after-ms": "150"}, 0.15),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
    ({"Retry-After": "nan"}, 0.5),  # ignored: exponential back-off from 0.5 s
    ({"Retry-After": "-1"}, 0.5),
    ({"Retry-After": "1e9"}, 0.5),
]


@pytest.mark.parametrize("headers, wait", WAITS, ids=[f"{h}" for h, _ in WAITS])
def test_failover_waits_the_retry_after_then_retries_the_same_model(client, fp, headers, wait):
    fp.add_turn(s.http_error(429, {"error": {"message": "rate limited"}}, headers=headers))
    fp.add_turn(s.text("answer"))
    with captured_logs("WARNING") as lines:
        result = failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
    assert backoffs(lines) == [wait]
    assert (result.model, result.response.content, result.failovers) == ("a", "answer", 0)
    assert [(m, e.status_code) for m, e in result.attempts] == [("a", 429)]
    assert [r.json["model"] for r in fp.requests] == ["a", "a"]


def test_a_retry_after_over_the_cap_advances_to_the_next_model_without_waiting(client, fp):
    fp.add_turn(s.http_error(429, {"error": {"message": "rate limited"}}, headers={"Retry-After": "120"}))
    fp.add_turn(s.text("from b"))
    with captured_logs("WARNING") as lines:
        result = failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
    assert backoffs(lines) == [] and (result.model, result.failovers) == ("b", 1)
    assert any("with Retry-After 120s, over the 30s cap: not waiting" in line for line in lines)
    assert [r.json["model"] for r in fp.requests] == ["a", "b"]


def test_retries_used_up_advance_to_the_next_model_with_growing_back_off(client, fp):
    for _ in range(3):
        fp.add_turn(s.http_error(429, {"error": {"message": "rate limited"}}, headers={"Retry-After": "nan"}))
    fp.add_turn(s.text("from b"))
    with captured_logs("WARNING") as lines:
        result = failing_over(client, 5.0, 10.0, models=["a", "b"], max_retries=2).failover(MESSAGES)
    assert backoffs(lines) == [0.5, 1.0]
    assert result.model == "b" and result.failovers == 1
    assert [r.json["model"] for r in fp.requests] == ["a", "a", "a", "b"]


# --- status codes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("status", [500, 502, 503, 529])
def test_server_errors_advance_and_keep_the_provider_message(client, fp, status):
    body = {"error": {"message": f"upstream exploded ({status})", "type": "server_error"}}
    error = failing_call(client, fp, s.http_error(status, body))
    assert isinstance(error, LlmHttpError) and error.status_code == status
    assert f"upstream exploded ({status})" in str(error)
    assert '"server_error"' in error.body  # the body itself is kept (up to 1 KB)
    assert classify(error) is ErrorClass.TRANSIENT_ADVANCE


@pytest.mark.parametrize("status", [500, 502, 503, 529, 404])
def test_advancing_statuses_fail_over_to_the_next_model(client, fp, status):
    fp.add_turn(s.http_error(status, {"error": {"message": "nope"}}))
    fp.add_turn(s.text("from b"))
    result = failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
    assert (result.model, result.response.content) == ("b", "from b")


@pytest.mark.parametrize("status, hint", [(400, "check the model name"), (401, "check the API key"),
                                          (403, "not allowed")])
def test_request_errors_are_fatal_and_stop_at_once(client, fp, status, hint):
    fp.add_turn(s.http_error(status, {"error": {"message": f"provider says {status}"}}))
    fp.add_turn(s.text("must never be asked"))
    with pytest.raises(LlmHttpError) as info:
        failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
    assert classify(info.value) is ErrorClass.FATAL
    assert f"provider says {status}" in str(info.value) and hint in str(info.value)
    assert fp.request_count == 1


def test_404_advances_with_a_hint(client, fp):
    error = failing_call(client, fp, s.http_error(404, {"error": {"message": "model 'a' not found"}}))
    assert classify(error) is ErrorClass.TRANSIENT_ADVANCE
    assert "model 'a' not found" in str(error) and "check base_url and the model name" in str(error)


def test_non_json_error_body_is_kept_as_text(client, fp):
    error = failing_call(client, fp, s.http_error(502, "<html><h1>502 Bad Gateway</h1></html>",
                                                  content_type="text/html"))
    assert "502 Bad Gateway" in str(error) and error.body.startswith("<html>")


@pytest.mark.parametrize("content_type", ["text/html", "application/json", ""])
def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(client, fp, content_type):
    error = failing_call(client, fp, s.http_error(200, "<html>captive portal login</html>",
                                                  content_type=content_type))
    assert isinstance(error, LlmProtocolError)
    assert f"content type {content_type!r}" in str(error) and "captive portal login" in str(error)
    assert classify(error) is ErrorClass.TRANSIENT_ADVANCE


# --- in-band errors -------------------------------------------------------------------------------

IN_BAND = [
    # message, type, code, the error it becomes, overloaded (stream errors), what failover does
    ("Overloaded", "overloaded_error", None, LlmStreamError, True, ErrorClass.TRANSIENT_ADVANCE),
    ("Rate limit reached for requests", "requests", "rate_limit_exceeded", LlmHttpError, None,
     ErrorClass.TRANSIENT_RETRY),
    ("The server is at capacity", None, 503, LlmStreamError, True, ErrorClass.TRANSIENT_ADVANCE),
    ("bad tool schema", "invalid_request_error", "bad_schema", LlmHttpError, None, ErrorClass.FATAL),
    ("The model produced invalid content", "server_error", None, LlmStreamError, False,
     ErrorClass.TRANSIENT_ADVANCE),
]


@pytest.mark.parametrize("message, kind, code, expected, overloaded, verdict", IN_BAND,
                         ids=[m for m, *_ in IN_BAND])
def test_in_band_error_frames_mid_stream(client, fp, message, kind, code, expected, overloaded, verdict):
    seen = []
    fp.add_turn(s.text("some "), s.text("text "), s.error_frame(message, type=kind, code=code), s.text("more"))
    with pytest.raises(Exception) as info:
        streaming(client, 5.0, 10.0).call(MESSAGES, on_chunk=seen.append)
    error = info.value
    assert type(error) is expected
    assert message in str(error) and "in the stream after 2 events" in str(error)
    if overloaded is not None:
        assert error.overloaded is overloaded
    assert classify(error) is verdict
    assert "".join(c.content or "" for c in seen) == "some text "  # nothing after the error frame


def test_an_event_named_error_with_plain_text_data(client, fp):
    error = failing_call(client, fp, s.text("a"), s.raw("event: error\ndata: upstream overloaded, try later\n\n"))
    assert isinstance(error, LlmStreamError) and error.overloaded
    assert "upstream overloaded, try later" in str(error)


# --- the API key --------------------------------------------------------------------------------------

KEY = "sk-live-0123456789abcdefSECRET"


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _assert_key_nowhere(key, errors, lines, extra_texts=()):
    assert lines, "nothing was logged at TRACE"
    leaked = [line for line in lines if key in line]
    assert leaked == [], f"API key in the logs: {leaked[0][:300]}"
    for error in errors:
        for exc in _chain(error):
            assert key not in str(exc), f"API key in {type(exc).__name__}: {exc}"
            assert key not in repr(exc.args)
            assert key not in (getattr(exc, "body", "") or "")
        for _, attempt in getattr(error, "attempts", ()):
            assert key not in str(attempt)
    for text in extra_texts:
        assert key not in text


ECHOES = [
    s.http_error(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}),
    s.http_error(500, f"internal error while checking {KEY}", content_type="text/plain"),
    s.http_error(429, {"error": {"message": f"rate limit for key {KEY}"}}, headers={"Retry-After": "0"}),
    s.http_error(200, f"<html>hello {KEY}</html>", content_type="text/html"),
]
ECHOES_MID_STREAM = [
    [s.text("a"), s.error_frame(f"key {KEY} is over quota", type="overloaded_error")],
    [s.text("a"), s.raw(f"data: {{not json {KEY}\n\n")],
    [s.text("a"), s.raw(f"event: error\ndata: denied for {KEY}\n\n")],
]


@pytest.mark.parametrize("key_as_given", [KEY, KEY + "\n", f"  {KEY}\r\n"],
                         ids=["plain", "trailing-newline", "surrounding-whitespace"])
def test_the_api_key_is_never_logged_nor_shown(key_as_given):
    """Providers echo keys in error bodies; keys read from files end with newlines."""
    errors, texts = [], []
    with captured_logs("TRACE") as lines, \
            FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key=key_as_given) as client:
        strategy = streaming(client, 5.0, 10.0)
        for step in ECHOES:
            fp.add_turn(step)
            with pytest.raises(LlmError) as info:
                strategy.call(MESSAGES)
            errors.append(info.value)
        for turn in ECHOES_MID_STREAM:
            fp.add_turn(*turn)
            with pytest.raises(LlmError) as info:
                strategy.call(MESSAGES)
            errors.append(info.value)
        # Through failover and the engine too: their warnings quote each cause.
        for turn in [ECHOES[0]] + [ECHOES[1], ECHOES[3]]:
            fp.add_turn(turn)
        with pytest.raises(LlmHttpError) as info:
            failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
        errors.append(info.value)
        with pytest.raises(AllFailed) as info:
            failing_over(client, 5.0, 10.0, models=["a", "b"]).failover(MESSAGES)
        errors.append(info.value)
        fp.add_turn(*ECHOES_MID_STREAM[0])
        fp.add_turn(ECHOES[1])
        with StreamingEngine(client, [], EngineConfig(models=["a", "b"])) as engine:
            events = list(engine.run(MESSAGES))
        texts += [e.message for e in events if isinstance(e, ErrorEvent)]
        texts.append(events[-1].result.answer)
        assert isinstance(events[-1], DoneEvent) and events[-1].result.error
        # The key did go out, stripped: the provider saw the right header.
        assert {r.headers["Authorization"] for r in fp.requests} == {f"Bearer {KEY}"}
        texts.append(repr(client))
    _assert_key_nowhere(KEY, errors, lines, texts)
    assert any("Incorrect API key provided: ***" in str(e) for e in errors)


def test_a_key_that_cannot_be_a_header_is_refused_without_showing_it():
    for bad in [KEY + "\u20ac", "sk-abc\ndef", "sk-abc\x00def", "sk abc def"]:
        with pytest.raises(ConfigError) as info:
            OpenAICompatibleClient("http://127.0.0.1:9/v1", api_key=bad)
        assert "not shown here on purpose" in str(info.value)
        assert bad.strip() not in str(info.value) and "sk-abc" not in str(info.value)


def test_credential_headers_are_redacted_too():
    """Azure-style ``api-key`` headers are as secret as the bearer token."""
    secret = "azure-secret-0123456789"
    with captured_logs("TRACE") as lines, \
            FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, headers={"api-key": secret}) as client:
        fp.add_turn(s.http_error(401, {"error": {"message": f"key {secret} is invalid"}}))
        with pytest.raises(LlmHttpError) as info:
            list(client.stream(MESSAGES))
        assert fp.requests[0].headers["api-key"] == secret
    _assert_key_nowhere(secret, [info.value], lines)
    with pytest.raises(ConfigError) as bad:
        OpenAICompatibleClient("http://127.0.0.1:9/v1", headers={"X-Api-Key": secret + "\n"})
    assert secret not in str(bad.value)
    with pytest.raises(ConfigError, match="X-Title"):
        OpenAICompatibleClient("http://127.0.0.1:9/v1", headers={"X-Title": "caf\u00e9 \u20ac"})


def test_a_session_header_that_cannot_be_sent_is_a_config_error_not_an_escaped_unicode_error():
    """A user's session with a non-latin-1 default header: translated at the client boundary."""
    import requests

    session = requests.Session()
    session.headers["X-Title"] = "caf\u00e9 \u20ac"
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key=KEY, session=session) as client, \
            pytest.raises(ConfigError, match="latin-1") as info:
        list(client.stream(MESSAGES))
    session.close()
    assert KEY not in str(info.value)
    assert classify(info.value) is ErrorClass.FATAL


def test_logged_tracebacks_do_not_print_local_variables():
    """A tool that uses the same key fails; the executor logs the traceback (WARNING).

    With loguru's default ``diagnose=True`` the traceback shows every local
    value on the failing lines, here ``key = 'sk-...'``.  Fix in logs.py:
    ``logger.add(..., diagnose=False)`` in ``enable_logging``.
    """
    def call_upstream(query, key):
        raise ConnectionError("upstream refused the request")

    @tool
    def fetch(query: str) -> str:
        key = KEY
        return call_upstream(query, key)

    with captured_logs("WARNING") as lines, ToolExecutor(max_workers=1) as executor:
        result = executor.submit(fetch, ToolCall("c1", "fetch", '{"query": "x"}'), 5.0).result()
    assert result.error == "tool 'fetch' failed: ConnectionError: upstream refused the request"
    assert any("upstream refused" in line for line in lines)
    assert not any(KEY in line for line in lines)
