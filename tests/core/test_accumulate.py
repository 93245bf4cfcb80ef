"""Tool-call delta accumulation and response aggregation (pure, in memory).

Private on purpose: the accumulator is an algorithm fed deltas one by one, in orders and shapes no
provider sends on cue; what users get from it (a call that starts at its block's end, the aggregated
response observers hear) is tested over HTTP in tests/clients.
"""
from __future__ import annotations

import json

import pytest

from streamengine import Chunk, ToolCall, ToolCallDelta, Usage
from streamengine import ToolCallDelta as D
from streamengine._accumulate import ResponseAggregator, ToolCallAccumulator


def feed(acc, deltas):
    """Add every delta; return (calls returned by add in order, calls returned by finish)."""
    early = []
    for delta in deltas:
        early.extend(acc.add(delta))
    return early, acc.finish()


def fragments(index, text, size):
    return [D(index, arguments_fragment=text[i:i + size]) for i in range(0, len(text), size)]


def test_sequential_calls_are_returned_when_the_next_index_starts():
    acc = ToolCallAccumulator()
    assert acc.add(D(0, id="c0", name="search")) == []
    assert acc.add(D(0, arguments_fragment='{"q": ')) == []
    assert acc.add(D(0, arguments_fragment='"cats"}')) == []
    assert acc.add(D(1, id="c1", name="fetch")) == [ToolCall("c0", "search", '{"q": "cats"}')]
    assert acc.add(D(1, arguments_fragment='{"url": "x"}')) == []
    assert acc.finish() == [ToolCall("c1", "fetch", '{"url": "x"}')]
    assert acc.finish() == []
    assert acc.calls == (ToolCall("c0", "search", '{"q": "cats"}'), ToolCall("c1", "fetch", '{"url": "x"}'))


def test_repeated_ids_and_names_are_never_concatenated():
    acc = ToolCallAccumulator()
    deltas = [D(0, id="call_1", name="search", arguments_fragment='{"q"'),
              D(0, id="call_1", name="search", arguments_fragment=': 1}')]
    early, rest = feed(acc, deltas)
    assert early == [] and rest == [ToolCall("call_1", "search", '{"q": 1}')]


def test_a_new_id_on_a_reused_index_starts_a_new_call_and_completes_the_old_one():
    acc = ToolCallAccumulator()
    assert acc.add(D(0, id="a", name="f", arguments_fragment='{"n": 1')) == []
    # The old call is returned even though its JSON looks unfinished: the provider moved on.
    assert acc.add(D(0, id="b", name="g", arguments_fragment='{}')) == [ToolCall("a", "f", '{"n": 1')]
    assert acc.finish() == [ToolCall("b", "g", "{}")]


def test_fragments_before_the_name_are_held_and_kept():
    acc = ToolCallAccumulator()
    assert acc.add(D(0, arguments_fragment='{"x"')) == []
    assert acc.add(D(0, arguments_fragment=': 2}')) == []
    # A higher index starts, but call 0 has no name yet: it cannot be dispatched.
    assert acc.add(D(1, id="c1", name="other", arguments_fragment="{}")) == []
    assert acc.add(D(0, id="c0", name="late_name")) == []
    assert acc.add(D(1, arguments_fragment=" ")) == [ToolCall("c0", "late_name", '{"x": 2}')]
    assert acc.finish() == [ToolCall("c1", "other", "{} ")]


def test_interleaved_parallel_calls_are_only_returned_once_their_json_is_complete():
    acc = ToolCallAccumulator()
    a = '{"city": "Paris"}'
    b = '{"query": "weather in Paris tomorrow"}'  # longer: its fragments go on after a completes
    deltas = [D(0, id="c0", name="forecast"), D(1, id="c1", name="search")]
    fa, fb = fragments(0, a, 5), fragments(1, b, 5)
    for i in range(max(len(fa), len(fb))):
        deltas.extend(fa[i:i + 1] + fb[i:i + 1])
    early = []
    for delta in deltas:
        early.extend(acc.add(delta))
        if early:
            break
    # Returned exactly when the last fragment of a was followed by a fragment of b.
    assert early == [ToolCall("c0", "forecast", a)]
    assert acc.calls == (ToolCall("c0", "forecast", a),)
    position = deltas.index(delta)
    assert deltas[position - 1] is fa[-1] and delta.index == 1
    remaining = deltas[position + 1:]
    more, rest = feed(acc, remaining)
    assert more == []
    assert rest == [ToolCall("c1", "search", b)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_any_fragmentation_gives_the_same_calls(size):
    args = ['{"a": "x\\"}y"}', '{"list": [1, 2, {"b": null}]}', '{}']
    deltas = []
    for index, text in enumerate(args):
        deltas.append(D(index, id=f"c{index}", name=f"tool{index}"))
        deltas.extend(fragments(index, text, size))
    acc = ToolCallAccumulator()
    early, rest = feed(acc, deltas)
    calls = early + rest
    assert calls == [ToolCall(f"c{i}", f"tool{i}", text) for i, text in enumerate(args)]
    assert [json.loads(c.arguments) for c in calls] == [json.loads(t) for t in args]
    assert len({c.id for c in calls}) == 3


def test_each_call_is_returned_exactly_once_and_calls_keep_start_order():
    acc = ToolCallAccumulator()
    early, rest = feed(acc, [
        D(0, id="c0", name="slow", arguments_fragment='{"n": '),  # incomplete until later
        D(1, id="c1", name="quick", arguments_fragment="{}"),
        D(2, id="c2", name="third", arguments_fragment="{}"),     # completes c1 (c0 still incomplete)
        D(0, arguments_fragment="1}"),
    ])
    assert early == [ToolCall("c1", "quick", "{}")]
    assert rest == [ToolCall("c0", "slow", '{"n": 1}'), ToolCall("c2", "third", "{}")]
    assert [c.id for c in acc.calls] == ["c0", "c1", "c2"]


def test_nameless_calls_are_dropped():
    acc = ToolCallAccumulator()
    early, rest = feed(acc, [D(0, id="c0", arguments_fragment="{}"), D(1, id="c1", name="g")])
    assert early == [] and rest == [ToolCall("c1", "g", "{}")]
    assert acc.calls == (ToolCall("c1", "g", "{}"),) and acc.pending == 0


def test_missing_ids_are_generated_and_empty_arguments_become_an_empty_object():
    acc = ToolCallAccumulator()
    early, rest = feed(acc, [D(0, name="now"), D(1, name="now")])
    calls = early + rest
    assert [c.arguments for c in calls] == ["{}", "{}"]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


def test_fragments_for_an_already_returned_call_are_ignored():
    acc = ToolCallAccumulator()
    acc.add(D(0, id="c0", name="f", arguments_fragment="{}"))
    assert acc.add(D(1, id="c1", name="g")) == [ToolCall("c0", "f", "{}")]
    assert acc.add(D(0, arguments_fragment='"junk"')) == []
    assert acc.add(D(0, arguments_fragment="  ")) == []
    assert acc.calls == (ToolCall("c0", "f", "{}"),) and acc.pending == 1  # only c1 is open
    # ...but a new id on that index is a genuinely new call.
    assert acc.add(D(0, id="c2", name="h", arguments_fragment="{}")) == []
    assert [c.id for c in acc.finish()] == ["c2", "c1"]  # open calls close in index order


def test_aggregator_joins_content_and_keeps_the_last_non_null_usage_model_and_finish_reason():
    agg = ResponseAggregator()
    chunks = [
        Chunk(content="Hel", model="m1"),
        Chunk(reasoning="thinking"),
        Chunk(),
        Chunk(content="lo", usage=Usage(1, 1, 2)),
        Chunk(tool_calls=(D(0, id="c0", name="f", arguments_fragment='{"a"'),)),
        Chunk(tool_calls=(D(0, arguments_fragment=": 1}"),), finish_reason="tool_calls"),
        Chunk(usage=Usage(3, 4, 7), model="m2"),
        Chunk(is_completed=True, usage=None, finish_reason=None),
    ]
    for chunk in chunks:
        agg.add(chunk)
    response = agg.response()
    assert response.content == "Hello"
    assert agg.reasoning == "thinking"
    assert response.usage == Usage(3, 4, 7)
    assert response.model == "m2"
    assert response.finish_reason == "tool_calls"
    assert response.tool_calls == (ToolCall("c0", "f", '{"a": 1}'),)
    assert agg.completed and agg.chunks == len(chunks)
    assert agg.response() == response  # idempotent


def test_aggregator_add_returns_calls_completed_early():
    agg = ResponseAggregator()
    assert agg.add(Chunk(tool_calls=(D(0, id="a", name="f", arguments_fragment="{}"),))) == []
    done = agg.add(Chunk(tool_calls=(D(1, id="b", name="g", arguments_fragment="{}"),)))
    assert done == [ToolCall("a", "f", "{}")]
    assert agg.finish() == [ToolCall("b", "g", "{}")]
    assert agg.response().tool_calls == (ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}"))


# --- ToolCallDelta.done closes its call, with nothing opened after it --------------------------------

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
