"""One rule for seconds, counts and names: every public setting refuses the same values, in the same words.

Through what users set: ``EngineConfig``, ``@tool(timeout=...)``, ``engine.run(...)``, a run log's
``read(timeout_s=...)``.  The settings only the core's own classes take (failover's ``max_retry_wait``,
the inline scanner's ``max_json_depth``) are checked with those classes, in
clients/faults/test_faults_retry_policy.py and test_inline.py.
"""
from __future__ import annotations

import math

import pytest

from streamengine import ConfigError, EngineConfig, ScriptedClient, StreamingEngine, ToolError, tool
from streamengine.runs import MemoryRunLog, new_run_id

BAD_SECONDS = [float("inf"), -float("inf"), float("nan"), True, False, -1, "5", None, [1]]


def noop() -> str:
    """Does nothing."""
    return ""


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_seconds_refuses_what_is_not_a_finite_positive_number(value):
    with pytest.raises(ConfigError, match=r"EngineConfig\.idle_timeout must be a .*number of seconds > 0") as info:
        EngineConfig(models=["m"], idle_timeout=value)
    assert repr(value) in str(info.value)


def test_seconds_accepts_numbers_and_returns_floats():
    timeout = tool(timeout=2)(noop).timeout
    assert timeout == 2.0 and isinstance(timeout, float)
    assert tool(timeout=0.25)(noop).timeout == 0.25
    assert EngineConfig(models=["m"], idle_timeout=0.25).idle_timeout == 0.25


def test_zero_and_none_only_when_allowed():
    with pytest.raises(ToolError, match="> 0"):
        tool(timeout=0)(noop)
    log = MemoryRunLog()
    run_id = new_run_id()
    log.create(run_id, "owner")
    assert log.read(run_id, "owner", timeout_s=0) == []  # zero: look once, do not wait
    with pytest.raises(ConfigError, match="timeout_s must be a number of seconds >= 0"):
        log.read(run_id, "owner", timeout_s=-0.5)
    assert tool(timeout=None)(noop).timeout is None
    with pytest.raises(ToolError, match="finite"):
        tool(timeout=math.inf)(noop)


@pytest.mark.parametrize("value", [True, False, 1.0, -1, "3", None])
def test_count_refuses_bools_floats_and_negatives(value):
    with pytest.raises(ConfigError, match=r"EngineConfig\.max_retries must be an integer >= 0"):
        EngineConfig(models=["m"], max_retries=value)


def test_count_minimum():
    assert EngineConfig(models=["m"], max_retries=0).max_retries == 0
    assert EngineConfig(models=["m"], pool_size=1).pool_size == 1
    with pytest.raises(ConfigError, match=r"EngineConfig\.pool_size must be an integer >= 1, got 0"):
        EngineConfig(models=["m"], pool_size=0)


@pytest.mark.parametrize("value", ["", "   ", None, 3, b"m"])
def test_name_refuses_empty_and_non_strings(value):
    with pytest.raises(ConfigError, match=r"EngineConfig\.models must be a non-empty list of model names"):
        EngineConfig(models=[value])
    if value is not None:  # model=None is "not given"
        with pytest.raises(ConfigError, match=f"EngineConfig.model must be a non-empty string, got {value!r}"):
            EngineConfig(model=value)
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(model="gpt")) as engine:
        if value:  # an empty model for one run means the engine's own
            with pytest.raises(ConfigError, match=r"run\(model=...\) must be a non-empty string"):
                engine.run([{"role": "user", "content": "q"}], model=value)
        assert engine.complete([{"role": "user", "content": "q"}], model="gpt").answer == "hi"


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
    with StreamingEngine(ScriptedClient(["hi"]), config=EngineConfig(models=["m"])) as engine, \
            pytest.raises(ConfigError, match="heartbeat_s must be a"):
        engine.run([{"role": "user", "content": "q"}], heartbeat_s=value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), True, -1, 0])
def test_a_tools_timeout(value):
    """A tool's own timeout follows the rule too, told as a ToolError: the tool's definition is what is wrong."""
    with pytest.raises(ToolError, match=r"timeout of .*noop.* must be a .*number of seconds") as info:
        tool(timeout=value)(noop)
    assert isinstance(info.value.__cause__, ConfigError)


def test_the_inline_scanner_settings_of_the_engine():
    with pytest.raises(ConfigError, match=r"EngineConfig\.max_block_chars must be an integer >= 1"):
        EngineConfig(models=["m"], max_block_chars=21.5)
