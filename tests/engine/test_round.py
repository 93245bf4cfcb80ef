"""RoundRunner driven by ScriptedClient: rounds, continuation, failover, endings, without HTTP."""
from __future__ import annotations

import time

import pytest
from loguru import logger

from streamengine import (
    CancelToken,
    Chunk,
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    LlmHttpError,
    Message,
    RoundEvent,
    ScriptedClient,
    TokenEvent,
    ToolCallDelta,
    ToolResultEvent,
    ToolStartEvent,
    Usage,
)
from streamengine._calls.failover import ModelFailover
from streamengine._calls.strategies import make_call_strategy
from streamengine._engine.filing import FilingTicket
from streamengine._engine.rounds import RoundRunner, RunDeps, RunState
from streamengine._wait import drive
from streamengine.tools import ToolExecutor, ToolRegistry, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


class _ListFiling:
    """A FilingQueue stand-in: hands each result to ``ingest`` at once, on the caller's thread."""

    def __init__(self, ingest):
        self._ingest = ingest

    def file(self, result, scope, on_problem):
        if not result.ok:
            return None
        self._ingest(result)
        ticket = FilingTicket(on_problem)
        ticket.done.set()
        return ticket


class Run:
    """One RoundRunner over a ScriptedClient, with the events it emitted."""

    def __init__(self, turns, tools=(lookup,), ingest=None, **config):
        config.setdefault("models", ["m1", "m2"])
        config.setdefault("idle_timeout", 5.0)
        self.config = EngineConfig(**config)
        self.client = ScriptedClient(turns)
        self.executor = ToolExecutor(max_workers=2)
        strategy = make_call_strategy(self.client, idle_timeout=self.config.idle_timeout,
                                      completion_timeout=self.config.completion_timeout)
        self.deps = RunDeps(config=self.config, registry=ToolRegistry(list(tools)), executor=self.executor,
                            failover=ModelFailover(strategy, list(self.config.models), max_retries=0),
                            log=logger, filing=_ListFiling(ingest) if ingest is not None else None)
        self.events = []
        self.cancel = CancelToken()
        self.state = RunState(conversation=[Message(role="user", content="weather?")], cancel=self.cancel,
                              emit=self.events.append, started=time.monotonic())

    def __call__(self):
        try:
            drive(RoundRunner(self.deps, self.state).run())
        finally:
            self.executor.shutdown(wait=True)
        assert isinstance(self.events[-1], DoneEvent)
        return self.events[-1].result

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


def test_a_plain_answer_is_one_round_and_usage_is_none_without_provider_usage():
    run = Run([["Hel", "lo"]])
    result = run()
    assert result.answer == "Hello" and result.rounds == ("Hello",)
    assert [e.text for e in run.of(TokenEvent)] == ["Hel", "lo"]
    assert [e.round for e in run.of(RoundEvent)] == [1]
    assert result.usage is None
    assert result.telemetry.stop_reason is None and result.telemetry.model_used == "m1"


def test_usage_adds_up_over_rounds():
    run = Run([['<tool name="lookup">{"city": "Oslo"}</tool>', Chunk(usage=Usage(10, 2, 12))],
               ["Sunny.", Chunk(usage=Usage(20, 3, 23))]])
    assert run().usage == Usage(30, 5, 35)


def test_a_usage_less_final_chunk_keeps_the_usage_seen_before_it():
    run = Run([["Hi", Chunk(usage=Usage(4, 1, 5)), Chunk(is_completed=True, finish_reason="stop")]])
    assert run().usage == Usage(4, 1, 5)


def test_an_inline_call_runs_and_its_result_drives_the_revised_round():
    run = Run([['Let me check. <tool name="lookup">{"city": "Oslo"}</tool>'], ["It is sunny in Oslo."]])
    result = run()
    assert result.answer == "It is sunny in Oslo." and len(result.rounds) == 2
    assert [e.call.name for e in run.of(ToolStartEvent)] == ["lookup"]
    assert [e.result.text for e in run.of(ToolResultEvent)] == ["sunny in Oslo"]
    first, second = run.client.calls
    assert first.messages[0].role == "system" and "<tool name=" in first.messages[0].content
    assert first.tools is not None and [t.name for t in first.tools] == ["lookup"]  # auto: native too
    continuation = second.messages[-1]
    assert continuation.role == "user" and "sunny in Oslo" in continuation.content
    assert second.messages[-2].role == "assistant" and "<tool" in second.messages[-2].content
    assert result.telemetry.rounds == 2 and result.telemetry.tools_ok == 1


def test_a_native_call_is_answered_with_a_tool_message():
    call = Chunk(tool_calls=(ToolCallDelta(0, "call_1", "lookup", '{"city": "Rome"}'),))
    run = Run([[call, Chunk(is_completed=True, finish_reason="tool_calls")], ["Warm in Rome."]],
              tool_mode="native")
    result = run()
    assert result.answer == "Warm in Rome."
    first, second = run.client.calls
    assert all(m.role != "system" for m in first.messages)  # native only: no inline lesson
    assistant, answer = second.messages[-2:]
    assert assistant.role == "assistant" and [c.id for c in assistant.tool_calls] == ["call_1"]
    assert answer.role == "tool" and answer.tool_call_id == "call_1" and answer.content == "sunny in Rome"


def test_failover_before_anything_was_shown():
    run = Run([LlmHttpError(503, "busy"), ["from m2"]])
    result = run()
    assert result.answer == "from m2" and result.telemetry.model_used == "m2"
    assert result.telemetry.failovers == 1 and result.error is None
    assert [c.options.model for c in run.client.calls] == ["m1", "m2"]


def test_a_failure_after_tokens_keeps_the_partial_answer_and_does_not_fail_over():
    run = Run([["half an ", LlmHttpError(503, "gone")]])
    result = run()
    assert result.answer == "half an " and result.telemetry.stop_reason == "llm_error_after_tokens"
    assert "after a partial answer" in run.of(ErrorEvent)[0].message
    assert len(run.client.calls) == 1


def test_all_models_failing_shows_the_error_as_the_answer():
    run = Run([LlmHttpError(503, "a"), LlmHttpError(503, "b")])
    result = run()
    assert result.telemetry.stop_reason == "llm_error" and result.answer.startswith("\u26a0\ufe0f LLM error:")
    assert result.telemetry.model_used == "m2" and result.telemetry.failovers == 1


def test_the_last_round_still_runs_its_calls_and_the_rounds_are_joined():
    again = '<tool name="lookup">{"city": "Oslo"}</tool>'
    run = Run([["draft " + again], ["second " + again.replace("Oslo", "Bergen")]], max_continuations=1)
    result = run()
    assert result.telemetry.stop_reason == "max_continuations_reached"
    assert result.answer.startswith("draft ") and "second " in result.answer
    last = run.of(ToolResultEvent)[-1].result
    assert last.ok and last.text == "sunny in Bergen"  # shown and filed, though no round reads it
    assert len(run.client.calls) == 2


def test_a_cancel_before_the_first_round_stops_at_once():
    run = Run([["never"]])
    run.cancel.set()
    result = run()
    assert result.telemetry.stop_reason == "cancelled" and run.client.calls == []


def test_successful_results_are_handed_to_ingest_before_the_next_round():
    filed = []
    seen_when_round_two_started = []
    run = Run([['<tool name="lookup">{"city": "Oslo"}</tool>'], ["ok"]], ingest=filed.append)
    original = run.deps.failover.stream_call

    def call(*args, **kwargs):
        seen_when_round_two_started.append(list(filed))
        return original(*args, **kwargs)

    run.deps.failover.stream_call = call
    run()
    assert [r.text for r in filed] == ["sunny in Oslo"]
    assert [len(seen) for seen in seen_when_round_two_started] == [0, 1]


def test_an_unexpected_bug_still_ends_with_error_and_done():
    run = Run([["x"]])
    runner = RoundRunner(run.deps, run.state)
    runner.fail_unexpectedly(RuntimeError("boom"))
    run.executor.shutdown(wait=True)
    done = run.events[-1]
    assert isinstance(done, DoneEvent) and done.result.telemetry.stop_reason == "internal_error"
    assert done.result.error == "internal error: RuntimeError: boom"


def test_deps_are_all_a_run_needs_no_engine():
    fields = set(RunDeps.__dataclass_fields__)
    assert fields == {"config", "registry", "executor", "failover", "log", "filing", "run_tools", "approve"}
