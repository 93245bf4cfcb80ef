"""FakeProvider speaks the real wire formats: the official SDKs read it and agree with our clients.

Each script is played twice on the same provider: once to the official SDK
(``anthropic`` or ``openai``), once to our client, and the text, tool calls
(id, name, input) and usage must be the same.  If the fake drifted from the
real format, the SDK -- written against the real API -- would disagree or fail.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Tuple

import anthropic
import openai
import pytest
from engine_calls import EngineCall
from http_support import CLIENTS, MESSAGES

from streamengine import CompletionOptions, Response, ToolSpec
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MODEL = "oracle-model"

SCRIPTS = {
    "text": [s.text("Hel"), s.text("lo, "), s.text("w\u00f6rld \U0001F600"), s.usage(prompt=12, completion=5)],
    "thinking-text-tools": [
        s.reasoning("think"), s.text("Let me look."),
        s.tool_call(0, id="toolu_01", name="lookup", arguments='{"q": "rain'),
        s.tool_call(0, arguments=' in Oslo", "days": 3}'),
        s.tool_call(1, id="toolu_02", name="clock"),
        s.usage(prompt=40, completion=22)],
    "pings-and-comments": [s.ping_event(), s.text("a"), s.comment(), s.empty_delta(), s.text("b"),
                           s.usage(prompt=2, completion=2)],
}
Answer = Tuple[str, List[Tuple[str, str, Dict[str, Any]]], Tuple[int, int], str]


def ours(response: Response) -> Answer:
    calls = [(c.id, c.name, c.args()) for c in response.tool_calls]
    usage = response.usage
    assert usage is not None
    return response.content, calls, (usage.prompt_tokens, usage.completion_tokens), response.finish_reason or ""


def our_stream(client: Any, options: CompletionOptions) -> Answer:
    """Our client's stream as the engine aggregates it (the response its observers hear)."""
    return ours(EngineCall(client).call(MESSAGES, options=options))


# -- Anthropic ----------------------------------------------------------------------------------

ANTHROPIC_FINISH = {"end_turn": "stop", "tool_use": "tool_calls"}


def anthropic_answer(message: Any) -> Answer:
    text = "".join(block.text for block in message.content if block.type == "text")
    calls = [(block.id, block.name, block.input) for block in message.content if block.type == "tool_use"]
    usage = (message.usage.input_tokens, message.usage.output_tokens)
    return text, calls, usage, ANTHROPIC_FINISH[message.stop_reason]


def provider_sdk_and_client(wire: str, sdk_class: Any, api_key: str) -> Iterator[Tuple[FakeProvider, Any, Any]]:
    """A FakeProvider speaking ``wire``, the vendor's SDK and our client, both pointed at it."""
    with FakeProvider(wire=wire) as fp, CLIENTS[wire](fp.base_url, api_key=api_key) as client:
        sdk = sdk_class(base_url=fp.base_url, api_key=api_key, max_retries=0)
        try:
            yield fp, sdk, client
        finally:
            sdk.close()


@pytest.fixture
def anthropic_pair():
    yield from provider_sdk_and_client("anthropic", anthropic.Anthropic, "sk-ant-oracle")


@pytest.fixture
def openai_pair():
    yield from provider_sdk_and_client("openai", openai.OpenAI, "sk-oracle")


def played_twice(pair: Tuple[FakeProvider, Any, Any], name: str) -> Tuple[Any, Any]:
    """Script ``name`` twice on the provider: once for the SDK, once for our client."""
    fp, sdk, client = pair
    fp.add_turn(*SCRIPTS[name])
    fp.add_turn(*SCRIPTS[name])
    return sdk, client


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_anthropic_sdk_reads_the_fake_stream_as_our_client_does(anthropic_pair, name):
    sdk, client = played_twice(anthropic_pair, name)
    with sdk.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
        events = [event.type for event in stream]
        expected = anthropic_answer(stream.get_final_message())
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert our_stream(client, CompletionOptions(model=MODEL)) == expected
    if name == "thinking-text-tools":
        assert expected[1] == [("toolu_01", "lookup", {"q": "rain in Oslo", "days": 3}),
                               ("toolu_02", "clock", {})]
        assert expected[2] == (40, 22)


def test_the_anthropic_sdk_reads_the_fake_whole_answer_as_our_client_does(anthropic_pair):
    fp, sdk, client = anthropic_pair
    for _ in range(2):
        fp.add_turn(*SCRIPTS["thinking-text-tools"])
    expected = anthropic_answer(sdk.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES))
    assert ours(client.complete(MESSAGES, options=CompletionOptions(model=MODEL))) == expected


def test_the_anthropic_sdk_sees_the_fake_errors_as_anthropic_errors(anthropic_pair):
    fp, sdk, _ = anthropic_pair
    fp.add_turn(s.http_error(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"
    fp.add_turn(s.text("partial"), s.error_frame("Overloaded", type="overloaded_error"))
    with pytest.raises(anthropic.APIStatusError) as info, \
            sdk.messages.stream(model=MODEL, max_tokens=10, messages=MESSAGES) as stream:
        stream.get_final_message()
    assert info.value.body["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_our_anthropic_request_is_one_the_sdk_would_send(anthropic_pair):
    # The same call from both sides: the fields the API reads must agree.
    fp, sdk, client = anthropic_pair
    fp.add_turn(s.text("a"))
    fp.add_turn(s.text("a"))
    tools = [{"name": "lookup", "description": "Look up.", "input_schema": {"type": "object", "properties": {}}}]
    with sdk.messages.stream(model=MODEL, max_tokens=77, system="Be brief.", tools=tools,
                             messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) as stream:
        stream.get_final_message()
    list(client.stream([{"role": "system", "content": "Be brief."}, *MESSAGES],
                       tools=[ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}})],
                       options=CompletionOptions(model=MODEL, max_tokens=77)))
    theirs, mine = (r.json for r in fp.requests)
    assert mine == {k: v for k, v in theirs.items() if k in mine} and set(mine) <= set(theirs)
    sdk_headers, our_headers = (r.headers for r in fp.requests)
    assert our_headers["content-type"] == sdk_headers["content-type"]
    # The SDK installed here sends its own newer version and the key as a bearer
    # token; the API takes the documented x-api-key and a dated version as well.
    assert "anthropic-version" in sdk_headers and our_headers["anthropic-version"] == "2023-06-01"
    assert our_headers["x-api-key"] == "sk-ant-oracle"
    assert "sk-ant-oracle" in (sdk_headers.get("x-api-key", "") + sdk_headers.get("authorization", ""))


# -- OpenAI -------------------------------------------------------------------------------------

def openai_stream_answer(chunks: List[Any]) -> Answer:
    text, calls, usage, finish = [], {}, None, ""
    for chunk in chunks:
        if chunk.usage is not None:
            usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for choice in chunk.choices or ():  # a ping event (some providers send them) has no choices
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = slot["id"] or call.id
                if call.function is not None:
                    slot["name"] = slot["name"] or call.function.name
                    slot["arguments"] += call.function.arguments or ""
    tool_calls = [(c["id"], c["name"], json.loads(c["arguments"] or "{}")) for _, c in sorted(calls.items())]
    assert usage is not None
    return "".join(text), tool_calls, usage, finish


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_openai_sdk_reads_the_fake_stream_as_our_client_does(openai_pair, name):
    sdk, client = played_twice(openai_pair, name)
    stream = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                         stream_options={"include_usage": True})
    expected = openai_stream_answer(list(stream))
    assert our_stream(client, CompletionOptions(model=MODEL)) == expected
    if name == "thinking-text-tools":
        assert expected[1][0] == ("toolu_01", "lookup", {"q": "rain in Oslo", "days": 3})


def test_the_openai_sdk_reads_the_fake_whole_answer_as_our_client_does(openai_pair):
    fp, sdk, client = openai_pair
    for _ in range(2):
        fp.add_turn(*SCRIPTS["thinking-text-tools"])
    completion = sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
    message = completion.choices[0].message
    expected = (message.content or "",
                [(c.id, c.function.name, json.loads(c.function.arguments or "{}")) for c in message.tool_calls or ()],
                (completion.usage.prompt_tokens, completion.usage.completion_tokens),
                completion.choices[0].finish_reason)
    assert ours(client.complete(MESSAGES, options=CompletionOptions(model=MODEL))) == expected


def test_the_openai_sdk_sees_the_fake_http_errors(openai_pair):
    fp, sdk, _ = openai_pair
    fp.add_turn(s.http_error(429, {"error": {"message": "slow down", "type": "rate_limit"}},
                             headers={"Retry-After": "2"}))
    with pytest.raises(openai.RateLimitError) as info:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert info.value.status_code == 429 and "slow down" in str(info.value)
