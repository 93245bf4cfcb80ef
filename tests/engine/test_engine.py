"""The engine end to end through FakeProvider on loopback: tools start while the model talks."""
from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import wait_for

from streamengine import (
    ConfigError,
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    OpenAICompatibleClient,
    StreamingEngine,
    TokenEvent,
    ToolResultEvent,
    ToolStartEvent,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def make_engine(fp, tools=(), approve=None, **config):
    config.setdefault("models", ["m1"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("completion_timeout", 10.0)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config), approve=approve)


def approve_all(call):
    """Lets every side-effect call run: these tests are about when such calls run, not whether."""
    return True


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


def collect(engine, prompt="question", **kw):
    return list(engine.run([{"role": "user", "content": prompt}], **kw))


def names(events):
    return [e.name for e in events]


def done(events):
    assert isinstance(events[-1], DoneEvent), names(events)
    return events[-1].result


class Recorder:
    """Tools that record when they ran, for ordering assertions without clocks."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def record(self, name, **args):
        with self.lock:
            self.calls.append((name, args, time.monotonic()))


# --- the heart: tools start before the stream ends ---------------------------------------------

def test_inline_tool_starts_before_stream_ends_and_result_feeds_next_round():
    started = threading.Event()

    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        started.set()
        return f"sunny in {city}"

    with FakeProvider() as fp:
        fp.add_turn(s.text("Checking. "), s.text(block("lookup", {"city": "Oslo"})),
                    s.wait(started, timeout=5), s.text(" still talking"))
        fp.add_turn(s.text("It is sunny in Oslo."))
        with make_engine(fp, [lookup]) as engine:
            events = collect(engine)
    result = done(events)
    # The server only sent the rest of round 1 after the tool had started.
    assert started.is_set()
    order = names(events)
    start_at = order.index("tool_start")
    later_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent) and "still talking" in e.text)
    assert start_at < later_token
    assert result.answer == "It is sunny in Oslo."
    assert result.rounds[0].startswith("Checking. <tool name=\"lookup\">")
    assert result.telemetry.tools_started == 1 and result.telemetry.tools_ok == 1
    assert result.tool_results[0].text == "sunny in Oslo"
    second = fp.requests[1].json["messages"]
    assert second[-2]["role"] == "assistant" and block("lookup", {"city": "Oslo"}) in second[-2]["content"]
    assert second[-1]["role"] == "user" and "sunny in Oslo" in second[-1]["content"]
    assert names(events).count("round") == 2 and names(events)[-1] == "done"


def test_system_message_teaches_the_syntax_only_when_tools_exist():
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    with FakeProvider() as fp:
        fp.add_turn(s.text("hi"))
        fp.add_turn(s.text("hi"))
        with make_engine(fp, [ping]) as engine:
            collect(engine)
        with make_engine(fp, []) as engine:
            collect(engine)
    with_tools, without = fp.requests[0].json["messages"], fp.requests[1].json["messages"]
    assert with_tools[0]["role"] == "system"
    assert '<tool name="' in with_tools[0]["content"] and "ping" in with_tools[0]["content"]
    assert all(m["role"] != "system" for m in without)
    assert "tools" in fp.requests[0].json and "tools" not in fp.requests[1].json


@pytest.mark.parametrize("pieces", [1, 2, 3, 7])
def test_block_split_anywhere_gives_the_same_run(pieces):
    text = "Before " + block("echo", {"word": "zebra"}) + " after"
    hits = []

    @tool
    def echo(word: str) -> str:
        """Echo a word."""
        hits.append(word)
        return word

    with FakeProvider() as fp, make_engine(fp, [echo]) as engine:
        for offset in range(1, len(text)):
            step = max(1, offset // pieces) if pieces > 1 else offset
            cuts = sorted({0, offset, *range(0, len(text), step), len(text)}) if pieces > 1 else [0, offset, len(text)]
            parts = [text[a:b] for a, b in zip(cuts, cuts[1:]) if text[a:b]]
            fp.add_turn(*[s.text(p) for p in parts])
            fp.add_turn(s.text("final"))
            result = engine.complete([{"role": "user", "content": "q"}])
            assert result.rounds[0] == text
            assert result.answer == "final"
    assert hits == ["zebra"] * (len(text) - 1)


# --- dispatch gates ----------------------------------------------------------------------------

def test_dedup_caps_and_allowlist_are_reported_to_the_model():
    rec = Recorder()

    @tool
    def a(n: int) -> str:
        """Tool a."""
        rec.record("a", n=n)
        return f"a{n}"

    @tool
    def secret() -> str:
        """Not allowed."""
        rec.record("secret")
        return "leak"

    round1 = "".join([block("a", {"n": 1}), block("a", {"n": 1}), block("nope"), block("secret"),
                      block("a", {"n": 2}), block("a", {"n": 3}), block("a", {"n": 4})])
    with FakeProvider() as fp:
        fp.add_turn(s.text(round1))
        fp.add_turn(s.text("ok"))
        with make_engine(fp, [a, secret], allowed_tools=["a"], max_tools_per_round=3) as engine:
            events = collect(engine)
    result = done(events)
    t = result.telemetry
    assert sorted(c[1]["n"] for c in rec.calls if c[0] == "a") == [1, 2, 3]
    assert not [c for c in rec.calls if c[0] == "secret"]
    assert (t.tools_started, t.dedup_skipped, t.disallowed, t.cap_skipped) == (3, 1, 2, 1)
    continuation = fp.requests[1].json["messages"][-1]["content"]
    assert "duplicate" in continuation and "not available" in continuation and "limit" in continuation
    assert names(events).count("tool_start") == 3
    assert names(events).count("tool_result") == 7


def test_total_cap_spans_rounds_and_dedup_is_per_request():
    rec = Recorder()

    @tool
    def t(n: int) -> str:
        """Tool t."""
        rec.record("t", n=n)
        return str(n)

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("t", {"n": 1}) + block("t", {"n": 2}) + block("t", {"n": 3})))
        fp.add_turn(s.text(block("t", {"n": 1}) + block("t", {"n": 4}) + block("t", {"n": 5}) + block("t", {"n": 6})))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [t], max_tools_total=5) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert sorted(c[1]["n"] for c in rec.calls) == [1, 2, 3, 4, 5]
    assert result.telemetry.dedup_skipped == 1 and result.telemetry.cap_skipped == 1
    assert result.answer == "done"


def test_invalid_arguments_never_run_the_tool_and_are_reported():
    ran = []

    @tool
    def need(x: int) -> str:
        """Needs x."""
        ran.append(x)
        return "ok"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("need", {"y": 1}) + '<tool name="need">{not json}</tool>'))
        fp.add_turn(s.text("explained"))
        with make_engine(fp, [need]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert ran == []
    assert result.telemetry.parse_errors == 1
    assert result.telemetry.tools_failed == 1  # the schema failure; the unreadable block is a parse error
    told = fp.requests[1].json["messages"][-1]["content"]
    assert "y" in told and "not valid JSON" in told and "was not run" in told


# --- deadlines and side effects --------------------------------------------------------------

def test_hung_tool_times_out_with_its_cancel_flag_set():
    saw_cancel = threading.Event()
    release = threading.Event()

    @tool(timeout=0.3)
    def hang(ctx: ToolContext) -> str:
        """Never answers in time."""
        if ctx.cancel_event.wait(10):
            saw_cancel.set()
        release.wait(10)
        return "too late"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("hang")))
        fp.add_turn(s.text("sorry, the tool timed out"))
        with make_engine(fp, [hang]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
            assert wait_for(saw_cancel.is_set)
            release.set()
    assert result.tool_results[0].error == "tool 'hang' timed out after 0.3s"
    assert result.telemetry.tools_timed_out == 1
    assert "timed out after 0.3s" in fp.requests[1].json["messages"][-1]["content"]


def test_side_effect_tool_waits_for_a_normal_end_of_stream():
    stream_done = threading.Event()
    seen_at_start = []

    @tool(side_effects=True)
    def send_mail(to: str) -> str:
        """Sends mail."""
        seen_at_start.append(stream_done.is_set())
        return "sent"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send_mail", {"to": "x"})), s.text(" more"), s.signal(stream_done))
        fp.add_turn(s.text("mailed"))
        with make_engine(fp, [send_mail], approve=approve_all) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert seen_at_start == [True]
    assert result.tool_results[0].ok and result.answer == "mailed"


@pytest.mark.parametrize("ending", ["length", "content_filter", "drop"])
def test_side_effect_tool_never_runs_after_a_cut_off_or_broken_stream(ending):
    ran = []

    @tool(side_effects=True)
    def pay(amount: int) -> str:
        """Pays."""
        ran.append(amount)
        return "paid"

    with FakeProvider() as fp:
        tail = [s.drop()] if ending == "drop" else [s.finish(ending)]
        fp.add_turn(s.text(block("pay", {"amount": 5})), *tail)
        fp.add_turn(s.text("after"))
        with make_engine(fp, [pay], approve=approve_all) as engine:
            events = list(engine.run([{"role": "user", "content": "q"}]))
    assert ran == []
    result = events[-1].result
    assert not result.tool_results[0].ok
    [told] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert told.skipped == "stream_not_finished" and told.result.error == result.tool_results[0].error


# --- native tool calls ------------------------------------------------------------------------------

def test_native_call_is_dispatched_when_the_next_index_starts():
    first_started = threading.Event()

    @tool
    def first(q: str) -> str:
        """First."""
        first_started.set()
        return "one"

    @tool
    def second(q: str) -> str:
        """Second."""
        return "two"

    with FakeProvider() as fp:
        fp.add_turn(s.tool_call(0, id="c0", name="first", arguments='{"q":'),
                    s.tool_call(0, arguments=' "a"}'),
                    s.tool_call(1, id="c1", name="second", arguments='{"q": "b"}'),
                    s.wait(first_started, timeout=5),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("both done"))
        with make_engine(fp, [first, second], tool_mode="native") as engine:
            events = collect(engine)
    result = done(events)
    assert first_started.is_set()
    assert [r.text for r in result.tool_results] == ["one", "two"]
    msgs = fp.requests[1].json["messages"]
    assistant = next(m for m in msgs if m["role"] == "assistant")
    assert [c["id"] for c in assistant["tool_calls"]] == ["c0", "c1"]
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_msgs] == [("c0", "one"), ("c1", "two")]
    assert "system" not in [m["role"] for m in fp.requests[0].json["messages"]]


# --- failure rules ----------------------------------------------------------------------------------

def test_error_before_any_token_fails_over_to_the_next_model():
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "overloaded"}}))
        fp.add_turn(s.text("from backup"))
        with make_engine(fp, models=["main", "backup"]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert result.answer == "from backup"
    assert result.telemetry.model_used == "backup" and result.telemetry.failovers == 1
    assert [r.json["model"] for r in fp.requests] == ["main", "backup"]


def test_telemetry_says_which_model_failed_and_why_in_one_line_each():
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(404, {"error": {"message": "model mian\nnot found"}}))
        fp.add_turn(s.text("from backup"))
        with make_engine(fp, models=["mian", "backup"]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    [failure] = result.telemetry.failed_attempts
    assert failure.startswith("mian: LlmHttpError: ") and "404" in failure and "mian not found" in failure
    assert "\n" not in failure


def test_all_models_failing_gives_a_visible_warning_and_done():
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(500, {"error": {"message": "boom one"}}))
        fp.add_turn(s.http_error(502, {"error": {"message": "boom two"}}))
        with make_engine(fp, models=["a", "b"]) as engine:
            events = collect(engine)
    result = done(events)
    tokens = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert tokens.startswith("\u26a0\ufe0f LLM error:") and "boom one" in tokens and "boom two" in tokens
    assert result.telemetry.stop_reason == "llm_error"
    assert any(isinstance(e, ErrorEvent) for e in events)


def test_error_after_tokens_keeps_the_partial_answer_and_does_not_fail_over():
    with FakeProvider() as fp:
        fp.add_turn(s.text("Half an ans"), s.drop())
        fp.add_turn(s.text("should never be asked"))
        with make_engine(fp, models=["a", "b"]) as engine:
            events = collect(engine)
    result = done(events)
    assert result.answer == "Half an ans"
    assert result.telemetry.stop_reason == "llm_error_after_tokens"
    assert isinstance(events[-2], ErrorEvent)
    assert len(fp.requests) == 1


def test_telemetry_names_the_model_and_failovers_when_the_run_ends_in_an_error():
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "busy"}}))
        fp.add_turn(s.text("partial"), s.drop())
        with make_engine(fp, models=["a", "b"]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert (result.telemetry.model_used, result.telemetry.failovers) == ("b", 1)
    assert result.answer == "partial" and result.error


def test_text_held_back_as_a_possible_block_is_kept_when_the_stream_breaks():
    @tool
    def t() -> str:
        """T."""
        return "x"

    with FakeProvider() as fp:
        fp.add_turn(s.text("Partial <to"), s.drop())
        with make_engine(fp, [t]) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert result.answer == "Partial <to"
    assert result.telemetry.stop_reason == "llm_error_after_tokens"


def test_caller_cancel_token_is_not_set_by_the_run():
    from streamengine import CancelToken

    with FakeProvider() as fp:
        fp.add_turn(s.text("one "), s.stall())
        with make_engine(fp) as engine:
            mine = CancelToken()
            gen = engine.run([{"role": "user", "content": "q"}], cancel=mine)
            next(e for e in gen if isinstance(e, TokenEvent))
            gen.close()
            assert not mine.is_set()


def test_max_continuations_returns_all_rounds_joined():
    @tool
    def again(n: int) -> str:
        """Loop."""
        return str(n)

    with FakeProvider() as fp:
        for n in range(3):
            fp.add_turn(s.text(f"round{n} " + block("again", {"n": n})))
        with make_engine(fp, [again], max_continuations=2, max_tools_total=10) as engine:
            result = engine.complete([{"role": "user", "content": "q"}])
    assert result.telemetry.stop_reason == "max_continuations_reached"
    assert result.telemetry.rounds == 3 and len(fp.requests) == 3
    assert all(f"round{n}" in result.answer for n in range(3))
    # The last round's call still runs (its result is shown and filed); only a continuation is missing.
    assert result.telemetry.cap_skipped == 0 and result.telemetry.tools_started == 3
    assert [r.text for r in result.tool_results] == ["0", "1", "2"]


# --- cancel and concurrency -------------------------------------------------------------------------

def test_cancel_mid_stream_shuts_everything_down():
    tool_running = threading.Event()
    saw_cancel = threading.Event()

    @tool
    def slow(ctx: ToolContext) -> str:
        """Slow."""
        tool_running.set()
        if ctx.cancel_event.wait(10):
            saw_cancel.set()
        return "x"

    with FakeProvider() as fp:
        fp.add_turn(s.text("start " + block("slow")), s.stall())
        with make_engine(fp, [slow]) as engine:
            cancel = threading.Event()
            events = []
            for event in engine.run([{"role": "user", "content": "q"}], cancel=cancel):
                events.append(event)
                if isinstance(event, ToolStartEvent):
                    assert tool_running.wait(5)
                    cancel.set()
            assert saw_cancel.wait(5)
    result = done(events)
    assert result.telemetry.stop_reason == "cancelled"


def test_breaking_out_of_the_iteration_cancels_the_run():
    with FakeProvider() as fp:
        fp.add_turn(s.text("one "), s.stall())
        with make_engine(fp) as engine:
            before = {t for t in threading.enumerate() if t.is_alive()}
            gen = engine.run([{"role": "user", "content": "q"}])
            for event in gen:
                if isinstance(event, TokenEvent):
                    break
            gen.close()
            # The provider saw the connection closed (the stall never ends on its own) ...
            assert fp.wait_for_client_disconnects(1, timeout=5.0)
            # ... and every thread the run started has ended (the engine's tool pool had none to start).
            def started():
                return [t.name for t in threading.enumerate() if t.is_alive() and t not in before
                        and not t.name.startswith(("pytest", "Thread-"))]

            deadline = time.monotonic() + 5.0
            while started() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert started() == []


def test_many_concurrent_runs_on_one_engine():
    @tool
    def double(n: int) -> int:
        """Double."""
        return n * 2

    def answer(request):
        # Requests from concurrent runs arrive in any order: answer by content.
        last = request["messages"][-1]["content"]
        if last.startswith("q"):
            n = int(last[1:])
            return [s.text(f"{n}: "), s.text(block("double", {"n": n}))]
        return [s.text("final")]

    runs = 16
    results = [None] * runs
    with FakeProvider() as fp:
        fp.respond_with(answer)
        with make_engine(fp, [double]) as engine:
            def one(i):
                results[i] = list(engine.run([{"role": "user", "content": f"q{i}"}]))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(runs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
    for i, events in enumerate(results):
        assert events is not None and names(events)[-1] == "done"
        result = events[-1].result
        assert [r.text for r in result.tool_results] == [str(2 * i)]
        assert result.answer == "final" and result.rounds[0].startswith(f"{i}: ")


def test_config_is_validated_with_clear_errors(monkeypatch):
    with pytest.raises(ConfigError, match="models"):
        EngineConfig(models=[])
    with pytest.raises(ConfigError, match="tool_mode"):
        EngineConfig(models=["m"], tool_mode="psychic")
    with pytest.raises(ConfigError, match="tool_timeout"):
        EngineConfig(models=["m"], tool_timeout=0)
    with pytest.raises(ConfigError, match="max_tools_total"):
        EngineConfig(models=["m"], max_tools_total=-1)
    monkeypatch.delenv("STREAMENGINE_MODEL", raising=False)
    with pytest.raises(ConfigError, match="STREAMENGINE_MODEL"):
        EngineConfig.from_env()
    monkeypatch.setenv("STREAMENGINE_MODEL", "a, b")
    assert EngineConfig.from_env().models == ("a", "b")


def one_tool_then_an_answer(fp, **config):
    """Round 1 calls tool ``t`` inline, round 2 answers ``end``; returns the result."""
    @tool
    def t() -> str:
        """T."""
        return "r"

    fp.add_turn(s.text(block("t")))
    fp.add_turn(s.text("end"))
    with make_engine(fp, [t], **config) as engine:
        return engine.complete([{"role": "user", "content": "q"}])


def test_options_reach_every_round():
    from streamengine import CompletionOptions

    with FakeProvider() as fp:
        one_tool_then_an_answer(fp, options=CompletionOptions(temperature=0.2, extra={"top_k": 5}))
    assert len(fp.requests) == 2
    for req in fp.requests:
        assert req.json["temperature"] == 0.2 and req.json["top_k"] == 5 and req.json["model"] == "m1"


def test_options_may_be_a_plain_mapping_and_unknown_keys_go_to_extra():
    from streamengine import CompletionOptions

    config = EngineConfig(models=["m"], options={"temperature": 0.2, "top_k": 5, "max_tokens": 9})
    assert config.options == CompletionOptions(temperature=0.2, max_tokens=9, extra={"top_k": 5})
    with FakeProvider() as fp:
        fp.add_turn(s.text("end"))
        with make_engine(fp, options={"temperature": 0.3, "seed": 1}) as engine:
            engine.complete([{"role": "user", "content": "q"}])
    assert fp.requests[0].json["temperature"] == 0.3 and fp.requests[0].json["seed"] == 1
    with pytest.raises(ConfigError, match=r"must not set 'model'.*models="):
        EngineConfig(models=["m"], options={"model": "x"})
    with pytest.raises(ConfigError, match="CompletionOptions or a mapping"):
        EngineConfig(models=["m"], options=0.2)


def test_model_is_shorthand_for_a_one_model_list():
    assert EngineConfig(model="m").models == ("m",)
    with pytest.raises(ConfigError, match="both model='a' and models"):
        EngineConfig(model="a", models=["b"])
    with pytest.raises(ConfigError, match=r"EngineConfig\.model must be a non-empty string"):
        EngineConfig(model="")
    with pytest.raises(ConfigError, match=r"EngineConfig\(models=\['gpt-4o-mini'\]\) or EngineConfig\(model="):
        EngineConfig()
    import dataclasses
    assert dataclasses.replace(EngineConfig(model="a"), models=["b", "c"]).models == ("b", "c")


def test_tool_mode_inline_runs_inline_blocks_and_the_old_name_xml_is_refused():
    with pytest.raises(ConfigError, match="tool_mode must be one of auto, inline, native, got 'xml'"):
        EngineConfig(models=["m"], tool_mode="xml")
    with FakeProvider() as fp:
        result = one_tool_then_an_answer(fp, tool_mode="inline")
    assert result.answer == "end" and result.telemetry.tools_ok == 1
    assert "tools" not in fp.requests[0].json  # inline only: no native tool list sent
    assert "<tool name=" in fp.requests[0].json["messages"][0]["content"]


def test_the_classifier_seam_decides_failover():
    from streamengine import ErrorClass, ErrorClassifier

    class NeverFailOver(ErrorClassifier):
        def classify(self, exc):
            return ErrorClass.FATAL

    with FakeProvider() as fp:
        fp.add_turn(s.http_error(503, {"error": {"message": "busy"}}))
        fp.add_turn(s.text("from m2"))
        config = EngineConfig(models=["m1", "m2"], idle_timeout=5.0, completion_timeout=10.0)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=config,
                             classifier=NeverFailOver()) as engine:
            result = engine.complete([{"role": "user", "content": "q"}], raise_on_error=False)
    assert result.telemetry.stop_reason == "llm_error" and len(fp.requests) == 1
    with pytest.raises(ConfigError, match="classifier must be an ErrorClassifier"):
        StreamingEngine(OpenAICompatibleClient("http://127.0.0.1:9"), config=config, classifier=object())


def test_model_chunk_events_reach_the_engines_emitter_and_observers_hear_each_call():
    from streamengine import ModelChunkEvent

    heard = []

    class Observer:
        def on_llm_responded(self, response):
            heard.append(response.content)

    with FakeProvider() as fp:
        fp.add_turn(s.text("Hel"), s.text("lo"), s.usage(prompt=2, completion=1))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=EngineConfig(models=["m1"]),
                             observers=[Observer()]) as engine:
            chunks = []
            unsubscribe = engine.emitter.subscribe(chunks.append)
            result = engine.complete([{"role": "user", "content": "q"}])
            unsubscribe()
    assert all(isinstance(e, ModelChunkEvent) for e in chunks)
    assert "".join(e.chunk.content or "" for e in chunks) == "Hello"
    assert [e.is_final for e in chunks].count(True) == 1 and chunks[-1].is_final
    assert chunks[-1].response.content == "Hello" and chunks[-1].response.usage == result.usage
    assert heard == ["Hello"]
