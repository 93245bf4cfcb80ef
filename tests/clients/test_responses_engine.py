"""The engine, unchanged, on the Responses wire: tools both ways, failover across wires, the CLI, the WSGI app.

``StreamingEngine(OpenAIResponsesClient(fp.base_url), tools, EngineConfig(...))``
against ``FakeProvider(wire="responses")``: a native call is dispatched at its
``output_item.done`` (before ``response.completed``), the next round re-sends
the ``function_call`` items before their ``function_call_output`` items, inline
tools work as on any wire; then one RoutedClient over a Responses and a Chat
Completions provider, ``--provider openai-responses`` and the page's SSE
endpoint served by waitress.
"""
from __future__ import annotations

import io
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from cli_support import CLI_ENV, main
from readme_recipes import recipes, root_of, run_recipe
from wsgi_support import serving, sse, tokens_of

from streamengine import (
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    RefusalEvent,
    RoutedClient,
    StreamingEngine,
    TokenEvent,
    ToolStartEvent,
)
from streamengine.testing import FakeProvider, Stamp
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def make_engine(client, tools=(), **config):
    config.setdefault("models", ["gpt-main"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("completion_timeout", 10.0)
    return StreamingEngine(client, tools, EngineConfig(**config))


def run(engine, prompt="question", **kw):
    events = list(engine.run([{"role": "user", "content": prompt}], **kw))
    assert isinstance(events[-1], DoneEvent), [e.name for e in events]
    return events, events[-1].result


def test_native_calls_start_at_their_item_done_and_the_next_round_resends_them_before_their_outputs():
    first_started, second_started, released = threading.Event(), threading.Event(), Stamp()
    second_at = []

    @tool
    def first(q: str) -> str:
        """First."""
        first_started.set()
        return "one"

    @tool
    def second(q: str) -> str:
        """Second."""
        second_at.append(time.monotonic())
        second_started.set()
        return "two"

    with FakeProvider(wire="responses") as fp:
        # The stream goes on only once both tools run: the last call (nothing follows it)
        # must start at its output_item.done, which the text brings, not at response.completed.
        fp.add_turn(s.text("Let me check."),
                    s.tool_call(0, id="call_1", name="first", arguments='{"q":'),
                    s.tool_call(0, arguments=' "a"}'),
                    s.tool_call(1, id="call_2", name="second", arguments='{"q": "b"}'),
                    s.text(" Done asking."), s.wait(first_started, timeout=5),
                    s.wait(second_started, timeout=5), s.signal(released),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("both done"))
        with make_engine(OpenAIResponsesClient(fp.base_url), [first, second], tool_mode="native") as engine:
            events, result = run(engine)
    assert released.at is not None and second_at[0] < released.at
    assert result.answer == "both done"
    assert [r.text for r in result.tool_results] == ["one", "two"]
    assert sorted(e.call.id for e in events if isinstance(e, ToolStartEvent)) == ["call_1", "call_2"]
    assert [(t["type"], t["name"], t["strict"]) for t in fp.requests[0].json["tools"]] == [
        ("function", "first", False), ("function", "second", False)]
    items = fp.requests[1].json["input"]
    assert items[1:] == [
        {"type": "message", "role": "assistant", "content": "Let me check. Done asking."},
        {"type": "function_call", "call_id": "call_1", "name": "first", "arguments": '{"q": "a"}'},
        {"type": "function_call", "call_id": "call_2", "name": "second", "arguments": '{"q": "b"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": "two"}]


def test_an_inline_tool_runs_while_the_model_talks():
    started = threading.Event()

    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        started.set()
        return f"sunny in {city}"

    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.text("Checking. "), s.text('<tool name="lookup">{"city": "Oslo"}</tool>'),
                    s.wait(started, timeout=5), s.text(" still talking"))
        fp.add_turn(s.text("It is sunny in Oslo."))
        with make_engine(OpenAIResponsesClient(fp.base_url), [lookup], tool_mode="inline") as engine:
            events, result = run(engine)
    assert started.is_set() and result.answer == "It is sunny in Oslo."
    later = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent) and "still talking" in e.text)
    assert [e.name for e in events].index("tool_start") < later
    first, second = (r.json for r in fp.requests)
    assert "<tool name=" in first["instructions"] and "tools" not in first
    assert "sunny in Oslo" in second["input"][-1]["content"]


def test_hosted_tool_progress_keeps_a_slow_answer_alive_past_the_idle_timeout():
    progress = s.raw('event: response.web_search_call.searching\n'
                     'data: {"type": "response.web_search_call.searching", "item_id": "ws_1", "output_index": 0}\n\n')
    with FakeProvider(wire="responses") as fp:
        # 10 x 0.1 s of searching: longer than the 0.6 s idle timeout, never silent for that long.
        fp.add_turn(s.empty_delta(), *[step for _ in range(10) for step in (s.delay(0.1), progress)], s.text("found"))
        fp.add_turn(s.empty_delta(), s.forever(s.comment(), every=0.05))
        with make_engine(OpenAIResponsesClient(fp.base_url), idle_timeout=0.6) as engine:
            _, result = run(engine)
            assert result.answer == "found"
            _, timed_out = run(engine)
    assert "LlmTimeoutError: LLM streaming: no response received within 0.6s" in timed_out.answer


def test_cancel_mid_stream_stops_the_tool_and_closes_the_connection():
    tool_running, saw_cancel = threading.Event(), threading.Event()

    @tool
    def slow(ctx: ToolContext) -> str:
        """Slow."""
        tool_running.set()
        if ctx.cancel_event.wait(10):
            saw_cancel.set()
        return "x"

    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.tool_call(0, id="call_s", name="slow", arguments="{}"), s.text("waiting"), s.stall())
        with make_engine(OpenAIResponsesClient(fp.base_url), [slow], tool_mode="native") as engine:
            cancel = threading.Event()
            events = []
            for event in engine.run([{"role": "user", "content": "q"}], cancel=cancel):
                events.append(event)
                if isinstance(event, ToolStartEvent):
                    assert tool_running.wait(5)
                    cancel.set()
            assert saw_cancel.wait(5)
            assert fp.wait_for_client_disconnects(1, 5)
    assert events[-1].result.telemetry.stop_reason == "cancelled"


def test_a_refusal_reaches_the_caller_as_a_refusal_event_and_result_field():
    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.Step("delta", {"refusal": "I can't help with that."}))
        with make_engine(OpenAIResponsesClient(fp.base_url)) as engine:
            events, result = run(engine)
    assert [e.text for e in events if isinstance(e, RefusalEvent)] == ["I can't help with that."]
    assert (result.answer, result.refusal) == ("", "I can't help with that.")


# --- failover, also across wires ------------------------------------------------------------------------

def test_a_failed_model_fails_over_on_the_same_wire():
    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.error_frame("The server had an error", type="server_error"))
        fp.add_turn(s.text("from the backup"))
        with make_engine(OpenAIResponsesClient(fp.base_url), models=["gpt-main", "gpt-backup"]) as engine:
            _, result = run(engine)
    assert (result.answer, result.telemetry.model_used, result.telemetry.failovers) == ("from the backup",
                                                                                        "gpt-backup", 1)
    assert [r.json["model"] for r in fp.requests] == ["gpt-main", "gpt-backup"]


@pytest.mark.parametrize("failure", [
    s.http_error(503, {"error": {"message": "overloaded", "type": "server_error"}}),
    s.error_frame("The server had an error", type="server_error"),
    s.drop()], ids=["http-503", "in-band", "dropped"])
def test_failover_from_the_responses_api_to_chat_completions_through_a_routed_client(failure):
    with FakeProvider(wire="responses") as responses, FakeProvider() as chat:
        responses.add_turn(failure)
        chat.add_turn(s.text("answer from chat completions"))
        client = RoutedClient({"responses": OpenAIResponsesClient(responses.base_url, api_key="sk-r"),
                               "openai": OpenAICompatibleClient(chat.base_url, api_key="sk-c")})
        with make_engine(client, models=["responses:gpt-5-mini", "openai:gpt-4o-mini"]) as engine:
            _, result = run(engine)
    assert result.answer == "answer from chat completions"
    assert (result.telemetry.model_used, result.telemetry.failovers) == ("openai:gpt-4o-mini", 1)
    assert [(r.path, r.json["model"]) for r in responses.requests] == [("/v1/responses", "gpt-5-mini")]
    assert [(r.path, r.json["model"]) for r in chat.requests] == [("/v1/chat/completions", "gpt-4o-mini")]


def test_failover_from_chat_completions_to_the_responses_api():
    with FakeProvider(wire="responses") as responses, FakeProvider() as chat:
        chat.add_turn(s.http_error(404, {"error": {"message": "model not found"}}))
        responses.add_turn(s.text("answer from responses"), s.usage(prompt=5, completion=3))
        client = RoutedClient({"responses": OpenAIResponsesClient(responses.base_url),
                               "openai": OpenAICompatibleClient(chat.base_url)}, default="openai")
        with make_engine(client, models=["llama3:8b", "responses:gpt-5"]) as engine:
            _, result = run(engine)
    assert result.answer == "answer from responses"
    assert [r.json["model"] for r in chat.requests] == ["llama3:8b"]
    assert [r.json["model"] for r in responses.requests] == ["gpt-5"]


# --- the CLI and the web app ---------------------------------------------------------------------------

@pytest.fixture
def responses_fp(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with FakeProvider(wire="responses") as provider:
        provider.add_turn(s.text("Hello there."))
        yield provider


@pytest.mark.parametrize("title, model, key", [
    ("OpenAI", "gpt-5-mini", "Bearer sk-..."), ("Ollama", "gpt-oss:20b", None),
    ("llama.cpp", "local", "Bearer my-llama-key"), ("vLLM", "Qwen/Qwen3-8B", "Bearer my-vllm-key")])
def test_the_readme_recipes_for_the_responses_api(responses_fp, monkeypatch, capsys, title, model, key):
    block = next(b for b in recipes(title) if "openai-responses" in b)
    rc, out, err = run_recipe(block, root_of(responses_fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    (request,) = responses_fp.requests
    assert request.path == "/v1/responses" and request.json["model"] == model
    assert request.headers.get("Authorization") == key
    assert "stream_options" not in request.json


def test_the_cli_refuses_what_the_responses_api_cannot_take(responses_fp, monkeypatch, capsys):
    for name in CLI_ENV:
        monkeypatch.delenv(name, raising=False)
    base = ["chat", "hi", "-m", "m", "--provider", "openai-responses", "--base-url", responses_fp.base_url]
    assert main(base + ["--no-stream-options"]) == 2
    assert "--no-stream-options only applies to --provider openai" in capsys.readouterr().err
    assert main(base + ["-o", "stop=[\"x\"]"]) == 2
    assert "stop cannot be sent to the Responses API: the Responses API has no stop sequences" in \
        capsys.readouterr().err
    assert main(base + ["-o", "n=2"]) == 2
    assert "the option 'n' cannot be sent to the Responses API" in capsys.readouterr().err
    assert responses_fp.request_count == 0


def test_the_web_app_streams_a_responses_run_over_waitress():
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.text("Checking. "), s.tool_call(0, id="call_w", name="lookup", arguments='{"city": "Oslo"}'))
        fp.add_turn(s.text("It is sunny."))
        with make_engine(OpenAIResponsesClient(fp.base_url), [lookup], tool_mode="native") as engine, \
                serving(make_wsgi_app(engine)) as url, \
                requests.get(url + "/v1/chat/stream", params={"q": "weather?"},
                             headers={"Accept": "text/event-stream"}, stream=True, timeout=10) as resp:
            events = sse(resp)
    kinds = [kind for kind, _ in events]
    assert kinds.index("tool_start") < kinds.index("tool_result") < kinds.index("done")
    assert "".join(tokens_of(events)) == "Checking. It is sunny."
    done = json.loads(next(data for kind, data in events if kind == "done"))
    assert done["answer"] == "It is sunny."
    assert fp.requests[1].json["input"][-1] == {"type": "function_call_output", "call_id": "call_w",
                                                "output": "sunny in Oslo"}


def test_the_docs_testing_example_runs_as_written():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "responses.md").read_text(encoding="utf-8")
    example = doc.split("## Testing without the network", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(example, "docs/responses.md", "exec"), namespace)
    assert namespace["answer"].content == "Hello"


def test_the_docs_reasoning_summary_example_shows_the_summary_then_the_answer(monkeypatch, capsys):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "responses.md").read_text(encoding="utf-8")
    example = doc.split("## Reasoning summaries", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.reasoning("7 times 11 times 13. "), s.text("No: 1001 = 7 \u00d7 11 \u00d7 13."))
        for name in ("STREAMENGINE_BASE_URL", "STREAMENGINE_API_KEY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OPENAI_BASE_URL", fp.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-docs")
        exec(compile(example, "docs/responses.md", "exec"), {})
        sent = fp.requests[0].json
    assert sent["reasoning"] == {"effort": "low", "summary": "auto"}
    assert capsys.readouterr().out == "7 times 11 times 13. No: 1001 = 7 \u00d7 11 \u00d7 13."


def test_the_readme_recipe_for_a_reasoning_summary(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    block = next(b for b in recipes("OpenAI") if '"summary": "auto"' in b)
    with FakeProvider(wire="responses") as fp:
        fp.add_turn(s.reasoning("7 times 11 times 13."), s.text("No."))
        rc, out, err = run_recipe(block, root_of(fp), monkeypatch, capsys)
        (request,) = fp.requests
    assert (rc, out) == (0, "No.\n"), err
    assert request.path == "/v1/responses" and request.json["reasoning"] == {"effort": "low", "summary": "auto"}
    assert "7 times 11" not in err  # stderr is a pipe here: the summary is shown only at a terminal
