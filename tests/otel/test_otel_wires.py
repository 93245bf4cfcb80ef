"""What each wire tells a chat span: the response's id, cached input tokens, the request's top_p.

Over real HTTP to a FakeProvider on 127.0.0.1 speaking each wire (Chat
Completions, Anthropic Messages, Responses).  The streams with cached-token
counts are written byte for byte here (FakeProvider's ``raw`` step), as each
provider documents them.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    StreamingEngine,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

QUESTION = [{"role": "user", "content": "hi"}]
WIRES = ["openai", "anthropic", "responses"]
CLIENTS = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient, "responses": OpenAIResponsesClient}
FAKE_IDS = {"openai": "chatcmpl-fake-", "anthropic": "msg_fake_", "responses": "resp_fake_"}


def sse(event: str, payload: Dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n"


def data(payload: Any) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


#: One answer "hi" per wire, with id "<wire>-answer-7", 100 input tokens of which 64 were read from the cache,
#: and (where the wire counts them) 2 of its 5 output tokens spent reasoning.
CACHED_STREAMS = {
    "openai": "".join([
        data({"id": "openai-answer-7", "object": "chat.completion.chunk", "model": "m",
              "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
        data({"id": "openai-answer-7", "object": "chat.completion.chunk", "model": "m",
              "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}),
        data({"id": "openai-answer-7", "object": "chat.completion.chunk", "model": "m",
              "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        data({"id": "openai-answer-7", "object": "chat.completion.chunk", "model": "m", "choices": [],
              "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                        "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
                        "completion_tokens_details": {"reasoning_tokens": 2}}}),
        data("[DONE]"),
    ]),
    "anthropic": "".join([
        sse("message_start", {"type": "message_start", "message": {
            "id": "anthropic-answer-7", "type": "message", "role": "assistant", "model": "m", "content": [],
            "stop_reason": None, "usage": {"input_tokens": 30, "cache_creation_input_tokens": 6,
                                           "cache_read_input_tokens": 64, "output_tokens": 1}}}),
        sse("content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}),
        sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                    "delta": {"type": "text_delta", "text": "hi"}}),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                              "usage": {"output_tokens": 5}}),
        sse("message_stop", {"type": "message_stop"}),
    ]),
    "responses": "".join([
        sse("response.created", {"type": "response.created", "response": {
            "id": "responses-answer-7", "object": "response", "status": "in_progress", "model": "m", "output": []}}),
        sse("response.output_text.delta", {"type": "response.output_text.delta", "item_id": "msg_1",
                                           "output_index": 0, "content_index": 0, "delta": "hi"}),
        sse("response.completed", {"type": "response.completed", "response": {
            "id": "responses-answer-7", "object": "response", "status": "completed", "model": "m",
            "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 5,
                      "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 105}}}),
    ]),
}

#: The same answers, not streamed (the whole JSON body).
CACHED_BODIES = {
    "openai": {"id": "openai-answer-7", "object": "chat.completion", "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                         "prompt_tokens_details": {"cached_tokens": 64}}},
    "anthropic": {"id": "anthropic-answer-7", "type": "message", "role": "assistant", "model": "m",
                  "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                  "usage": {"input_tokens": 30, "cache_creation_input_tokens": 6, "cache_read_input_tokens": 64,
                            "output_tokens": 5}},
    "responses": {"id": "responses-answer-7", "object": "response", "status": "completed", "model": "m",
                  "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
                  "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 5,
                            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 105}},
}


class Spans:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def chats(self) -> List[Any]:
        return sorted((span for span in self.exporter.get_finished_spans() if span.name.startswith("chat ")),
                      key=lambda span: span.start_time)


def run_on(wire: str, fp: FakeProvider, spans: Spans, **config: Any) -> Any:
    engine = StreamingEngine(CLIENTS[wire](fp.base_url),
                             config=EngineConfig(models=["m"], idle_timeout=5, completion_timeout=10, **config),
                             tracer_provider=spans.provider)
    with engine:
        return engine.complete(QUESTION)


def two_runs(wire: str, *options: Any) -> Any:
    """Two runs on ``wire`` (with ``options`` each, if given): their chat spans and the request bodies."""
    spans = Spans()
    with FakeProvider(wire=wire) as fp:
        for number, run_options in enumerate(options or (None, None)):
            fp.add_turn(s.text(f"answer {number}"))
            run_on(wire, fp, spans, **({"options": run_options} if run_options is not None else {}))
        return spans.chats(), [request.json for request in fp.requests]


@pytest.mark.parametrize("wire", WIRES)
def test_a_chat_span_carries_the_id_the_provider_gave_its_answer(wire):
    chats, _ = two_runs(wire)
    ids = [span.attributes.get("gen_ai.response.id") for span in chats]
    assert [value.startswith(FAKE_IDS[wire]) for value in ids] == [True, True] and ids[0] != ids[1]


@pytest.mark.parametrize("wire", WIRES)
def test_cached_input_tokens_are_read_from_each_wire_and_reach_the_span(wire):
    spans = Spans()
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(s.raw(CACHED_STREAMS[wire]), auto_finish=False)
        result = run_on(wire, fp, spans)
    assert result.answer == "hi"
    assert (result.usage.prompt_tokens, result.usage.cached_tokens) == (100, 64)
    (chat,) = spans.chats()
    assert chat.attributes["gen_ai.response.id"] == f"{wire}-answer-7"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 100
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 64
    assert chat.attributes.get("gen_ai.usage.reasoning.output_tokens") == (None if wire == "anthropic" else 2)


@pytest.mark.parametrize("wire", WIRES)
def test_a_whole_answer_carries_its_id_and_cached_tokens(wire):
    with FakeProvider(wire=wire) as fp:
        fp.add_turn(s.raw(json.dumps(CACHED_BODIES[wire])), auto_finish=False)
        with CLIENTS[wire](fp.base_url) as client:
            response = client.complete(QUESTION, options=CompletionOptions(model="m"))
    assert (response.content, response.id) == ("hi", f"{wire}-answer-7")
    assert (response.usage.prompt_tokens, response.usage.cached_tokens) == (100, 64)


@pytest.mark.parametrize("wire", WIRES)
def test_top_p_is_an_option_sent_on_each_wire_and_named_on_the_span(wire):
    chats, sent = two_runs(wire, {"top_p": 0.25, "temperature": 0.5}, CompletionOptions(top_p=0.75))
    assert [body["top_p"] for body in sent] == [0.25, 0.75]
    assert [span.attributes["gen_ai.request.top_p"] for span in chats] == [0.25, 0.75]
    assert chats[0].attributes["gen_ai.request.temperature"] == 0.5


def test_top_p_is_merged_and_kept_like_every_other_option():
    base = CompletionOptions(temperature=0.1, top_p=0.9)
    assert base.merged(CompletionOptions(top_p=0.5)).top_p == 0.5
    assert base.merged(CompletionOptions(temperature=0.2)).top_p == 0.9
    assert base.with_model("m").top_p == 0.9
    assert CompletionOptions(top_p=0.3).to_body() == {"top_p": 0.3}
