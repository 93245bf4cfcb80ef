"""Model failover against the in-process ScriptedClient: order, verbs, retries, fatal stops."""
from __future__ import annotations

import threading

import pytest
from backoff_support import RecordedBackoffs
from loguru import logger

from streamengine import (
    AllModelsFailedError,
    CancelToken,
    CompletionOptions,
    ConfigError,
    LlmCancelledError,
    LlmConnectionError,
    LlmError,
    LlmHttpError,
    LlmProtocolError,
    LlmStreamError,
    LlmTimeoutError,
    ScriptedClient,
)
from streamengine._calls.failover import ErrorClass, ErrorClassifier, FailoverResult, ModelFailover
from streamengine._calls.strategies import StreamingCallStrategy
from streamengine._wait import drive

STALL = ScriptedClient.STALL
MESSAGES = [{"role": "user", "content": "hi"}]
GUARD = 5.0


# The shared guard from conftest.py: no thread a test starts may outlive it.
pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def warnings():
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record["message"]), level="WARNING",
                         filter=lambda r: r["extra"].get("component") == "streamengine._calls.failover.ModelFailover")
    yield records
    logger.remove(handler)
    logger.disable("streamengine")



def failover(*turns, models=("a", "b", "c"), idle=0.3, **kwargs):
    client = ScriptedClient(turns)
    strategy = StreamingCallStrategy(client, idle_timeout=idle, completion_timeout=GUARD)
    return client, ModelFailover(strategy, list(models), **kwargs)


def models_called(client):
    return [call.options.model for call in client.calls]


# --------------------------------------------------------------------------- classification

@pytest.mark.parametrize("exc, expected", [
    (LlmTimeoutError("t", timeout_s=1, chunks_received=0, verb="unavailable"), ErrorClass.TRANSIENT_ADVANCE),
    (LlmConnectionError("refused"), ErrorClass.TRANSIENT_ADVANCE),
    (LlmStreamError("cut", overloaded=True), ErrorClass.TRANSIENT_ADVANCE),
    (LlmProtocolError("bad json"), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(500), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(503), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(529), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(404), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(408), ErrorClass.TRANSIENT_ADVANCE),
    (LlmHttpError(429), ErrorClass.TRANSIENT_RETRY),
    (LlmHttpError(400), ErrorClass.FATAL),
    (LlmHttpError(401), ErrorClass.FATAL),
    (LlmHttpError(403), ErrorClass.FATAL),
    (LlmHttpError(422), ErrorClass.FATAL),
    (ConfigError("bad"), ErrorClass.FATAL),
    (LlmCancelledError("stop"), ErrorClass.FATAL),
    (AllModelsFailedError([]), ErrorClass.FATAL),
    (LlmError("generic"), ErrorClass.TRANSIENT_ADVANCE),
    (ValueError("a bug"), ErrorClass.FATAL),
])
def test_classification(exc, expected):
    assert ErrorClassifier().classify(exc) is expected


def test_the_classifier_is_overridable():
    class NoAdvance(ErrorClassifier):
        def classify(self, exc):
            return ErrorClass.FATAL

    boom = LlmHttpError(503)
    client, fo = failover(boom, ["ok"], classifier=NoAdvance())
    with pytest.raises(LlmHttpError) as info:
        drive(fo.stream_call(MESSAGES))
    assert info.value is boom and models_called(client) == ["a"]


# --------------------------------------------------------------------------- order and verbs

def test_models_are_tried_in_order_and_each_step_is_logged_with_its_verb(warnings):
    client, fo = failover(LlmHttpError(503, "overloaded"), ["partial", STALL], ["answer"])
    options = CompletionOptions(model="ignored", temperature=0.2, extra={"seed": 1})
    result = drive(fo.stream_call(MESSAGES, options=options))
    assert isinstance(result, FailoverResult)
    assert (result.model, result.response.content, result.failovers) == ("c", "answer", 2)
    assert [(m, type(e)) for m, e in result.attempts] == [("a", LlmHttpError), ("b", LlmTimeoutError)]
    assert models_called(client) == ["a", "b", "c"]
    assert all(c.options.temperature == 0.2 and c.options.extra == {"seed": 1} for c in client.calls)
    assert warnings[0].startswith("model a unavailable, failing over to b")
    assert warnings[1].startswith("model b timed out, failing over to c")  # idle timeout after a chunk
    assert len(warnings) == 2


def test_a_silent_model_is_unavailable(warnings):
    _, fo = failover([STALL], ["ok"])
    assert drive(fo.stream_call(MESSAGES)).model == "b"
    assert warnings[0].startswith("model a unavailable, failing over to b")


def test_all_failed_lists_every_attempt_and_chains_the_last():
    errors = [LlmHttpError(500, "x"), LlmConnectionError("refused"), LlmStreamError("cut")]
    _, fo = failover(*errors)
    with pytest.raises(AllModelsFailedError) as info:
        drive(fo.stream_call(MESSAGES))
    assert info.value.attempts == list(zip("abc", errors))
    assert info.value.__cause__ is errors[-1]
    assert "a: LlmHttpError" in str(info.value) and "c: LlmStreamError: cut" in str(info.value)


def test_fatal_errors_are_raised_at_once_without_failover(warnings):
    boom = LlmHttpError(401, "invalid api key")
    client, fo = failover(boom, ["never"])
    with pytest.raises(LlmHttpError) as info:
        drive(fo.stream_call(MESSAGES))
    assert info.value is boom and models_called(client) == ["a"]
    assert warnings == ["model a failed with a fatal error, not failing over: "
                        "LlmHttpError: provider answered HTTP 401: invalid api key"]


def test_a_non_llm_error_is_a_bug_and_is_not_failed_over():
    client, fo = failover(ValueError("bug"), ["never"])
    with pytest.raises(ValueError):
        drive(fo.stream_call(MESSAGES))
    assert models_called(client) == ["a"]


def test_a_single_model_that_fails_is_all_models_failed():
    _, fo = failover(LlmHttpError(502), models=["only"])
    with pytest.raises(AllModelsFailedError) as info:
        drive(fo.stream_call(MESSAGES))
    assert [m for m, _ in info.value.attempts] == ["only"]


# --------------------------------------------------------------------------- may_advance / on_attempt

def test_may_advance_false_re_raises_the_error_as_is():
    boom = LlmHttpError(503)
    client, fo = failover(boom, ["never"])
    asked = []
    with pytest.raises(LlmHttpError) as info:
        drive(fo.stream_call(MESSAGES, may_advance=lambda: asked.append(1) or False))
    assert info.value is boom and asked == [1] and models_called(client) == ["a"]


def test_may_advance_is_asked_once_per_step_and_on_attempt_numbers_every_call():
    _client, fo = failover(LlmHttpError(429, retry_after=0), LlmHttpError(503), ["ok"], max_retries=1)
    asked, started = [], []
    result = drive(fo.stream_call(MESSAGES, may_advance=lambda: asked.append(1) or True,
                     on_attempt=lambda model, n: started.append((model, n))))
    assert result.model == "b"
    assert started == [("a", 1), ("a", 2), ("b", 3)]  # the 429 twice (one retry), then b
    assert len(asked) == 2  # before the retry, before failing over


def test_may_advance_false_also_stops_a_retry():
    boom = LlmHttpError(429, retry_after=0)
    client, fo = failover(boom, ["never"])
    with pytest.raises(LlmHttpError) as info:
        drive(fo.stream_call(MESSAGES, may_advance=lambda: False))
    assert info.value is boom and len(client.calls) == 1


# --------------------------------------------------------------------------- 429 retries

def test_429_is_retried_on_the_same_model_after_retry_after(warnings):
    client, fo = failover(LlmHttpError(429, retry_after=0.05), ["ok"])
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert (result.model, result.failovers, len(result.attempts)) == ("a", 0, 1)
    assert models_called(client) == ["a", "a"]
    assert backoffs.waits == [0.05]
    assert warnings[0].startswith("model a rate limited (429), retrying in 0.05s")


def test_retry_after_over_the_cap_fails_over_at_once(warnings):
    client, fo = failover(LlmHttpError(429, retry_after=3600), ["ok"], max_retry_wait=0.05)
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert backoffs.waits == [] and models_called(client) == ["a", "b"] and result.model == "b"
    assert "Retry-After 3600s, over the 0.05s cap" in warnings[0]


def test_retry_after_over_the_cap_on_the_last_model_waits_up_to_the_cap():
    client, fo = failover(LlmHttpError(429, retry_after=3600), ["ok"], models=["only"], max_retry_wait=0.05)
    backoffs = RecordedBackoffs()
    result = backoffs.call(fo, MESSAGES, cancel=CancelToken())
    assert backoffs.waits == [0.05] and models_called(client) == ["only", "only"] and result.model == "only"


def test_missing_retry_after_backs_off_exponentially():
    _, fo = failover(LlmHttpError(429), LlmHttpError(429), ["ok"])
    fo.backoff_initial = 0.01
    backoffs = RecordedBackoffs(wait_out=True)
    backoffs.call(fo, MESSAGES)  # no cancel token: the back-off still waits
    assert backoffs.waits == [0.01, 0.02]


def test_retries_used_up_fail_over_with_the_rate_limited_verb(warnings):
    client, fo = failover(*[LlmHttpError(429, retry_after=0)] * 3, ["ok"], max_retries=2)
    result = drive(fo.stream_call(MESSAGES))
    assert models_called(client) == ["a", "a", "a", "b"]
    assert (result.model, result.failovers, len(result.attempts)) == ("b", 1, 3)
    assert warnings[-1].startswith("model a rate limited (429), failing over to b")


def test_cancel_interrupts_the_retry_wait():
    client, fo = failover(LlmHttpError(429, retry_after=GUARD), ["never"], max_retry_wait=GUARD)
    cancel = CancelToken()
    setter = threading.Thread(target=cancel.set)
    with pytest.raises(LlmCancelledError, match="waiting to retry model a") as info:
        # The cancel is set from another thread while the back-off is waited out.
        RecordedBackoffs(wait_out=True, on_backoff=setter.start).call(fo, MESSAGES, cancel=cancel)
    setter.join()
    assert isinstance(info.value.__cause__, LlmHttpError)
    assert models_called(client) == ["a"]


def test_a_cancelled_call_is_not_failed_over():
    cancel = CancelToken()
    client, fo = failover(["a", STALL], ["never"], idle=GUARD)
    with pytest.raises(LlmCancelledError):
        drive(fo.stream_call(MESSAGES, cancel=cancel, on_chunk=lambda chunk: cancel.set()))
    assert models_called(client) == ["a"]


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize("models", [[], (), "gpt-4o", ["a", ""], ["a", None]])
def test_models_must_be_a_non_empty_list_of_names(models):
    strategy = StreamingCallStrategy(ScriptedClient())
    with pytest.raises(ConfigError):
        ModelFailover(strategy, models)


@pytest.mark.parametrize("kwargs", [{"max_retries": -1}, {"max_retries": 1.5}, {"max_retry_wait": -1},
                                    {"max_retry_wait": float("inf")}])
def test_retry_settings_are_validated(kwargs):
    with pytest.raises(ConfigError):
        ModelFailover(StreamingCallStrategy(ScriptedClient()), ["a"], **kwargs)
