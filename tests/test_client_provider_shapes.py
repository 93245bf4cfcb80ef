"""Real providers' stream shapes the clients must read as the provider means them.

The frames below are written by hand from each provider's documented wire
format (Mistral's typed ``thinking`` parts of Magistral, OpenAI's ``refusal``
delta and refusal content part, Groq's and vLLM's in-band errors, Anthropic's
``error`` event); each is sent over real loopback HTTP by FakeProvider.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest
from http_support import CLIENTS, MESSAGES

from streamengine import EngineConfig, RefusalEvent, StreamingEngine
from streamengine._calls.failover import ErrorClass, ErrorClassifier
from streamengine._calls.strategies import BufferedCallStrategy, StreamingCallStrategy
from streamengine._clients.openai.client import OpenAICompatibleClient
from streamengine._errors import LlmHttpError, LlmStreamError
from streamengine._messages import CompletionOptions
from streamengine._wait import drive
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

# -- recordings ------------------------------------------------------------------------

MAGISTRAL_THOUGHT = ["The user greets me. ", "A short greeting back ", "is right."]


def _mistral_frame(delta: Dict[str, Any], finish: Any = None) -> Dict[str, Any]:
    return {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "magistral-small-2509",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def magistral_stream() -> List[Dict[str, Any]]:
    """Magistral: the role first, then thinking as typed parts, then text parts, then the finish."""
    frames = [_mistral_frame({"role": "assistant", "content": ""})]
    frames += [_mistral_frame({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": t}]}]})
               for t in MAGISTRAL_THOUGHT]
    frames += [_mistral_frame({"content": [{"type": "text", "text": "Hello"}]}),
               _mistral_frame({"content": "!"}), _mistral_frame({}, "stop")]
    return frames


def magistral_answer() -> Dict[str, Any]:
    """The same answer, not streamed: ``message.content`` is the list of parts."""
    return {"id": "cmpl-2", "object": "chat.completion", "created": 1, "model": "magistral-small-2509",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": [
                {"type": "thinking", "thinking": [{"type": "text", "text": "".join(MAGISTRAL_THOUGHT)}]},
                {"type": "text", "text": "Hello!"}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}


REFUSAL = "I'm sorry, I can't help with that."


def openai_refusal_stream() -> List[Dict[str, Any]]:
    """OpenAI: ``delta.refusal`` pieces, ``content`` null, finish ``stop``."""
    return ([_mistral_frame({"role": "assistant", "content": None, "refusal": ""})]
            + [_mistral_frame({"refusal": piece}) for piece in ("I'm sorry, ", "I can't help with that.")]
            + [_mistral_frame({}, "stop")])


def openai_refusal_answer() -> Dict[str, Any]:
    return {"id": "cmpl-3", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": None, "refusal": REFUSAL}}]}


#: In-band errors as providers send them inside a 200 stream -> what failover must do.
IN_BAND_ERRORS = {
    # Groq: OpenAI's error object; a bad request keeps its status.
    "groq-400": ({"error": {"message": "'messages.0' : for 'role:user' the following must be satisfied",
                            "type": "invalid_request_error", "status_code": 400}},
                 LlmHttpError, ErrorClass.FATAL),
    # vLLM: the status as a numeric ``code``.
    "vllm-400": ({"error": {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError",
                            "param": None, "code": 400}}, LlmHttpError, ErrorClass.FATAL),
    # OpenAI: a rate limit in the stream is retried like an HTTP 429.
    "openai-429": ({"error": {"message": "Rate limit reached for gpt-4o", "type": "tokens",
                              "code": "rate_limit_exceeded"}}, LlmHttpError, ErrorClass.TRANSIENT_RETRY),
    # OpenRouter: a provider failing upstream, status 502.
    "openrouter-502": ({"error": {"code": 502, "message": "Provider returned error"}},
                       LlmStreamError, ErrorClass.TRANSIENT_ADVANCE),
    "overloaded": ({"error": {"message": "Overloaded", "type": "overloaded_error"}},
                   LlmStreamError, ErrorClass.TRANSIENT_ADVANCE),
    "unknown": ({"error": {"message": "something odd happened"}}, LlmStreamError, ErrorClass.TRANSIENT_ADVANCE),
}


def sse(frame: Any) -> bytes:
    return b"data: " + json.dumps(frame).encode() + b"\n\n"


def paced(frames: List[Dict[str, Any]], gap: float) -> List[Any]:
    """The frames as steps, ``gap`` seconds apart, and ``[DONE]``."""
    out: List[Any] = []
    for frame in frames:
        out += [s.raw(sse(frame)), s.delay(gap)]
    return out + [s.done()]


@pytest.fixture
def fp():
    with FakeProvider() as provider:
        yield provider


@pytest.fixture
def client(fp):
    with OpenAICompatibleClient(fp.base_url, stream_options=False) as c:
        yield c


# -- 1. thinking as typed parts ----------------------------------------------------------

def test_magistral_thinking_parts_are_reasoning_and_keep_the_idle_timer_from_firing(fp, client):
    # 0.6 s between frames, idle timeout 2 s: the first text comes 2.4 s in, after thinking only.
    fp.add_turn(*paced(magistral_stream(), 0.6))
    strategy = StreamingCallStrategy(client, idle_timeout=2.0, completion_timeout=30.0)
    response = drive(strategy.stream_call(MESSAGES))
    assert response.reasoning == "".join(MAGISTRAL_THOUGHT)
    assert response.content == "Hello!"


def test_a_thinking_only_frame_is_meaningful(fp, client):
    fp.add_turn(*paced(magistral_stream()[:2], 0.0))
    chunks = list(client.stream(MESSAGES))
    thinking = [c for c in chunks if c.reasoning]
    assert thinking and thinking[0].is_meaningful and thinking[0].content is None


def test_magistral_thinking_parts_are_reasoning_on_the_buffered_path(fp, client):
    fp.add_turn(s.raw(json.dumps(magistral_answer())))
    response = drive(BufferedCallStrategy(client, completion_timeout=30.0).stream_call(MESSAGES))
    assert response.reasoning == "".join(MAGISTRAL_THOUGHT) and response.content == "Hello!"


# -- 2. refusals -------------------------------------------------------------------------

def test_a_streamed_refusal_is_its_own_field_event_and_result(fp, client):
    fp.add_turn(*paced(openai_refusal_stream(), 0.0))
    with StreamingEngine(client, config=EngineConfig(models=["gpt-4o"])) as engine:
        events = list(engine.run([{"role": "user", "content": "how do I pick a lock?"}]))
    refusals = [e for e in events if isinstance(e, RefusalEvent)]
    assert [(e.text, e.round) for e in refusals] == [(REFUSAL, 1)]
    result = events[-1].result
    assert result.refusal == REFUSAL and result.answer == ""
    assert not [e for e in events if e.name == "token"]  # a refusal is not answer text


def test_a_refusal_content_part_and_a_buffered_refusal_are_read(fp, client):
    fp.add_turn(*paced([_mistral_frame({"content": [{"type": "refusal", "refusal": REFUSAL}]}),
                        _mistral_frame({}, "stop")], 0.0))
    fp.add_turn(s.raw(json.dumps(openai_refusal_answer())))
    streamed = drive(StreamingCallStrategy(client, idle_timeout=5.0, completion_timeout=30.0).stream_call(MESSAGES))
    whole = drive(BufferedCallStrategy(client, completion_timeout=30.0).stream_call(MESSAGES))
    assert streamed.refusal == REFUSAL and streamed.content == ""
    assert whole.refusal == REFUSAL and whole.content == ""


# -- 3. one classification of in-band errors -----------------------------------------------

@pytest.mark.parametrize("name", sorted(IN_BAND_ERRORS))
def test_an_in_band_error_is_classified_by_the_providers_status_or_type(fp, client, name):
    payload, expected, verdict = IN_BAND_ERRORS[name]
    fp.add_turn(s.text("partial"), s.raw(sse(payload)))
    with pytest.raises(Exception) as info:
        list(client.stream(MESSAGES))
    assert type(info.value) is expected and payload["error"]["message"] in str(info.value)
    assert ErrorClassifier().classify(info.value) is verdict


@pytest.mark.parametrize("name", ["groq-400", "overloaded"])
def test_an_in_band_error_in_a_whole_answer_is_classified_alike(fp, client, name):
    payload, expected, verdict = IN_BAND_ERRORS[name]
    fp.add_turn(s.raw(json.dumps(payload)))
    with pytest.raises(Exception) as info:
        client.complete(MESSAGES)
    assert type(info.value) is expected and ErrorClassifier().classify(info.value) is verdict


@pytest.mark.parametrize("kind, verdict", [("invalid_request_error", ErrorClass.FATAL),
                                           ("overloaded_error", ErrorClass.TRANSIENT_ADVANCE)])
def test_the_same_error_type_is_classified_alike_on_both_wires(kind, verdict):
    verdicts = []
    for wire in ("openai", "anthropic"):
        with FakeProvider(wire=wire) as fp, CLIENTS[wire](fp.base_url, api_key="k") as wire_client:
            fp.add_turn(s.text("partial"), s.error_frame("it went wrong", type=kind))
            with pytest.raises(Exception) as info:
                list(wire_client.stream(MESSAGES, options=CompletionOptions(model="m")))
        verdicts.append((type(info.value), ErrorClassifier().classify(info.value)))
    assert verdicts[0] == verdicts[1] and verdicts[0][1] is verdict
