"""FakeProvider(wire="responses") speaks the real Responses wire: the official openai SDK agrees with our client.

Each script is played twice on one provider: to the SDK's own accumulator
(``client.responses.stream(...)``, ``get_final_response()``) and to
:class:`OpenAIResponsesClient`; text, calls (call_id, name, arguments),
usage and status must be the same.  The SDK checks the event order as it
goes (an item before its deltas, every item done before
``response.completed``), so a fake that drifted from the API would fail here.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import openai
import pytest
import requests
from engine_calls import EngineCall

from streamengine import CompletionOptions, OpenAIResponsesClient, Response, ToolSpec
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MODEL = "oracle-model"
INPUT = [{"role": "user", "content": "hi"}]
SCRIPTS = {
    "text": [s.text("Hel"), s.text("lo, "), s.text("w\u00f6rld \U0001F600"), s.usage(prompt=12, completion=5)],
    "reasoning-text-calls": [
        s.reasoning("think"), s.text("Let me look."),
        s.tool_call(0, id="call_01", name="lookup", arguments='{"q": "rain'),
        s.tool_call(0, arguments=' in Oslo", "days": 3}'),
        s.tool_call(1, id="call_02", name="clock", arguments="{}"),
        s.usage(prompt=40, completion=22)],
    "keep-alives": [s.comment(), s.text("a"), s.empty_delta(), s.text("b"),
                    s.usage(prompt=2, completion=2)],
    "cut-off": [s.text("half an ans"), s.finish("length"), s.usage(prompt=3, completion=8)],
    "refusal": [s.text("Well."), s.Step("delta", {"refusal": "I can't "}), s.Step("delta", {"refusal": "do that."})],
}
Answer = Tuple[str, str, List[Tuple[str, str, Dict[str, Any]]], Tuple[int, int], str]
STATUS_OF_FINISH = {"stop": "completed", "tool_calls": "completed", "length": "incomplete"}


def ours(response: Response) -> Answer:
    calls = [(c.id, c.name, c.args()) for c in response.tool_calls]
    usage = response.usage
    assert usage is not None
    return response.content, response.refusal or "", calls, (usage.prompt_tokens, usage.completion_tokens), \
        STATUS_OF_FINISH[response.finish_reason or ""]


def theirs(response: Any) -> Answer:
    calls = [(item.call_id, item.name, json.loads(item.arguments or "{}"))
             for item in response.output if item.type == "function_call"]
    parts = [part for item in response.output if item.type == "message" for part in item.content]
    text = "".join(part.text for part in parts if part.type == "output_text")
    refusal = "".join(part.refusal for part in parts if part.type == "refusal")
    return text, refusal, calls, (response.usage.input_tokens, response.usage.output_tokens), response.status


@pytest.fixture
def pair():
    with FakeProvider(wire="responses") as fp, OpenAIResponsesClient(fp.base_url, api_key="sk-oracle") as client:
        sdk = openai.OpenAI(base_url=fp.base_url, api_key="sk-oracle", max_retries=0)
        try:
            yield fp, sdk, client
        finally:
            sdk.close()


def sdk_stream(sdk: Any) -> Tuple[List[Any], Any]:
    """Every event the SDK yields, and the final response (the last lifecycle event's, if not completed)."""
    with sdk.responses.stream(model=MODEL, input=INPUT) as stream:
        events = list(stream)
        final = stream.get_final_response() if events[-1].type == "response.completed" else events[-1].response
    return events, final


def our_stream(client: OpenAIResponsesClient) -> Answer:
    """Our client's stream as the engine aggregates it (the response its observers hear)."""
    return ours(EngineCall(client).call(INPUT, options=CompletionOptions(model=MODEL)))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_sdk_reads_the_fake_stream_as_our_client_does(pair, name):
    fp, sdk, client = pair
    fp.add_turn(*SCRIPTS[name])
    fp.add_turn(*SCRIPTS[name])
    events, final = sdk_stream(sdk)
    assert our_stream(client) == theirs(final)
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))  # every event numbered, in order, from 0
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    if name == "reasoning-text-calls":
        assert theirs(final)[2] == [("call_01", "lookup", {"q": "rain in Oslo", "days": 3}),
                                    ("call_02", "clock", {})]
        summary = [part.text for item in final.output if item.type == "reasoning" for part in item.summary]
        assert summary == ["think"]
    if name == "cut-off":
        assert final.incomplete_details.reason == "max_output_tokens"
    if name == "refusal":
        assert theirs(final)[:2] == ("Well.", "I can't do that.")


def test_every_event_names_its_type_in_the_event_line(pair):
    fp, _, _ = pair
    fp.add_turn(*SCRIPTS["reasoning-text-calls"], s.error_frame("late", type="server_error"), s.end())
    body = requests.post(fp.base_url + "/responses", json={"model": MODEL, "input": INPUT, "stream": True},
                         timeout=10).text
    frames = [f for f in body.split("\n\n") if f.strip()]
    for frame in frames:
        name_line, data_line = frame.split("\n")
        assert name_line[len("event: "):] == json.loads(data_line[len("data: "):])["type"]


def test_the_sdk_reads_the_fake_whole_answer_as_our_client_does(pair):
    fp, sdk, client = pair
    for _ in range(2):
        fp.add_turn(*SCRIPTS["reasoning-text-calls"])
    expected = theirs(sdk.responses.create(model=MODEL, input=INPUT))
    assert ours(client.complete(INPUT, options=CompletionOptions(model=MODEL))) == expected


def test_the_sdk_sees_the_fake_errors_as_openai_errors(pair):
    fp, sdk, _ = pair
    fp.add_turn(s.http_error(429, {"error": {"message": "Rate limit", "type": "rate_limit_exceeded"}}))
    with pytest.raises(openai.RateLimitError):
        sdk.responses.create(model=MODEL, input=INPUT)
    fp.add_turn(s.text("partial"), s.error_frame("The server had an error", type="server_error"))
    with pytest.raises(openai.APIError) as info:
        sdk_stream(sdk)
    assert info.value.body["message"] == "The server had an error"


def test_our_request_is_one_the_sdk_would_send(pair):
    # The same call from both sides: the fields the API reads must agree.
    fp, sdk, client = pair
    fp.add_turn(s.text("a"))
    fp.add_turn(s.text("a"))
    tool = {"type": "function", "name": "lookup", "description": "Look up.", "strict": False,
            "parameters": {"type": "object", "properties": {}}}
    with sdk.responses.stream(model=MODEL, instructions="Be brief.", tools=[tool], max_output_tokens=77,
                              input=[{"type": "message", "role": "user", "content": "hi"}]) as stream:
        stream.get_final_response()
    list(client.stream([{"role": "system", "content": "Be brief."}, *INPUT],
                       tools=[ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}})],
                       options=CompletionOptions(model=MODEL, max_tokens=77)))
    sdk_body, our_body = (r.json for r in fp.requests)
    assert our_body == {k: v for k, v in sdk_body.items() if k in our_body} and set(our_body) <= set(sdk_body)
    assert fp.requests[0].path == fp.requests[1].path == "/v1/responses"
    assert fp.requests[1].headers["Authorization"] == fp.requests[0].headers["Authorization"]
