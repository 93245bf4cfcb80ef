"""What OpenAICompatibleClient puts on the wire: request JSON and headers (``responses``).

Request-level only; everything about reading answers goes through real
loopback HTTP in test_openai.py.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
import requests
import responses

from streamengine import CompletionOptions, Message, OpenAICompatibleClient, ToolCall, ToolSpec

BASE = "https://llm.example.test/v1"
SSE = b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
COMPLETION = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


@pytest.fixture(autouse=True)
def _threads(no_thread_leak):
    yield


@pytest.fixture
def wire():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add(responses.POST, f"{BASE}/chat/completions", body=SSE, content_type="text/event-stream")
        yield mock


def sent(mock: responses.RequestsMock, index: int = 0) -> Dict[str, Any]:
    return json.loads(mock.calls[index].request.body)


def headers(mock: responses.RequestsMock, index: int = 0) -> requests.structures.CaseInsensitiveDict:
    return mock.calls[index].request.headers


def test_stream_body_has_messages_stream_options_and_merged_options(wire):
    tools = [ToolSpec("lookup", "Find a thing", {"type": "object", "properties": {"q": {"type": "string"}}})]
    options = CompletionOptions(model="m1", temperature=0.2, max_tokens=64, stop=["END"],
                                extra={"top_p": 0.9, "seed": 7})
    messages = [
        {"role": "system", "content": "be brief"},
        Message("assistant", tool_calls=(ToolCall("c1", "lookup", '{"q":"x"}'),)),
        Message("tool", "result", tool_call_id="c1", name="lookup"),
    ]
    with OpenAICompatibleClient(BASE, api_key="sk-wire") as client:
        chunks = list(client.stream(messages, tools=tools, options=options))
    assert chunks[-1].is_completed and chunks[0].content == "ok"
    body = sent(wire)
    assert body == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"x"}'}}]},
            {"role": "tool", "content": "result", "tool_call_id": "c1", "name": "lookup"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "lookup", "description": "Find a thing",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "model": "m1", "temperature": 0.2, "max_tokens": 64, "stop": ["END"], "top_p": 0.9, "seed": 7,
    }


def test_stream_headers(wire):
    with OpenAICompatibleClient(BASE, api_key="sk-wire", headers={"X-Org": "acme"}) as client:
        list(client.stream([{"role": "user", "content": "hi"}]))
    sent_headers = headers(wire)
    assert sent_headers["Authorization"] == "Bearer sk-wire"
    assert sent_headers["Accept"] == "text/event-stream"
    assert sent_headers["Accept-Encoding"] == "identity"
    assert sent_headers["Content-Type"] == "application/json"
    assert sent_headers["X-Org"] == "acme"


def test_no_api_key_means_no_authorization_header(wire):
    with OpenAICompatibleClient(BASE) as client:
        list(client.stream([{"role": "user", "content": "hi"}]))
    assert "Authorization" not in headers(wire)


def test_extra_options_may_override_defaults(wire):
    with OpenAICompatibleClient(BASE) as client:
        list(client.stream([{"role": "user", "content": "hi"}],
                           options=CompletionOptions(extra={"stream_options": {"include_usage": False}})))
    assert sent(wire)["stream_options"] == {"include_usage": False}


def test_complete_body_and_headers():
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, f"{BASE}/chat/completions", json=COMPLETION)
        with OpenAICompatibleClient(BASE, api_key="sk-wire") as client:
            answer = client.complete([Message("user", "hi")], options=CompletionOptions(model="m2"))
        body, sent_headers = sent(mock), headers(mock)
    assert answer.content == "ok"
    assert body == {"messages": [{"role": "user", "content": "hi"}], "model": "m2"}
    assert "stream" not in body and "tools" not in body
    assert sent_headers["Accept"] == "application/json" and sent_headers["Authorization"] == "Bearer sk-wire"


def test_embeddings_body_and_url():
    payload = {"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}]}
    with responses.RequestsMock() as mock:
        mock.add(responses.POST, f"{BASE}/embeddings", json=payload)
        with OpenAICompatibleClient(BASE + "/", api_key="sk-wire") as client:
            vectors = client.embed(["first", "second"], "emb")
        body = sent(mock)
    assert body == {"model": "emb", "input": ["first", "second"]}
    assert vectors == [[1.0, 0.0], [0.0, 1.0]]


def test_timeout_is_connect_only(wire, monkeypatch):
    seen: List[Any] = []
    original = requests.Session.request

    def spy(self, method, url, **kwargs):
        seen.append(kwargs.get("timeout"))
        return original(self, method, url, **kwargs)

    monkeypatch.setattr(requests.Session, "request", spy)
    with OpenAICompatibleClient(BASE, connect_timeout=3.5) as client:
        list(client.stream([{"role": "user", "content": "hi"}]))
    assert seen == [(3.5, None)]
