"""OpenAIResponsesClient through real loopback HTTP (FakeProvider(wire="responses") on 127.0.0.1).

The wire the fake speaks is checked against the official SDK in
test_responses_sdk.py; here the client reads it -- and the variants
real servers send, written out as raw events: no ``event:`` lines and no
``sequence_number`` (OpenRouter, older OpenAI), no argument deltas (LM
Studio), flat and nested ``error`` events, hosted tools' progress.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from engine_calls import streamed
from http_support import FRAMINGS, MESSAGES, busy_connection_threads, cancel_while_blocked, text_of

from streamengine import (
    Chunk,
    CompletionOptions,
    ConfigError,
    EngineConfig,
    ErrorClass,
    ErrorClassifier,
    LlmCancelledError,
    LlmHttpError,
    LlmProtocolError,
    LlmStreamError,
    Message,
    OpenAIResponsesClient,
    StreamingEngine,
    TokenEvent,
    ToolCall,
    ToolSpec,
    ToolStartEvent,
    Usage,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

OPTIONS = CompletionOptions(model="gpt-test")
KEY = "sk-responses-test-key"
classify = ErrorClassifier().classify

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def fp() -> Iterator[FakeProvider]:
    with FakeProvider(wire="responses") as fake:
        yield fake


@pytest.fixture
def client(fp: FakeProvider) -> Iterator[OpenAIResponsesClient]:
    with OpenAIResponsesClient(fp.base_url, api_key=KEY) as c:
        yield c


def collect(client: OpenAIResponsesClient, messages: Any = MESSAGES, **kwargs: Any) -> List[Chunk]:
    kwargs.setdefault("options", OPTIONS)
    return list(client.stream(messages, **kwargs))


def failing(client: OpenAIResponsesClient, fp: FakeProvider, *steps: Any) -> BaseException:
    fp.add_turn(*steps)
    with pytest.raises(Exception) as info:
        collect(client)
    return info.value


def event(kind: str, named: bool = True, **payload: Any) -> Any:
    """A raw Responses event; ``named=False`` leaves out the ``event:`` line (OpenRouter's streams)."""
    data = json.dumps({"type": kind, **payload})
    return s.raw((f"event: {kind}\n" if named else "") + f"data: {data}\n\n")


def created(named: bool = True) -> Any:
    return event("response.created", named, response={"id": "resp_1", "status": "in_progress", "model": "gpt-x",
                                                      "output": []})


def completed(named: bool = True, status: str = "completed", **response: Any) -> Any:
    kind = "response.completed" if status == "completed" else f"response.{status}"
    body = {"id": "resp_1", "status": status, "model": "gpt-x", "output": [],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}, **response}
    return event(kind, named, response=body)


def function_item(item_id: str, call_id: str, name: str, arguments: str = "") -> Dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": "in_progress"}


def with_calls(client: OpenAIResponsesClient) -> Tuple[List[Chunk], List[ToolCall]]:
    """The chunks of one streamed call and the tool calls the engine assembled from them."""
    chunks, response = streamed(client, MESSAGES, OPTIONS)
    return chunks, list(response.tool_calls)


# -- reading the stream -------------------------------------------------------------------


@pytest.mark.parametrize("framing", FRAMINGS)
def test_text_reasoning_calls_usage_and_finish_reason(framing):
    with FakeProvider(framing=framing, wire="responses") as fp, OpenAIResponsesClient(fp.base_url) as client:
        fp.add_turn(s.reasoning("let me see"), s.text("Hel"), s.text("lo"),
                    s.tool_call(0, id="call_a", name="lookup", arguments='{"q": '),
                    s.tool_call(0, arguments='"x"}'),
                    s.tool_call(1, id="call_b", name="now"),
                    s.usage(prompt=11, completion=7))
        chunks, calls = with_calls(client)
    assert text_of(chunks) == "Hello"
    assert "".join(c.reasoning or "" for c in chunks) == "let me see"
    assert calls == [ToolCall("call_a", "lookup", '{"q": "x"}'), ToolCall("call_b", "now", "{}")]
    last = chunks[-1]
    assert last.is_completed and sum(c.is_completed for c in chunks) == 1
    assert (last.finish_reason, last.usage, last.model) == ("tool_calls", Usage(11, 7, 18), "gpt-test")


def test_the_call_id_is_the_items_call_id_not_its_fc_item_id(fp, client):
    fp.add_turn(created(), event("response.output_item.added", output_index=0,
                                 item=function_item("fc_123", "call_abc", "lookup")),
                event("response.function_call_arguments.delta", item_id="fc_123", output_index=0, delta='{"q": 1}'),
                event("response.output_item.done", output_index=0,
                      item=function_item("fc_123", "call_abc", "lookup", '{"q": 1}')),
                completed(), auto_finish=False)
    assert with_calls(client)[1] == [ToolCall("call_abc", "lookup", '{"q": 1}')]


def test_a_call_is_complete_at_its_output_item_done_before_response_completed(fp, client):
    # The call must start at its output_item.done: the server holds the rest until it has.
    ran = threading.Event()

    @tool
    def first(a: int) -> str:
        """Notes that it ran."""
        ran.set()
        return "one"

    fp.add_turn(s.tool_call(0, id="call_1", name="first", arguments='{"a": 1}'), s.wait(ran, timeout=5),
                s.text("after the call"))
    fp.add_turn(s.text("done"))
    with StreamingEngine(client, [first], EngineConfig(models=["gpt-test"], tool_mode="native")) as engine:
        events = list(engine.run(MESSAGES))
    seen = [f"call {e.call.id}" if isinstance(e, ToolStartEvent) else e.text for e in events
            if isinstance(e, (ToolStartEvent, TokenEvent))]
    assert seen == ["call call_1", "after the call", "done"]


def test_a_server_without_argument_deltas_gives_them_in_arguments_done_or_item_done(fp, client):
    # LM Studio: the arguments only in function_call_arguments.done, or only in output_item.done.
    fp.add_turn(created(),
                event("response.output_item.added", output_index=0, item=function_item("fc_1", "call_1", "a")),
                event("response.function_call_arguments.done", item_id="fc_1", output_index=0, arguments='{"x": 1}'),
                event("response.output_item.done", output_index=0,
                      item=function_item("fc_1", "call_1", "a", '{"x": 1}')),
                event("response.output_item.added", output_index=1, item=function_item("fc_2", "call_2", "b")),
                event("response.output_item.done", output_index=1,
                      item=function_item("fc_2", "call_2", "b", '{"y": 2}')),
                event("response.output_item.done", output_index=2, item=function_item("fc_3", "call_3", "c", '{}')),
                completed(), auto_finish=False)
    chunks, calls = with_calls(client)
    assert calls == [ToolCall("call_1", "a", '{"x": 1}'), ToolCall("call_2", "b", '{"y": 2}'),
                     ToolCall("call_3", "c", "{}")]
    assert chunks[-1].finish_reason == "tool_calls"


def test_streams_without_event_lines_or_sequence_numbers_read_the_same(fp, client):
    # OpenRouter and older OpenAI streams: only data lines, the type in the JSON.
    fp.add_turn(created(named=False),
                event("response.output_text.delta", named=False, item_id="msg_1", output_index=0, content_index=0,
                      delta="Hi"),
                event("response.reasoning_text.delta", named=False, item_id="rs_1", output_index=1, content_index=0,
                      delta="hm"),
                completed(named=False), auto_finish=False)
    chunks = collect(client)
    assert (text_of(chunks), "".join(c.reasoning or "" for c in chunks)) == ("Hi", "hm")
    assert (chunks[-1].finish_reason, chunks[-1].usage, chunks[-1].model) == ("stop", Usage(3, 2, 5), "gpt-x")


def test_a_refusal_is_its_own_field_not_the_answer(fp, client):
    fp.add_turn(s.text("Sure, "), s.Step("delta", {"refusal": "I can't help "}),
                s.Step("delta", {"refusal": "with that."}))
    chunks = collect(client)
    assert text_of(chunks) == "Sure, "
    assert "".join(c.refusal or "" for c in chunks) == "I can't help with that."
    assert all(c.is_meaningful for c in chunks if c.refusal)
    fp.add_turn(s.text("Sure, "), s.Step("delta", {"refusal": "I can't help "}),
                s.Step("delta", {"refusal": "with that."}))
    response = streamed(client, MESSAGES, OPTIONS)[1]
    assert (response.content, response.refusal) == ("Sure, ", "I can't help with that.")


def test_a_buffered_answer_keeps_its_refusal_and_reasoning(fp, client):
    output = [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "policy"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}]
    body = {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-x", "output": output,
            "error": None, "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}
    fp.add_turn(s.raw(json.dumps(body)))
    response = client.complete(MESSAGES, options=OPTIONS)
    assert (response.content, response.refusal, response.reasoning) == ("", "No.", "policy")


def test_usage_keeps_cached_and_reasoning_tokens(fp, client):
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 30,
             "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 130}
    fp.add_turn(created(), completed(usage=usage), auto_finish=False)
    assert collect(client)[-1].usage == Usage(100, 30, 130, cached_tokens=64, reasoning_tokens=20)


@pytest.mark.parametrize("reason, expected", [("length", "length"), ("content_filter", "content_filter")])
def test_an_incomplete_response_ends_with_its_reason_and_usage(fp, client, reason, expected):
    fp.add_turn(s.text("cut"), s.finish(reason), s.usage(prompt=4, completion=9))
    chunks = collect(client)
    assert text_of(chunks) == "cut"
    assert (chunks[-1].finish_reason, chunks[-1].usage) == (expected, Usage(4, 9, 13))


@pytest.mark.parametrize("reason, expected", [("max_output_tokens", "length"), ("content_filter", "content_filter"),
                                              (None, "length")])
def test_incomplete_details_reason_is_the_finish_reason(fp, client, reason, expected):
    ending = completed(status="incomplete", incomplete_details={"reason": reason}) if reason else event(
        "response.incomplete", response={"usage": {"input_tokens": 3, "output_tokens": 2}})  # no status, no reason
    fp.add_turn(created(), ending, auto_finish=False)
    chunks = collect(client)
    assert (chunks[-1].finish_reason, chunks[-1].usage) == (expected, Usage(3, 2, 5))


def test_structure_lifecycle_and_keep_alives_are_not_meaningful_hosted_tool_progress_is(fp, client):
    fp.add_turn(created(), s.comment(), s.empty_delta(),
                event("response.in_progress", response={"id": "resp_1", "status": "in_progress"}),
                event("response.output_item.added", output_index=0, item={"type": "web_search_call", "id": "ws_1"}),
                event("response.web_search_call.searching", item_id="ws_1", output_index=0),
                event("response.code_interpreter_call_code.delta", item_id="ci_1", output_index=1, delta="x"),
                event("response.file_search_call.in_progress", item_id="fs_1", output_index=2),
                event("response.content_part.added", item_id="msg_1", output_index=3, content_index=0,
                      part={"type": "output_text", "text": ""}),
                event("response.output_text.done", item_id="msg_1", output_index=3, content_index=0, text=""),
                event("response.some_future_event", whatever=1),
                completed(), auto_finish=False)
    chunks = collect(client)
    meaningful = [c for c in chunks if c.is_meaningful]
    assert len(meaningful) == 5 and meaningful[-1].is_completed  # four progress events, then the end
    assert all(not c.content and not c.tool_calls for c in meaningful)


def test_a_server_that_streams_nothing_gives_the_answer_in_response_completed(fp, client):
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "whole"}]},
              function_item("fc_1", "call_1", "f", '{"k": 1}')]
    fp.add_turn(created(), completed(output=output), auto_finish=False)
    chunks, calls = with_calls(client)
    assert text_of(chunks) == "whole" and calls == [ToolCall("call_1", "f", '{"k": 1}')]
    assert chunks[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_body_ending_before_response_completed_is_a_broken_stream(framing):
    with FakeProvider(framing=framing, wire="responses") as fp, OpenAIResponsesClient(fp.base_url) as client:
        fp.add_turn(s.text("partial"), s.end())
        with pytest.raises(LlmStreamError, match=r"without response\.completed or response\.incomplete"):
            collect(client)


def test_the_connection_is_reused_after_response_completed(fp, client):
    for _ in range(3):
        fp.add_turn(s.text("x"))
        assert text_of(collect(client)) == "x"
    assert fp.connection_count == 1


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("error_event, says, status, verdict", [
    ({"type": "error", "code": "rate_limit_exceeded", "message": "Rate limit reached for gpt-x", "param": None},
     "Rate limit reached", 429, ErrorClass.TRANSIENT_RETRY),
    ({"type": "error", "error": {"type": "server_error", "code": "server_error", "message": "The server had an error"}},
     "The server had an error", None, ErrorClass.TRANSIENT_ADVANCE),
    ({"type": "error", "error": {"type": "invalid_request_error", "code": "context_length_exceeded",
                                 "message": "Your input exceeds the context window"}},
     "exceeds the context window", 400, ErrorClass.FATAL),
    # Looks like a rate limit ("exceeded your current quota"), but waiting does not help: not transient.
    ({"type": "error", "code": "insufficient_quota", "param": None,
      "message": "You exceeded your current quota, please check your plan and billing details"},
     "exceeded your current quota", 402, ErrorClass.FATAL),
    ({"type": "error", "error": {"type": "tokens", "code": "rate_limit_exceeded", "message": "Too many tokens"}},
     "Too many tokens", 429, ErrorClass.TRANSIENT_RETRY),
], ids=["flat-rate-limit", "nested-server-error", "nested-context-length", "flat-insufficient-quota",
        "nested-rate-limit"])
def test_error_events_flat_and_nested_then_response_failed(fp, client, error_event, says, status, verdict):
    failed = event("response.failed", response={"id": "resp_1", "status": "failed",
                                                "error": {"code": "server_error", "message": "the failed event"}})
    error = failing(client, fp, created(), event("response.output_text.delta", item_id="m", output_index=0,
                                                 content_index=0, delta="partial"),
                    event("error", **error_event), failed)
    assert isinstance(error, LlmStreamError if status is None else LlmHttpError), error
    assert says in str(error) and "the failed event" not in str(error) and "after 2 events" in str(error)
    assert getattr(error, "status_code", None) == status and classify(error) is verdict


def test_response_failed_alone_is_an_error_with_its_message(fp, client):
    failed = event("response.failed", response={"id": "resp_1", "status": "failed",
                                                "error": {"code": "server_error", "message": "boom inside"}})
    error = failing(client, fp, created(), failed)
    assert isinstance(error, LlmStreamError) and "boom inside" in str(error)
    assert classify(error) is ErrorClass.TRANSIENT_ADVANCE


def test_an_error_step_is_an_error_event_then_response_failed_on_the_wire(fp, client):
    error = failing(client, fp, s.text("partial"), s.error_frame("Overloaded", type="server_error"))
    assert isinstance(error, LlmStreamError) and "Overloaded" in str(error)
    assert classify(error) is ErrorClass.TRANSIENT_ADVANCE


def test_a_plain_text_error_event_keeps_the_text(fp, client):
    error = failing(client, fp, created(), s.raw("event: error\ndata: upstream exploded\n\n"))
    assert isinstance(error, LlmStreamError) and "upstream exploded" in str(error)


@pytest.mark.parametrize("data", ["[1, 2]", "not json"])
def test_events_that_are_not_json_objects_are_protocol_errors(fp, client, data):
    error = failing(client, fp, created(), s.raw(f"data: {data}\n\n"))
    assert isinstance(error, LlmProtocolError) and "Responses stream format" in str(error)


@pytest.mark.parametrize("status, verdict", [(400, ErrorClass.FATAL), (401, ErrorClass.FATAL),
                                             (429, ErrorClass.TRANSIENT_RETRY), (503, ErrorClass.TRANSIENT_ADVANCE)])
def test_http_errors_are_the_openai_clients_errors(fp, client, status, verdict):
    error = failing(client, fp, s.http_error(status, {"error": {"message": f"said {status}", "type": "x"}},
                                             headers={"retry-after": "2"}))
    assert isinstance(error, LlmHttpError) and error.status_code == status and f"said {status}" in str(error)
    assert classify(error) is verdict and error.retry_after == 2.0
    assert "stream_options" not in str(error)


def test_a_200_that_is_not_an_event_stream_is_a_protocol_error(fp, client):
    error = failing(client, fp, s.http_error(200, "<html>login</html>", content_type="text/html"))
    assert isinstance(error, LlmProtocolError) and "serves the Responses API" in str(error)


def test_the_api_key_is_never_shown(fp):
    with OpenAIResponsesClient(fp.base_url, api_key=KEY) as client:
        assert KEY not in repr(client)
        error = failing(client, fp, s.http_error(401, {"error": {"message": f"bad key {KEY}"}}))
    assert KEY not in str(error) and "***" in str(error)
    assert fp.requests[0].headers["Authorization"] == f"Bearer {KEY}"


# -- what is sent -------------------------------------------------------------------------


def test_a_conversation_with_tools_becomes_instructions_and_input_items(fp, client):
    fp.add_turn(s.text("ok"))
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "weather?"},
        Message("assistant", "Checking.", tool_calls=(ToolCall("call_1", "lookup", '{"city": "Oslo"}'),
                                                      ToolCall("call_2", "clock", ""))),
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "tool", "content": "orphan"},
    ]
    spec = ToolSpec("lookup", "Look up weather.", {"type": "object", "properties": {"city": {"type": "string"}}})
    collect(client, conversation, tools=[spec],
            options=CompletionOptions(model="gpt-test", temperature=0.2, max_tokens=50))
    request = fp.requests[0]
    assert request.path == "/v1/responses"
    assert request.json == {
        "model": "gpt-test", "instructions": "Be brief.\n\nUse tools.", "stream": True, "temperature": 0.2,
        "max_output_tokens": 50,
        "input": [
            {"type": "message", "role": "user", "content": "weather?"},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call", "call_id": "call_2", "name": "clock", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
            {"type": "message", "role": "user", "content": "Tool result: orphan"}],
        "tools": [{"type": "function", "name": "lookup", "description": "Look up weather.", "strict": False,
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}
    assert request.headers["Accept"] == "text/event-stream"


def test_chat_options_are_translated_and_those_without_an_equivalent_refused(fp, client):
    fp.add_turn(s.text("ok"))
    extra = {"max_completion_tokens": 9, "reasoning_effort": "low", "stream_options": {"include_usage": True},
             "tool_choice": {"type": "function", "function": {"name": "lookup"}}, "store": False, "top_p": 0.5}
    collect(client, options=CompletionOptions(model="m", extra=extra))
    sent = fp.requests[0].json
    assert {k: sent[k] for k in ("max_output_tokens", "reasoning", "tool_choice", "store", "top_p")} == {
        "max_output_tokens": 9, "reasoning": {"effort": "low"}, "tool_choice": {"type": "function", "name": "lookup"},
        "store": False, "top_p": 0.5}
    assert "stream_options" not in sent and "max_tokens" not in sent
    with pytest.raises(ConfigError, match=r"CompletionOptions\.stop cannot be sent to the Responses API: .*no stop"):
        client.stream(MESSAGES, options=CompletionOptions(model="m", stop=["\n"]))
    for name in ("stop", "n", "response_format"):
        with pytest.raises(ConfigError, match=f"the option '{name}' cannot be sent to the Responses API"):
            client.complete(MESSAGES, options=CompletionOptions(model="m", extra={name: 1}))
    with pytest.raises(ConfigError, match="message role 'robot' has no Responses form"):
        client.stream([{"role": "robot", "content": "x"}])
    assert fp.request_count == 1  # nothing refused was sent


def test_the_openai_clients_options_apply(fp, monkeypatch):
    fp.add_turn(s.text("ok"))
    with OpenAIResponsesClient(fp.base_url + "?api-version=2025-04-01-preview", api_key=KEY,
                               api_key_header="api-key", headers={"X-Trace": "t1"}) as client:
        collect(client)
    request = fp.requests[0]
    assert request.path == "/v1/responses?api-version=2025-04-01-preview"
    assert (request.headers["api-key"], request.headers["X-Trace"]) == (KEY, "t1")
    assert "Authorization" not in request.headers
    monkeypatch.setenv("OPENAI_BASE_URL", fp.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.delenv("STREAMENGINE_BASE_URL", raising=False)
    monkeypatch.delenv("STREAMENGINE_API_KEY", raising=False)
    fp.add_turn(s.text("ok"))
    with OpenAIResponsesClient.from_env() as client:
        assert isinstance(client, OpenAIResponsesClient)
        collect(client)
    assert fp.requests[1].headers["Authorization"] == "Bearer sk-env"
    fp.add_turn(s.text("ok"))
    extras = {"extra_body": {"max_tokens": 7, "top_k": 3}, "extra_headers": {"X-Run": "r1"},
              "extra_query": {"trace": "1"}}
    with OpenAIResponsesClient(timeout=3, max_retries=1) as client:  # base_url and key as the SDK finds them
        collect(client, options=CompletionOptions(model="m", extra=extras))
    request = fp.requests[2]
    assert request.path == "/v1/responses?trace=1" and request.headers["X-Run"] == "r1"
    assert (request.json["max_output_tokens"], request.json["top_k"]) == (7, 3)
    assert request.headers["Authorization"] == "Bearer sk-env" and client.connect_timeout == 3


def test_complete_returns_the_whole_answer(fp, client):
    fp.add_turn(s.reasoning("hm"), s.text("Hello"), s.tool_call(0, id="call_9", name="f", arguments='{"a": 1}'),
                s.usage(prompt=5, completion=2))
    response = client.complete(MESSAGES, options=OPTIONS)
    assert (response.content, response.tool_calls) == ("Hello", (ToolCall("call_9", "f", '{"a": 1}'),))
    assert (response.usage, response.finish_reason, response.model) == (Usage(5, 2, 7), "tool_calls", "gpt-test")
    assert "stream" not in fp.requests[0].json
    fp.add_turn(s.text("cut"), s.finish("length"))
    assert client.complete(MESSAGES, options=OPTIONS).finish_reason == "length"


def test_complete_errors(fp, client):
    fp.add_turn(s.error_frame("quota gone", type="insufficient_quota"))
    with pytest.raises(LlmHttpError, match="quota gone") as info:
        client.complete(MESSAGES, options=OPTIONS)
    assert info.value.status_code == 402 and classify(info.value) is ErrorClass.FATAL
    fp.add_turn(s.raw('{"object": "list"}'))
    with pytest.raises(LlmProtocolError, match="'output' list"):
        client.complete(MESSAGES, options=OPTIONS)


def test_embeddings_are_the_openai_clients(fp, client):
    assert len(client.embed(["a b", "c"], "emb")) == 2 and fp.requests[0].path == "/v1/embeddings"


# -- cancel -------------------------------------------------------------------------------


def test_cancel_mid_stream_unblocks_and_releases_the_connection(fp, client):
    fp.add_turn(s.text("first"), s.stall())
    cancel = threading.Event()
    first = threading.Event()

    def read() -> None:
        for chunk in client.stream(MESSAGES, options=OPTIONS, cancel=cancel):
            if chunk.content:
                first.set()

    error, _ = cancel_while_blocked(fp, cancel, read, ready=first)
    assert isinstance(error, LlmCancelledError)
    assert fp.wait_for_client_disconnects(1, 5)
    assert busy_connection_threads(fp) == []


def test_the_aggregate_of_a_stream_is_the_buffered_answer(fp, client):
    script = [s.text("a"), s.tool_call(0, id="call_1", name="f", arguments="{}"), s.usage(prompt=2, completion=3)]
    fp.add_turn(*script)
    fp.add_turn(*script)
    aggregated, whole = streamed(client, MESSAGES, OPTIONS)[1], client.complete(MESSAGES, options=OPTIONS)
    assert (aggregated.id, whole.id) == ("resp_fake_1", "resp_fake_2")  # two answers, each with its own id
    assert dataclasses.replace(aggregated, id=None) == dataclasses.replace(whole, id=None)
