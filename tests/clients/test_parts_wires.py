"""Images, audio and files reach each wire in its own shape, over real HTTP; the SDKs are the oracles.

For each wire one conversation with parts goes out twice to a FakeProvider:
once from the vendor's SDK, written as that API documents it, once from our
client, written in OpenAI's content parts.  The content the provider
received must be the same, and each part must validate against the SDK's
own request types.  A part a wire cannot carry is refused before any
request, naming the part and the wire.
"""
from __future__ import annotations

import base64
from typing import Any, Dict, Iterator, List

import anthropic
import openai
import pydantic
import pytest
from anthropic.types import DocumentBlockParam, ImageBlockParam, TextBlockParam
from openai.types.chat import ChatCompletionContentPartParam
from openai.types.responses import ResponseInputContentParam
from parts_support import IMAGE_BY_URL, PDF, PDF_URL, PNG, PNG_URL, WAV, b64, data_url

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    ConfigError,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    RoutedClient,
    StreamingEngine,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MODEL = "vision-model"
NOTES = "Herons nest in colonies.\n"
QUESTION = {"type": "text", "text": "What is in these?"}
IMAGE_INLINE = {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}}
IMAGE_URL = {"type": "image_url", "image_url": {"url": IMAGE_BY_URL}}
PDF_PART = {"type": "file", "file": {"file_data": PDF_URL, "filename": "notes.pdf"}}
TEXT_FILE = {"type": "file", "file": {"file_data": data_url("text/plain", NOTES.encode()), "filename": "notes.txt"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}}
CLIENTS = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient, "responses": OpenAIResponsesClient}


def ask(parts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]


@pytest.fixture(params=sorted(CLIENTS))
def wire(request):
    return request.param


def provider_and_client(wire: str) -> Iterator[Any]:
    with FakeProvider(wire=wire) as fp, CLIENTS[wire](fp.base_url, api_key="sk-parts") as client:
        yield fp, client


def send(client: Any, messages: List[Dict[str, Any]]) -> str:
    """Our client's streamed answer, read to its end."""
    return "".join(chunk.content or "" for chunk in client.stream(messages, options=CompletionOptions(model=MODEL)))


def validate(part_type: Any, part: Dict[str, Any]) -> None:
    """``part`` is a value of the SDK's own TypedDict for it (required keys, literals, types)."""
    pydantic.TypeAdapter(part_type).validate_python(part, strict=True)


def test_chat_completions_carries_every_part_as_the_openai_sdk_sends_it():
    parts = [QUESTION, IMAGE_INLINE, IMAGE_URL, AUDIO, PDF_PART]
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key="sk-parts") as client:
        fp.add_turn(s.text("a heron"))
        fp.add_turn(s.text("a heron"))
        sdk = openai.OpenAI(base_url=fp.base_url, api_key="sk-parts", max_retries=0)
        try:
            sdk.chat.completions.create(model=MODEL, messages=ask(parts))
        finally:
            sdk.close()
        assert send(client, ask(parts)) == "a heron"
        theirs, mine = fp.requests
    assert mine.json["messages"] == theirs.json["messages"]
    assert mine.parts == [IMAGE_INLINE, IMAGE_URL, AUDIO, PDF_PART]
    for part in mine.json["messages"][1]["content"]:
        validate(ChatCompletionContentPartParam, part)


def test_anthropic_gets_image_and_document_blocks_as_the_anthropic_sdk_sends_them():
    documented = [
        {"type": "text", "text": "What is in these?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
        {"type": "image", "source": {"type": "url", "url": IMAGE_BY_URL}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
         "title": "notes.pdf"},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": NOTES},
         "title": "notes.txt"},
    ]
    with FakeProvider(wire="anthropic") as fp, AnthropicClient(fp.base_url, api_key="sk-parts") as client:
        fp.add_turn(s.text("a heron"))
        fp.add_turn(s.text("a heron"))
        sdk = anthropic.Anthropic(base_url=fp.base_url, api_key="sk-parts", max_retries=0)
        try:
            sdk.messages.create(model=MODEL, max_tokens=100, system="Be brief.",
                                messages=[{"role": "user", "content": documented}])
        finally:
            sdk.close()
        assert send(client, ask([QUESTION, IMAGE_INLINE, IMAGE_URL, PDF_PART, TEXT_FILE])) == "a heron"
        theirs, mine = fp.requests
    assert mine.json["messages"] == theirs.json["messages"]
    assert mine.parts == documented[1:]
    types = {"text": TextBlockParam, "image": ImageBlockParam, "document": DocumentBlockParam}
    for block in mine.json["messages"][0]["content"]:
        validate(types[block["type"]], block)


def test_responses_gets_input_parts_as_the_openai_sdk_sends_them():
    documented = [
        {"type": "input_text", "text": "What is in these?"},
        {"type": "input_image", "image_url": PNG_URL, "detail": "low"},
        {"type": "input_image", "image_url": IMAGE_BY_URL, "detail": "auto"},
        {"type": "input_file", "file_data": PDF_URL, "filename": "notes.pdf"},
        {"type": "input_file", "file_url": "https://files.example/notes.pdf"},
    ]
    by_url = {"type": "file", "file": {"file_url": "https://files.example/notes.pdf"}}
    history = [{"role": "assistant", "content": [{"type": "text", "text": "Send them."}]}]
    with FakeProvider(wire="responses") as fp, OpenAIResponsesClient(fp.base_url, api_key="sk-parts") as client:
        fp.add_turn(s.text("a heron"))
        fp.add_turn(s.text("a heron"))
        sdk = openai.OpenAI(base_url=fp.base_url, api_key="sk-parts", max_retries=0)
        try:
            sdk.responses.create(model=MODEL, instructions="Be brief.", input=[
                {"type": "message", "role": "assistant", "content": "Send them."},
                {"type": "message", "role": "user", "content": documented}])
        finally:
            sdk.close()
        messages = ask([QUESTION, IMAGE_INLINE, IMAGE_URL, PDF_PART, by_url])
        assert send(client, [messages[0], *history, messages[1]]) == "a heron"
        theirs, mine = fp.requests
    assert mine.json["input"] == theirs.json["input"]
    assert mine.parts == documented[1:]
    for part in mine.json["input"][1]["content"]:
        validate(ResponseInputContentParam, part)


@pytest.mark.parametrize("wire_name, part, words", [
    ("anthropic", AUDIO, ["audio part (audio/wav, ", "the Anthropic Messages API", "takes no audio"]),
    ("anthropic", {"type": "file", "file": {"file_id": "file-abc"}}, ["by file_id", "another provider"]),
    ("anthropic", {"type": "image_url", "image_url": {"url": data_url("image/bmp", b"BM")}},
     ["image/bmp", "image/png"]),
    ("anthropic", {"type": "file", "file": {"file_data": data_url("application/zip", b"PK")}},
     ["PDFs or plain text, not application/zip"]),
    ("anthropic", {"type": "file", "file": {"file_data": data_url("text/plain", b"\xff\xfe")}}, ["UTF-8"]),
    ("responses", AUDIO, ["the OpenAI Responses API", "OpenAICompatibleClient"]),
    ("openai", {"type": "file", "file": {"file_url": "https://files.example/a.pdf"}},
     ["the Chat Completions API", "not by URL"]),
])
def test_a_part_a_wire_cannot_carry_is_refused_before_any_request(wire_name, part, words):
    for fp, client in provider_and_client(wire_name):
        with pytest.raises(ConfigError) as info:
            send(client, ask([QUESTION, part]))
        with pytest.raises(ConfigError):
            client.complete(ask([QUESTION, part]), options=CompletionOptions(model=MODEL))
        assert fp.request_count == 0
    message = str(info.value)
    for word in ["messages[1]", f"to model {MODEL!r}", *words]:
        assert word in message
    assert b64(WAV)[:16] not in message


def test_the_engine_checks_every_failover_model_before_the_first_request():
    with FakeProvider() as chat, FakeProvider(wire="anthropic") as messages_api, \
            OpenAICompatibleClient(chat.base_url) as openai_client, \
            AnthropicClient(messages_api.base_url, api_key="sk-ant") as anthropic_client:
        routed = RoutedClient({"openai": openai_client, "anthropic": anthropic_client})
        config = EngineConfig(models=["openai:gpt-4o-audio", "anthropic:claude-x"])
        with StreamingEngine(routed, [], config) as engine:
            with pytest.raises(ConfigError, match=r"audio part .* to model 'claude-x' over the Anthropic Messages"):
                engine.run(ask([QUESTION, AUDIO]))
            chat.add_turn(s.text("I hear silence."))
            # one model, on a wire that carries audio: the run goes ahead
            result = engine.complete(ask([QUESTION, AUDIO]), model="openai:gpt-4o-audio")
        assert result.answer == "I hear silence."
        assert chat.requests[-1].parts == [AUDIO] and messages_api.request_count == 0


def test_a_user_message_of_text_parts_only_reaches_anthropic_and_responses_as_text(wire):
    for fp, client in provider_and_client(wire):
        fp.add_turn(s.text("ok"))
        send(client, ask([QUESTION, {"type": "text", "text": ""}, {"type": "text", "text": "Briefly."}]))
        request = fp.requests[0].json
        assert fp.requests[0].parts == []
        turns = request.get("messages", request.get("input"))
        texts = [b.get("text") for b in turns[-1]["content"]]
        assert [t for t in texts if t] == ["What is in these?", "Briefly."]


def test_the_recorded_parts_hold_the_bytes_that_were_sent():
    with FakeProvider(wire="anthropic") as fp, AnthropicClient(fp.base_url, api_key="sk-parts") as client:
        fp.add_turn(s.text("ok"))
        send(client, ask([QUESTION, IMAGE_INLINE]))
        (image,) = fp.requests[0].parts
    assert base64.b64decode(image["source"]["data"]) == PNG
