"""All models failing: one terminal error naming each attempt's cause, within the caps.

Each model's call is bounded by the absolute cap (``completion_timeout``),
so a failover list of N models that all stall ends after about N x cap at
the latest (retries of a 429 add at most ``max_retries`` x
``max_retry_wait`` each).  Times are only checked against generous guards.
"""
from __future__ import annotations

import pytest
from backoff_support import RecordedBackoffs
from faultkit import MESSAGES, stream_threads, streaming

from streamengine._calls.failover import ModelFailover
from streamengine._clients.openai.client import OpenAICompatibleClient
from streamengine._engine.events import DoneEvent, ErrorEvent, TokenEvent
from streamengine._engine.run import EngineConfig, StreamingEngine
from streamengine._errors import AllModelsFailedError, LlmHttpError, LlmStreamError, LlmTimeoutError
from streamengine._wait import drive
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
        with pytest.raises(AllModelsFailedError) as info:  # each model ends at its idle timer or cap
            drive(ModelFailover(streaming(client, idle, cap), MODELS).stream_call(MESSAGES))
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
    assert isinstance(error.__cause__, LlmTimeoutError)


def test_every_kind_of_failure_is_named_in_the_one_terminal_error():
    models = ["http503", "dropped", "inband", "ratelimited", "stalled"]
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.http_error(503, {"error": {"message": "upstream overloaded"}}))
        fp.add_turn(s.text("partial"), s.drop())
        fp.add_turn(s.text("x"), s.error_frame("Overloaded", type="overloaded_error"))
        for _ in range(3):
            fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "3"}))
        fp.add_turn(s.stall())
        waits = RecordedBackoffs()
        with pytest.raises(AllModelsFailedError) as info:
            waits.call(ModelFailover(streaming(client, 0.2, 1.0), models, max_retries=2, max_retry_wait=5.0), MESSAGES)
    error = info.value
    assert waits.waits == [3.0, 3.0]  # Retry-After 3 s (within the 5 s cap: worth waiting), twice
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
