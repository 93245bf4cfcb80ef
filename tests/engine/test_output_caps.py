"""Per-run output caps: a provider that never stops talking ends the round, not the process's memory.

Each cap is met over real HTTP (FakeProvider streaming ``forever``): the
round ends with an ``ErrorEvent`` naming the cap, ``stop_reason`` is
``output_limit``, what was shown stays in the answer, no other model is
tried, and the memory the run allocated (tracemalloc peak) follows the cap,
not the stream.  Interleaved native-argument fragments of two calls cost
work linear in their bytes.
"""
from __future__ import annotations

import gc
import json
import time
import tracemalloc

import pytest

from streamengine import (
    LLM_WARNING,
    ConfigError,
    DoneEvent,
    ErrorEvent,
    LlmOutputLimitError,
    OpenAICompatibleClient,
    RunFailedError,
    StreamingEngine,
    TokenEvent,
    ToolCallDelta,
    ToolStartEvent,
)
from streamengine._accumulate import JsonShape, ToolCallAccumulator, _PartialCall
from streamengine._calls.strategies import BufferedCallStrategy
from streamengine._config import EngineConfig, OutputLimits
from streamengine._wait import drive
from streamengine.testing import FakeProvider, Step
from streamengine.testing import steps as s
from streamengine.tools import tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

PIECE = 1000  # characters per frame


@tool
def lookup(q: str) -> str:
    """Look q up."""
    return f"found {len(q)} characters"


def make_engine(fp, tools=(), **config):
    config.setdefault("models", ["m1", "m2"])  # a second model that must never be asked
    config.setdefault("idle_timeout", 10.0)
    config.setdefault("completion_timeout", 30.0)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config))


class Outcome:
    """What a run told, keeping only counts of tokens (so the test's own copies do not count as memory)."""

    def __init__(self, engine, peak_memory: bool = False):
        self.shown, self.errors, self.starts = [], [], []
        self.result = None
        if peak_memory:
            gc.collect()
            tracemalloc.start()
        try:
            for event in engine.run([{"role": "user", "content": "question"}]):
                if isinstance(event, TokenEvent):
                    self.shown.append(event.text)
                elif isinstance(event, ErrorEvent):
                    self.errors.append(event)
                elif isinstance(event, ToolStartEvent):
                    self.starts.append(event)
                elif isinstance(event, DoneEvent):
                    self.result = event.result
        finally:
            if peak_memory:
                self.peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            engine.close()  # its tool workers end now, not after their idle timeout
        assert self.result is not None

    @property
    def shown_text(self) -> str:
        return "".join(self.shown)


def assert_capped(outcome, fp, what, setting, limit):
    message = f"the model's {what} passed the {limit} character cap (EngineConfig.{setting})"
    assert outcome.result.telemetry.stop_reason == "output_limit"
    assert message in outcome.result.error
    assert [e.fatal for e in outcome.errors] == [True] and message in outcome.errors[0].message
    assert fp.request_count == 1  # not a provider outage: no retry, no failover to m2


# --- each cap ends the round -----------------------------------------------------------------------

def test_the_answer_cap_ends_the_round_and_keeps_what_was_shown_in_bounded_memory():
    limit = 400_000
    with FakeProvider() as fp:
        fp.add_turn(s.forever(s.text("x" * PIECE), every=0.0005))
        outcome = Outcome(make_engine(fp, max_answer_chars=limit), peak_memory=True)
    assert_capped(outcome, fp, "answer", "max_answer_chars", limit)
    shown = outcome.shown_text
    assert limit - PIECE < len(shown) <= limit  # the crossing frame is not shown, nothing before it is lost
    assert outcome.result.answer == shown
    # The run's memory follows the cap: a few copies of 400k characters (the stream, the answer,
    # the round), never what an endless stream would grow to.
    assert outcome.peak < 8 * limit, outcome.peak


def test_the_reasoning_cap_ends_the_round_before_any_answer():
    limit = 50_000
    with FakeProvider() as fp:
        fp.add_turn(s.forever(s.reasoning("r" * PIECE), every=0.0005))
        outcome = Outcome(make_engine(fp, max_reasoning_chars=limit))
    assert_capped(outcome, fp, "reasoning", "max_reasoning_chars", limit)
    # Nothing was shown: the answer is the warning, as for any call that failed before a token.
    assert outcome.result.answer.startswith(LLM_WARNING)
    assert outcome.result.answer == outcome.shown_text


def test_a_refusal_is_capped_by_the_answer_cap():
    limit = 30_000
    with FakeProvider() as fp:
        fp.add_turn(s.text("I can't help "), s.forever(Step("delta", {"refusal": "n" * PIECE}), every=0.0005))
        outcome = Outcome(make_engine(fp, max_answer_chars=limit))
    assert_capped(outcome, fp, "refusal", "max_answer_chars", limit)
    assert outcome.result.answer == "I can't help "


def test_native_arguments_are_capped_while_they_accumulate_and_the_tool_never_runs():
    limit = 200_000
    with FakeProvider() as fp:
        fp.add_turn(s.text("Looking it up. "), s.tool_call(0, "call_1", "lookup", '{"q": "'),
                    s.forever(s.tool_call(0, arguments="a" * PIECE), every=0.0005))
        outcome = Outcome(make_engine(fp, [lookup], tool_mode="native", max_tool_argument_chars=limit),
                          peak_memory=True)
    assert_capped(outcome, fp, "tool arguments", "max_tool_argument_chars", limit)
    assert outcome.result.answer == "Looking it up. "
    assert outcome.starts == [] and outcome.result.tool_results == ()
    assert outcome.peak < 8 * limit, outcome.peak


def test_the_run_total_spans_rounds_and_keeps_every_round_shown():
    first = "a" * 30_000
    limit = 50_000
    with FakeProvider() as fp:
        fp.add_turn(s.text(first), s.tool_call(0, "call_1", "lookup", '{"q": "x"}'), s.finish("tool_calls"))
        fp.add_turn(s.forever(s.text("b" * PIECE), every=0.0005))
        outcome = Outcome(make_engine(fp, [lookup], tool_mode="native", max_run_output_chars=limit))
    message = f"the model's run output passed the {limit} character cap (EngineConfig.max_run_output_chars)"
    assert outcome.result.telemetry.stop_reason == "output_limit"
    assert message in outcome.result.error and message in outcome.errors[-1].message
    assert fp.request_count == 2
    rounds = outcome.result.rounds
    assert rounds[0] == first and set(rounds[1]) == {"b"}
    spent = len(first) + 1 + len('call_1lookup{"q": "x"}') + len(rounds[1])  # a tool-call delta costs 1 more
    assert limit - PIECE < spent <= limit
    assert outcome.result.answer == f"{first}\n\n{rounds[1]}"


def test_a_buffered_answer_over_the_cap_is_refused():
    with FakeProvider() as fp:
        fp.add_turn(s.text("y" * 5_000))
        strategy = BufferedCallStrategy(OpenAICompatibleClient(fp.base_url), completion_timeout=10.0,
                                        output_limits=OutputLimits(answer_chars=4_000))
        with pytest.raises(LlmOutputLimitError, match="answer passed the 4000 character cap") as caught:
            drive(strategy.stream_call([{"role": "user", "content": "q"}]))
    assert (caught.value.what, caught.value.limit) == ("answer", 4_000)


def test_answers_under_the_defaults_are_untouched():
    config = EngineConfig(model="m")
    assert (config.max_answer_chars, config.max_reasoning_chars, config.max_tool_argument_chars,
            config.max_run_output_chars) == (2_000_000, 2_000_000, 1_000_000, 8_000_000)
    with FakeProvider() as fp:
        fp.add_turn(s.text("z" * 100_000), s.reasoning("r" * 100_000))
        outcome = Outcome(make_engine(fp))
    assert outcome.result.error is None and outcome.result.telemetry.stop_reason is None
    assert outcome.result.answer == "z" * 100_000


@pytest.mark.parametrize("setting, value", [
    ("max_answer_chars", 0), ("max_reasoning_chars", True), ("max_run_output_chars", 1.5),
    ("max_tool_argument_chars", 2_000_000), ("max_tool_argument_chars", -1),
])
def test_the_caps_are_validated(setting, value):
    with pytest.raises(ConfigError, match=f"EngineConfig.{setting}"):
        EngineConfig(model="m", **{setting: value})


# --- interleaved arguments stay linear --------------------------------------------------------------

def interleaved(n):
    """Two calls whose argument fragments alternate, ``n`` fragments each."""
    frames = [s.tool_call(0, "call_a", "lookup", '{"q": "'), s.tool_call(1, "call_b", "lookup", '{"q": "')]
    for _ in range(n):
        frames += [s.tool_call(0, arguments="ab}"), s.tool_call(1, arguments='cd\\"}')]
    return frames + [s.tool_call(0, arguments='"}'), s.tool_call(1, arguments='"}'), s.finish("tool_calls")]


def joined_chars(monkeypatch, n):
    """Characters joined into argument texts during one run over HTTP with ``n`` fragments a call."""
    joined = [0]
    original = _PartialCall.arguments

    def counting(self):
        text = original(self)
        joined[0] += len(text)
        return text

    monkeypatch.setattr(_PartialCall, "arguments", counting)
    with FakeProvider() as fp:
        fp.add_turn(*interleaved(n))
        fp.add_turn(s.text("done"))
        outcome = Outcome(make_engine(fp, [lookup], tool_mode="native"))
    assert outcome.result.error is None and len(outcome.result.tool_results) == 2
    assert [json.loads(call.arguments)["q"] for call in _arguments_of(fp)] == ["ab}" * n, 'cd"}' * n]
    monkeypatch.setattr(_PartialCall, "arguments", original)
    return joined[0]


def _arguments_of(fp):
    """The two calls as the engine sent them back to the model in round 2."""
    assistant = next(m for m in fp.requests[1].json["messages"] if m.get("tool_calls"))

    class Call:
        def __init__(self, raw):
            self.arguments = raw["function"]["arguments"]
    return [Call(raw) for raw in assistant["tool_calls"]]


def test_interleaved_arguments_of_two_calls_are_joined_a_bounded_number_of_times(monkeypatch):
    small, large = joined_chars(monkeypatch, 300), joined_chars(monkeypatch, 1200)
    sent = 2 * 1200 * 4 + 20
    # Linear: each text joined a few times (completeness, the call, the response): 4x the bytes, 4x
    # the work.  Re-joining on every fragment (as before) made it 16x and ~1000x the bytes.
    assert large <= 4 * sent, (small, large)
    assert large / small < 6, (small, large)


def accumulate_cpu(n):
    deltas = [ToolCallDelta(0, "a", "lookup", '{"q": "'), ToolCallDelta(1, "b", "lookup", '{"q": "')]
    for _ in range(n):
        deltas += [ToolCallDelta(0, None, None, "ab}"), ToolCallDelta(1, None, None, "cd}")]
    best = float("inf")
    for _ in range(3):
        accumulator = ToolCallAccumulator()
        started = time.process_time()
        for delta in deltas:
            accumulator.add(delta)
        best = min(best, time.process_time() - started)
        assert accumulator.pending == 2
    return best


def test_interleaved_arguments_cost_cpu_linear_in_their_fragments():
    small, large = accumulate_cpu(5_000), accumulate_cpu(20_000)
    assert large / max(small, 1e-6) < 9, (small, large)  # linear: ~4; quadratic: ~16


# --- following JSON across fragments ----------------------------------------------------------------

@pytest.mark.parametrize("pieces, ended, broken", [
    (['{"a": 1}'], True, False),
    (['{"a": "x}', '"}'], True, False),
    (['{"a": "x\\', '"}'], False, False),  # the escaped quote does not end the string
    (['{"a": "x\\', '""}'], True, False),
    (['  {"a": [1, {"b": 2}', "]}", "  "], True, False),
    (['{"a": 1}', "x"], True, True),
    (["[1]"], False, True),
    (['{"a": 1}}'], True, True),
])
def test_json_shape_follows_strings_escapes_and_brackets(pieces, ended, broken):
    shape = JsonShape()
    for piece in pieces:
        shape.feed(piece)
    assert (shape.ended, shape.broken) == (ended, broken)


def test_complete_raises_when_a_cap_ended_the_run_before_anything_was_shown():
    with FakeProvider() as fp:
        fp.add_turn(s.forever(s.reasoning("r" * PIECE), every=0.0005))
        with pytest.raises(RunFailedError) as caught:
            make_engine(fp, max_reasoning_chars=20_000).complete([{"role": "user", "content": "q"}])
    assert caught.value.result.telemetry.stop_reason == "output_limit"
    assert "reasoning passed the 20000 character cap" in caught.value.result.error
