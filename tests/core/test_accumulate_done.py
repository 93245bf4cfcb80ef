"""``ToolCallDelta.done`` closes its call in the accumulator, with nothing opened after it."""
from __future__ import annotations

from streamengine import ToolCall, ToolCallDelta
from streamengine._accumulate import ToolCallAccumulator


def test_a_done_delta_returns_its_call_at_once_and_later_fragments_of_it_are_ignored() -> None:
    accumulator = ToolCallAccumulator()
    assert accumulator.add(ToolCallDelta(0, "call_1", "first", '{"q": "a"}')) == []  # complete JSON, no end yet
    assert accumulator.add(ToolCallDelta(0, done=True)) == [ToolCall("call_1", "first", '{"q": "a"}')]
    assert accumulator.pending == 0
    assert accumulator.add(ToolCallDelta(0, arguments_fragment="late")) == []
    assert accumulator.finish() == [] and [c.id for c in accumulator.calls] == ["call_1"]


def test_a_done_call_with_arguments_that_do_not_parse_is_returned_as_sent() -> None:
    """The wire says the call is over: waiting for the stream's end would not change its arguments."""
    accumulator = ToolCallAccumulator()
    accumulator.add(ToolCallDelta(0, "call_1", "first", '{"q": '))
    assert accumulator.add(ToolCallDelta(0, arguments_fragment='"a"', done=True)) == [
        ToolCall("call_1", "first", '{"q": "a"')]


def test_a_done_delta_that_also_starts_the_call_closes_lower_calls_first() -> None:
    accumulator = ToolCallAccumulator()
    accumulator.add(ToolCallDelta(0, "call_1", "first", "{}"))
    closed = accumulator.add(ToolCallDelta(1, "call_2", "second", "{}", done=True))
    assert [call.id for call in closed] == ["call_1", "call_2"]
