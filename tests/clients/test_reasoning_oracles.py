"""The reasoning FakeProvider sends is what the official SDKs read, and our clients read the same.

Each script is played twice on one provider: to the anthropic or openai SDK,
then to our client.  The SDK was written against the real API, so if it reads
the thinking text, the signature, the redacted block, the ``reasoning`` delta
or the encrypted reasoning item as we do, the fake speaks the real format and
our clients keep what the provider needs back (``Response.provider_items``).
"""
from __future__ import annotations

from typing import Any, Dict, List

import anthropic
import openai
import pytest
from engine_calls import EngineCall

from streamengine import AnthropicClient, CompletionOptions, OpenAICompatibleClient, OpenAIResponsesClient, Response
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MODEL = "oracle-model"
MESSAGES = [{"role": "user", "content": "hi"}]
THINKING = [s.reasoning("I should "), s.reasoning("look it up."), s.redacted_reasoning("c2VjcmV0IHRob3VnaHQ="),
            s.text("Looking."), s.tool_call(0, id="call_01", name="lookup", arguments='{"q": "rain"}'),
            s.usage(prompt=9, completion=7)]


def items_of(response: Response) -> List[Dict[str, Any]]:
    return [dict(item.data) for item in response.provider_items]


# -- Anthropic ----------------------------------------------------------------------------------

def test_the_anthropic_sdk_reads_signed_and_redacted_thinking_as_our_client_keeps_it():
    with FakeProvider(wire="anthropic") as fp, AnthropicClient(fp.base_url, api_key="sk-ant-oracle") as client:
        sdk = anthropic.Anthropic(base_url=fp.base_url, api_key="sk-ant-oracle", max_retries=0)
        try:
            for _ in range(4):
                fp.add_turn(*THINKING)
            with sdk.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
                streamed = stream.get_final_message()
            whole = sdk.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
            ours_streamed = EngineCall(client).call(MESSAGES, options=CompletionOptions(model=MODEL))
            ours_whole = client.complete(MESSAGES, options=CompletionOptions(model=MODEL))
        finally:
            sdk.close()
    for theirs, ours in ((streamed, ours_streamed), (whole, ours_whole)):
        blocks = [block.model_dump(exclude_none=True) for block in theirs.content
                  if block.type in ("thinking", "redacted_thinking")]
        assert blocks == [{"type": "thinking", "thinking": "I should look it up.", "signature": blocks[0]["signature"]},
                          {"type": "redacted_thinking", "data": "c2VjcmV0IHRob3VnaHQ="}]
        assert blocks[0]["signature"]
        assert items_of(ours) == blocks
        assert ours.reasoning == "I should look it up." and ours.content == "Looking."


# -- Chat Completions ---------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_the_openai_sdk_reads_either_reasoning_field_as_our_client_does(field):
    script = [s.reasoning("I should ", field=field), s.reasoning("look it up.", field=field), s.text("Looking.")]
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key="sk-oracle") as client:
        sdk = openai.OpenAI(base_url=fp.base_url, api_key="sk-oracle", max_retries=0)
        try:
            for _ in range(4):
                fp.add_turn(*script)
            chunks = list(sdk.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
            message = sdk.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message
            ours_streamed = EngineCall(client).call(MESSAGES, options=CompletionOptions(model=MODEL))
            ours_whole = client.complete(MESSAGES, options=CompletionOptions(model=MODEL))
        finally:
            sdk.close()
    streamed = "".join(getattr(choice.delta, field, None) or "" for chunk in chunks for choice in chunk.choices)
    assert streamed == getattr(message, field) == "I should look it up."
    for ours in (ours_streamed, ours_whole):
        assert (ours.reasoning, ours.content, ours.provider_items) == ("I should look it up.", "Looking.", ())


# -- Responses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("encrypted", [False, True])
def test_the_openai_sdk_reads_reasoning_items_as_our_responses_client_keeps_them(encrypted):
    include = ["reasoning.encrypted_content"] if encrypted else None
    options = CompletionOptions(model=MODEL, extra={"include": include} if include else None)
    with FakeProvider(wire="responses") as fp, OpenAIResponsesClient(fp.base_url, api_key="sk-oracle") as client:
        sdk = openai.OpenAI(base_url=fp.base_url, api_key="sk-oracle", max_retries=0)
        try:
            for _ in range(4):
                fp.add_turn(*THINKING)
            extra = {"include": include} if include else {}
            with sdk.responses.stream(model=MODEL, input=MESSAGES, **extra) as stream:
                summaries = [e.delta for e in stream if e.type == "response.reasoning_summary_text.delta"]
                streamed = stream.get_final_response()
            whole = sdk.responses.create(model=MODEL, input=MESSAGES, **extra)
            ours_streamed = EngineCall(client).call(MESSAGES, options=options)
            ours_whole = client.complete(MESSAGES, options=options)
        finally:
            sdk.close()
    assert "".join(summaries) == "I should look it up."
    for theirs, ours in ((streamed, ours_streamed), (whole, ours_whole)):
        items = [item.model_dump(exclude_none=True) for item in theirs.output if item.type == "reasoning"]
        assert [item["summary"] for item in items] == [[{"type": "summary_text", "text": "I should look it up."}], []]
        assert ("encrypted_content" in items[0]) is encrypted
        assert items[1]["encrypted_content"] == "c2VjcmV0IHRob3VnaHQ="
        assert items_of(ours) == items
        assert ours.reasoning == "I should look it up." and ours.content == "Looking."
