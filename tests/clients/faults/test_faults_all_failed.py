"""All models failing: one terminal error naming each attempt's cause, within the caps.

Each model's call is bounded by the absolute cap (``completion_timeout``),
so a failover list of N models that all stall ends after about N x cap at
the latest (retries of a 429 add at most ``max_retries`` x
``max_retry_wait`` each).  Times are only checked against generous guards.
"""
from __future__ import annotations

import pytest
from engine_calls import AllFailed, EngineCall
from faultkit import MESSAGES, captured_logs, failing_over, stream_threads

from streamengine import (
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    LlmHttpError,
    LlmStreamError,
    LlmTimeoutError,
    OpenAICompatibleClient,
    StreamingEngine,
    TokenEvent,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MODELS = ["alpha", "beta", "gamma"]


def test_three_stalling_models_give_one_error_naming_each_within_the_caps():
    idle, cap = 0.2, 0.6
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.stall_before_headers())
        fp.add_turn(s.forever(s.comment()))
        fp.add_turn(s.text("half an answer"), s.forever(s.text(" more")))  # never ends: the cap fires
        with pytest.raises(AllFailed) as info:  # each model ends at its idle timer or cap
            failing_over(client, idle, cap, models=MODELS).failover(MESSAGES)
        assert stream_threads() == []
        assert fp.wait_for_client_disconnects(3)
    error = info.value
    assert [model for model, _ in error.attempts] == MODELS
    assert all(isinstance(exc, LlmTimeoutError) for _, exc in error.attempts)
    no_response = f"LLM streaming: no response received within {idle:g}s (model may be unavailable or overloaded)"
    assert str(error.attempts[0][1]) == str(error.attempts[1][1]) == no_response
    assert str(error.attempts[2][1]).startswith(f"LLM streaming completion timeout: stream exceeded the {cap:g}s cap")
    assert str(error).startswith("all 3 model attempt(s) failed: alpha: LlmTimeoutError: LLM streaming: no response")
    for model, exc in error.attempts:
        assert f"{model}: LlmTimeoutError: {exc}" in str(error)
    assert error.result.telemetry.failed_attempts == [f"{m}: LlmTimeoutError: {exc}" for m, exc in error.attempts]
    assert error.result.telemetry.stop_reason == "llm_error_after_tokens"  # gamma's half answer was shown


def test_every_kind_of_failure_is_named_in_the_one_terminal_error():
    models = ["http503", "dropped", "inband", "ratelimited", "stalled"]
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.http_error(503, {"error": {"message": "upstream overloaded"}}))
        fp.add_turn(s.text("partial"), s.drop())
        fp.add_turn(s.text("x"), s.error_frame("Overloaded", type="overloaded_error"))
        for _ in range(3):
            fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0.2"}))
        fp.add_turn(s.stall())
        calls = EngineCall(client, idle=0.2, cap=1.0, models=models, max_retries=2)
        with captured_logs("WARNING") as lines, pytest.raises(AllFailed) as info:
            calls.failover(MESSAGES)
    error = info.value
    waited = [line for line in lines if "model ratelimited rate limited (429), retrying in 0.2s" in line]
    assert len(waited) == 2  # Retry-After 0.2 s, waited before each of the two retries
    assert [model for model, _ in error.attempts] == [
        "http503", "dropped", "inband", "ratelimited", "ratelimited", "ratelimited", "stalled"]
    kinds = [type(exc) for _, exc in error.attempts]
    assert kinds == [LlmHttpError, LlmStreamError, LlmStreamError] + [LlmHttpError] * 3 + [LlmTimeoutError]
    text = str(error)
    for needle in ["http503: LlmHttpError: provider answered HTTP 503", "upstream overloaded",
                   "dropped: LlmStreamError", "inband: LlmStreamError", "Overloaded", "ratelimited: LlmHttpError",
                   "HTTP 429", "stalled: LlmTimeoutError: LLM streaming: no response received within 0.2s"]:
        assert needle in text, needle


def test_the_engine_ends_with_one_error_event_and_done_when_all_models_stall():
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        for _ in MODELS:
            fp.add_turn(s.forever(s.ping_event()))
        config = EngineConfig(models=MODELS, idle_timeout=0.2, completion_timeout=0.6)
        with StreamingEngine(client, [], config) as engine:
            events = list(engine.run(MESSAGES))
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert len(errors) == 1 and isinstance(events[-1], DoneEvent)
    assert errors[0].message.startswith("all 3 model attempt(s) failed: alpha: LlmTimeoutError")
    for model in MODELS:
        assert f"{model}: LlmTimeoutError: LLM streaming: no response received within 0.2s" in errors[0].message
    result = events[-1].result
    assert result.error == errors[0].message
    assert result.telemetry.stop_reason == "llm_error"
    # The person sees one warning, not a half answer.
    assert [e.text for e in events if isinstance(e, TokenEvent)] == [f"\u26a0\ufe0f LLM error: {errors[0].message}"]
