"""ToolCalls: the gates every completed call passes, in order, and what each one leaves behind."""
from __future__ import annotations

import threading
import time

import pytest
from loguru import logger

from streamengine import CancelToken, EngineConfig, ToolCall, ToolResultEvent, ToolStartEvent
from streamengine._engine.rounds import RunDeps, RunState
from streamengine._engine.tool_calls import HELD, ToolCalls, canonical_key
from streamengine._wait import drive
from streamengine.tools import ToolContext, ToolExecutor, ToolRegistry, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@tool
def echo(text: str = "") -> str:
    """Echo."""
    return f"echo {text}"


@tool(timeout=7)
def patient() -> str:
    """Has its own timeout."""
    return "done"


@tool(side_effects=True)
def send(to: str) -> str:
    """Writes somewhere."""
    return f"sent to {to}"


@pytest.fixture
def executor():
    pool = ToolExecutor(max_workers=4)
    yield pool
    pool.shutdown(wait=True)


class Harness:
    """One run's ToolCalls over a real pool; what it emits is kept in ``events``."""

    def __init__(self, executor, tools=(echo, patient, send), allowed=None, per_round=3, total=5, timeout=3.0,
                 approve=lambda call: True):
        self.events = []
        config = EngineConfig(models=["m"], max_tools_per_round=per_round, max_tools_total=total,
                              tool_timeout=timeout, allowed_tools=allowed)
        deps = RunDeps(config=config, registry=ToolRegistry(list(tools)), executor=executor, failover=None,
                       log=logger, approve=approve)
        state = RunState(conversation=[], cancel=CancelToken(), emit=self.events.append, started=time.monotonic())
        self.dispatcher = ToolCalls(deps, state)

    @property
    def started(self):
        return [e.call for e in self.events if isinstance(e, ToolStartEvent)]

    @property
    def delivered(self):
        return [e.result for e in self.events if isinstance(e, ToolResultEvent)]

    @property
    def skipped(self):
        return [e.skipped for e in self.events if isinstance(e, ToolResultEvent)]

    def approve_held(self):
        drive(self.dispatcher.approve_held())

    def results(self):
        return drive(self.dispatcher.results())


def call(n, name="echo", arguments='{"text": "x"}'):
    return ToolCall(f"c{n}", name, arguments)


def test_same_arguments_in_another_key_order_and_spacing_are_a_duplicate(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, arguments='{"a":1,"b":2}'))
    h.dispatcher.dispatch(call(2, arguments='{ "b": 2, "a": 1 }'))
    h.dispatcher.dispatch(call(3, arguments='{"a": 1, "b": 3}'))
    first, second, third = h.results()
    assert h.dispatcher.counters.dedup_skipped == 1 and h.dispatcher.counters.tools_started == 2
    assert not second.ok and "duplicate of an earlier call to 'echo'" in second.error
    assert second.call_id == "c2" and second.started_at == 0.0
    assert first.call_id == "c1" and third.call_id == "c3"
    assert canonical_key(call(1, arguments='{"a":1,"b":2}')) == canonical_key(call(2, arguments='{ "b": 2, "a": 1 }'))


def test_a_duplicate_does_not_use_up_the_cap(executor):
    h = Harness(executor, per_round=2)
    for n, arguments in enumerate(['{"text": "a"}', '{"text": "a"}', '{"text": "b"}', '{"text": "c"}']):
        h.dispatcher.dispatch(call(n, arguments=arguments))
    results = h.results()
    assert [r.ok for r in results] == [True, False, True, False]
    assert "limit of 2 tool calls per round" in results[3].error
    counters = h.dispatcher.counters
    assert (counters.tools_started, counters.dedup_skipped, counters.cap_skipped) == (2, 1, 1)


def test_the_request_cap_spans_rounds(executor):
    h = Harness(executor, per_round=3, total=2)
    h.dispatcher.dispatch(call(1, arguments='{"text": "a"}'))
    h.results()
    h.dispatcher.begin_round()
    h.dispatcher.dispatch(call(2, arguments='{"text": "b"}'))
    h.dispatcher.dispatch(call(3, arguments='{"text": "c"}'))
    second, third = h.results()
    assert second.ok and not third.ok and "limit of 2 tool calls per request" in third.error


def test_unknown_and_disallowed_tools_name_the_available_ones(executor):
    h = Harness(executor, allowed=frozenset({"echo"}))
    h.dispatcher.dispatch(call(1, name="rm_rf"))
    h.dispatcher.dispatch(call(2, name="patient", arguments="{}"))
    unknown, disallowed = h.results()
    assert unknown.error == "tool 'rm_rf' is not available; available tools: echo"
    assert disallowed.error == "tool 'patient' is not available; available tools: echo"
    assert h.dispatcher.counters.disallowed == 2 and h.started == []


def test_invalid_arguments_are_a_parse_error_not_a_start(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, arguments='{"text": '))
    h.dispatcher.dispatch(call(2, arguments='["not", "an", "object"]'))
    broken, array = h.results()
    assert broken.error.startswith(
        "invalid arguments for tool 'echo': arguments of tool call 'echo' are not valid JSON")
    assert "must be a JSON object" in array.error
    assert h.dispatcher.counters.parse_errors == 2 and h.dispatcher.counters.tools_started == 0


def test_a_call_a_gate_stopped_can_be_asked_for_again_once_it_would_pass(executor):
    h = Harness(executor, per_round=1)
    h.dispatcher.dispatch(call(1, arguments='{"text": "a"}'))
    h.dispatcher.dispatch(call(2, arguments='{"text": "b"}'))  # over the round's cap: never started
    h.results()
    h.dispatcher.begin_round()
    h.dispatcher.dispatch(call(3, arguments='{"text": "b"}'))  # not a duplicate: the first never ran
    results = h.results()
    assert results[-1].ok and results[-1].text == "echo b"
    assert h.dispatcher.counters.cap_skipped == 1 and h.dispatcher.counters.dedup_skipped == 0


def test_side_effect_tools_wait_for_the_stream_to_finish_normally(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, name="send", arguments='{"to": "bob"}'))
    h.dispatcher.dispatch(call(2))
    held, _ = h.dispatcher.calls()
    assert held.state == HELD and held.handle is None
    time.sleep(0.05)
    assert [c.name for c in h.started] == ["echo"]
    h.approve_held()
    sent, echoed = h.results()
    assert sent.ok and sent.text == "sent to bob" and echoed.text == "echo x"
    assert [c.name for c in h.started] == ["echo", "send"]


def test_a_side_effect_tool_never_starts_when_the_stream_broke(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, name="send", arguments='{"to": "bob"}'))
    h.dispatcher.drop_held()  # the round's stream broke
    (held,) = h.results()
    assert not held.ok and "not run" in held.error
    assert h.started == [] and h.dispatcher.counters.tools_started == 0
    assert [r.error for r in h.delivered] == [held.error] and h.skipped == ["stream_not_finished"]


def test_without_approve_a_held_side_effect_call_is_refused_and_never_started(executor):
    h = Harness(executor, approve=None)
    h.dispatcher.dispatch(call(1, name="send", arguments='{"to": "bob"}'))
    h.approve_held()  # the stream finished normally, and nothing approves
    (refused,) = h.results()
    assert not refused.ok and "nothing approved it" in refused.error
    assert h.started == [] and h.skipped == ["not_approved"]
    assert (h.dispatcher.counters.refused, h.dispatcher.counters.tools_started) == (1, 0)


@pytest.mark.parametrize("answer", [1, "yes", None, [True]])
def test_only_true_from_approve_lets_a_call_run(executor, answer):
    h = Harness(executor, approve=lambda c: answer)
    h.dispatcher.dispatch(call(1, name="send", arguments='{"to": "bob"}'))
    h.approve_held()
    (refused,) = h.results()
    assert "was not approved" in refused.error and h.started == []


def test_reset_round_forgets_an_attempt_that_started_nothing(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, name="send", arguments='{"to": "bob"}'))
    h.dispatcher.reset_round()
    assert not h.dispatcher.found_calls and h.dispatcher.counters.tools_started == 0
    h.dispatcher.dispatch(call(2, name="send", arguments='{"to": "bob"}'))  # not a duplicate any more
    h.approve_held()
    (result,) = h.results()
    assert result.ok and h.dispatcher.counters.dedup_skipped == 0


def test_the_engine_timeout_is_the_default_and_a_tools_own_timeout_wins(executor):
    h = Harness(executor, timeout=3.0)
    h.dispatcher.dispatch(call(1))
    h.dispatcher.dispatch(call(2, name="patient", arguments="{}"))
    default, own = h.dispatcher.calls()
    assert (default.handle.timeout, own.handle.timeout) == (3.0, 7.0)
    h.results()


def test_results_are_delivered_on_the_worker_before_the_round_is_joined(executor):
    h = Harness(executor)
    h.dispatcher.dispatch(call(1, arguments='{"text": "a"}'))
    h.dispatcher.dispatch(call(2, arguments='{"text": "b"}'))
    a, b = h.dispatcher.calls()
    assert a.told.wait(5.0) and b.told.wait(5.0)
    assert sorted(r.text for r in h.delivered) == ["echo a", "echo b"]


def test_cancel_all_tells_running_tools_to_stop(executor):
    entered = threading.Event()

    @tool
    def blocking(ctx: ToolContext) -> str:
        """Waits for a cancel."""
        entered.set()
        return "stopped" if ctx.cancel_event.wait(5) else "never told"

    h = Harness(executor, tools=(blocking,))
    h.dispatcher.dispatch(call(1, name="blocking", arguments="{}"))
    assert entered.wait(5)
    h.dispatcher.cancel_all()
    (result,) = h.results()
    assert result.text != "never told" and not result.timed_out
