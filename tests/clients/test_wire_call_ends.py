"""Each wire closes its own tool calls: the delta that ends a call says ``done``, and nothing is forged.

Anthropic (``content_block_stop``) and the Responses API (``output_item.done``)
mark where each call ends; their parsers say so on that call's last delta,
instead of opening an empty next index for the accumulator to infer an end
from.  Chat Completions marks no end, so none of its deltas says ``done``.
Read over real HTTP from a FakeProvider speaking each wire.
"""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    ToolCallDelta,
    ToolSpec,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

CLIENTS: Dict[str, Any] = {"anthropic": AnthropicClient, "responses": OpenAIResponsesClient,
                           "openai": OpenAICompatibleClient}
TOOLS = [ToolSpec("first", "First."), ToolSpec("second", "Second.")]


def deltas_of(wire: str, *steps: Any) -> List[ToolCallDelta]:
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(*steps)
        with CLIENTS[wire](fp.base_url, api_key="sk-test") as client:
            chunks = list(client.stream([{"role": "user", "content": "hi"}], TOOLS, CompletionOptions(model="m1")))
    return [delta for chunk in chunks for delta in chunk.tool_calls]


TWO_CALLS = (s.text("Checking."),
             s.tool_call(0, id="call_1", name="first", arguments='{"q":'), s.tool_call(0, arguments=' "a"}'),
             s.tool_call(1, id="call_2", name="second", arguments='{"q": "b"}'),
             s.text(" Done."), s.finish("tool_calls"))


@pytest.mark.parametrize("wire", ["anthropic", "responses"])
def test_each_call_ends_on_its_own_done_delta_and_no_empty_index_is_opened(wire: str) -> None:
    deltas = deltas_of(wire, *TWO_CALLS)
    assert {delta.index for delta in deltas} == {0, 1}, deltas  # no index 2 opened to close index 1
    assert not [d for d in deltas if d.id is None and d.name is None and not d.arguments_fragment and not d.done]
    for index in (0, 1):
        own = [delta for delta in deltas if delta.index == index]
        assert [delta.done for delta in own] == [False] * (len(own) - 1) + [True], own
    # The first call is closed by its own end, before the second call's first fragment.
    positions = {(d.index, d.done): at for at, d in reversed(list(enumerate(deltas)))}
    assert positions[(0, True)] < positions[(1, False)]


@pytest.mark.parametrize("wire", ["anthropic", "responses"])
def test_a_call_without_streamed_arguments_ends_with_its_own_arguments_on_the_done_delta(wire: str) -> None:
    deltas = deltas_of(wire, s.tool_call(0, id="call_1", name="first"), s.finish("tool_calls"))
    assert deltas[-1] == ToolCallDelta(0, arguments_fragment="{}", done=True)


def test_chat_completions_marks_no_end_so_no_delta_says_done() -> None:
    deltas = deltas_of("openai", *TWO_CALLS)
    assert deltas and not any(delta.done for delta in deltas)
