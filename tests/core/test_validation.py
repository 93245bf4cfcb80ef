"""One rule for seconds, counts and names, and the places that use it refuse the same values."""
from __future__ import annotations

import math

import pytest

from streamengine import ConfigError, EngineConfig, ScriptedClient, StreamingEngine
from streamengine import _validation as validation
from streamengine._calls.failover import ModelFailover
from streamengine._calls.strategies import StreamingCallStrategy, make_call_strategy
from streamengine._inline import InlineToolScanner

BAD_SECONDS = [float("inf"), -float("inf"), float("nan"), True, False, -1, "5", None, [1]]


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_seconds_refuses_what_is_not_a_finite_positive_number(value):
    with pytest.raises(ConfigError, match="timeout_s must be a .*number of seconds > 0") as info:
        validation.seconds(value, "timeout_s")
    assert repr(value) in str(info.value)


def test_seconds_accepts_numbers_and_returns_floats():
    assert validation.seconds(2, "t") == 2.0 and isinstance(validation.seconds(2, "t"), float)
    assert validation.seconds(0.25, "t") == 0.25


def test_zero_and_none_only_when_allowed():
    with pytest.raises(ConfigError, match="> 0"):
        validation.seconds(0, "t")
    assert validation.seconds(0, "t", allow_zero=True) == 0.0
    with pytest.raises(ConfigError, match=">= 0"):
        validation.seconds(-0.5, "t", allow_zero=True)
    assert validation.seconds(None, "t", allow_none=True) is None
    with pytest.raises(ConfigError, match="finite"):
        validation.seconds(math.inf, "t", allow_none=True, allow_zero=True)


@pytest.mark.parametrize("value", [True, False, 1.0, -1, "3", None])
def test_count_refuses_bools_floats_and_negatives(value):
    with pytest.raises(ConfigError, match="n must be an integer >= 0"):
        validation.count(value, "n")


def test_count_minimum():
    assert validation.count(0, "n") == 0
    assert validation.count(3, "n", minimum=3) == 3
    with pytest.raises(ConfigError, match="n must be an integer >= 1, got 0"):
        validation.count(0, "n", minimum=1)


@pytest.mark.parametrize("value", ["", "   ", None, 3, b"m"])
def test_name_refuses_empty_and_non_strings(value):
    with pytest.raises(ConfigError, match="model must be a non-empty string"):
        validation.name(value, "model")
    assert validation.name("gpt", "model") == "gpt"


# --- the same rule everywhere -------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, -1, 0])
@pytest.mark.parametrize("field", ["tool_timeout", "idle_timeout", "completion_timeout"])
def test_engine_config_timeouts(field, value):
    with pytest.raises(ConfigError, match=f"EngineConfig.{field} must be"):
        EngineConfig(models=["m"], **{field: value})


@pytest.mark.parametrize("field", ["max_continuations", "max_tools_per_round", "max_retries", "pool_size"])
@pytest.mark.parametrize("value", [True, 1.0, -1])
def test_engine_config_counts(field, value):
    with pytest.raises(ConfigError, match=f"EngineConfig.{field} must be an integer"):
        EngineConfig(models=["m"], **{field: value})


@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, False, -1, 0])
def test_heartbeat_is_refused_with_a_config_error_not_an_overflow(value):
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"])) as engine:
        with pytest.raises(ConfigError, match="heartbeat_s must be a"):
            engine.run([{"role": "user", "content": "q"}], heartbeat_s=value)


@pytest.mark.parametrize("value", [float("inf"), True, -1])
def test_call_strategy_timeouts(value):
    with pytest.raises(ConfigError, match="idle_timeout must be a"):
        StreamingCallStrategy(ScriptedClient(), idle_timeout=value)
    with pytest.raises(ConfigError, match="completion_timeout must be a"):
        make_call_strategy(ScriptedClient(), completion_timeout=value)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_retries": True}, "max_retries must be an integer"),
    ({"max_retry_wait": float("nan")}, "max_retry_wait must be a finite number of seconds >= 0"),
    ({"max_retry_wait": True}, "max_retry_wait must be a number of seconds >= 0"),
])
def test_failover_settings(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ModelFailover(StreamingCallStrategy(ScriptedClient()), ["a"], **kwargs)


def test_inline_scanner_settings():
    with pytest.raises(ConfigError, match="max_json_depth must be an integer >= 1, got True"):
        InlineToolScanner(max_json_depth=True)
    with pytest.raises(ConfigError, match="max_block_chars"):
        InlineToolScanner(max_block_chars=21.5)
