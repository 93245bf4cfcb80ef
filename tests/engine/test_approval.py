"""The approval contract, over real HTTP: nothing with a side effect runs without a yes.

No ``approve`` anywhere refuses a side-effect call (and the engine says so at
construction); ``run`` (events or ``batches()``) and ``complete`` take a hook for one run;
a hook that raises refuses.  Every call a gate or the pool stopped is told
exactly once, with a machine-readable ``skipped`` reason that survives error
redaction (the SSE payload carries it).
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import List

import pytest
from loguru import logger

from streamengine import (
    ConfigError,
    DoneEvent,
    EngineConfig,
    OpenAICompatibleClient,
    StreamingEngine,
    ToolResultEvent,
    ToolStartEvent,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.web import encode_stream

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = [{"role": "user", "content": "go"}]


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


def make(fp, tools, approve=None, **config):
    config.setdefault("models", ["m"])
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config), approve=approve)


def told(events) -> List[ToolResultEvent]:
    return [e for e in events if isinstance(e, ToolResultEvent)]


def done(events):
    assert isinstance(events[-1], DoneEvent)
    return events[-1].result


def sender():
    """A side-effect tool and the list of whom it sent to."""
    sent: List[str] = []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        sent.append(to)
        return f"sent to {to}"

    return send, sent


@pytest.fixture
def log_lines():
    """streamengine's log records (level, message, exception) at INFO and above, for the test."""
    records = []
    logger.enable("streamengine")
    handler = logger.add(lambda m: records.append(m.record), level="INFO",
                         filter=lambda r: r["name"].startswith("streamengine"))
    yield records
    logger.remove(handler)
    logger.disable("streamengine")


# --- 1. the library refuses by default -------------------------------------------------------------------

def test_without_approve_a_side_effect_call_is_refused_and_the_model_is_told_why():
    send, sent = sender()
    with FakeProvider() as fp:
        fp.add_turn(s.text("Sending " + block("send", {"to": "boss"})))
        fp.add_turn(s.text("I could not send it."))
        with make(fp, [send]) as engine:
            events = list(engine.run(ASK))
    assert sent == []
    [event] = told(events)
    assert event.skipped == "not_approved" and not event.result.ok
    assert event.result.error == ("not run: 'send' has side effects and nothing approved it; "
                                  "do not retry it, answer without it")
    assert event.result.error in fp.requests[1].json["messages"][-1]["content"]
    assert not [e for e in events if isinstance(e, ToolStartEvent)]
    telemetry = done(events).telemetry
    assert (telemetry.refused, telemetry.tools_started, telemetry.tools_failed) == (1, 0, 0)


def test_an_engine_with_side_effect_tools_and_no_approve_warns_once_at_construction(log_lines):
    send, _ = sender()

    @tool(side_effects=True)
    def delete(path: str) -> str:
        """Deletes."""
        return "gone"

    @tool
    def look(q: str) -> str:
        """Looks."""
        return q

    with FakeProvider() as fp:
        with make(fp, [send, look, delete]):
            pass
        with make(fp, [send], approve=lambda call: True), make(fp, [look]):
            pass
    warnings = [r["message"] for r in log_lines if r["level"].name == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "'send'" in warnings[0] and "'delete'" in warnings[0] and "'look'" not in warnings[0]
    assert "pass approve= to StreamingEngine or run() to let them run" in warnings[0]


# --- 2. a hook for one run ---------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["run", "batches", "complete"])
def test_a_run_s_own_approve_replaces_the_engine_s(how):
    send, sent = sender()
    asked = []

    def yes(call):
        asked.append(call.name)
        return True

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"})))
        fp.add_turn(s.text("sent"))
        fp.add_turn(s.text(block("send", {"to": "b"})))
        fp.add_turn(s.text("refused"))
        with make(fp, [send], approve=lambda call: False) as engine:
            if how == "run":
                first = done(list(engine.run(ASK, approve=yes)))
            elif how == "batches":
                first = done([e for batch in engine.run(ASK, approve=yes).batches() for e in batch])
            else:
                first = engine.complete(ASK, approve=yes)
            second = engine.complete(ASK)  # the engine's own hook again: no
    assert sent == ["a"] and asked == ["send"]
    assert first.tool_results[0].ok and first.telemetry.refused == 0
    assert not second.tool_results[0].ok and second.telemetry.refused == 1


def test_a_run_s_approve_lets_a_call_run_on_an_engine_without_one():
    send, sent = sender()
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"})))
        fp.add_turn(s.text("sent"))
        with make(fp, [send]) as engine:
            result = engine.complete(ASK, approve=lambda call: call.args() == {"to": "a"})
    assert sent == ["a"] and result.tool_results[0].text == "sent to a"


@pytest.mark.parametrize("bad", [True, "yes", 1])
def test_an_approve_that_is_not_callable_is_a_config_error(bad):
    send, _ = sender()
    with FakeProvider() as fp, make(fp, [send], approve=lambda call: True) as engine:
        for start in (lambda: engine.run(ASK, approve=bad), lambda: engine.run(ASK, approve=bad).batches(),
                      lambda: engine.complete(ASK, approve=bad)):
            with pytest.raises(ConfigError, match="approve must be a callable"):
                start()
        with pytest.raises(ConfigError, match="approve must be a callable"):
            make(fp, [send], approve=bad)


def test_a_raising_approve_refuses_without_telling_the_model_the_exception(log_lines):
    send, sent = sender()

    def approve(call):
        raise RuntimeError("secret-db-password-in-traceback")

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"})))
        fp.add_turn(s.text("not sent"))
        with make(fp, [send], approve=approve) as engine:
            events = list(engine.run(ASK))
    assert sent == []
    [event] = told(events)
    assert event.skipped == "not_approved"
    assert "approval check" in event.result.error and "failed" in event.result.error
    assert "secret-db-password" not in event.result.error
    continuation = json.dumps(fp.requests[1].json)
    assert "secret-db-password" not in continuation and "RuntimeError" not in continuation
    assert done(events).telemetry.refused == 1
    [logged] = [r for r in log_lines if r["exception"] is not None and "approv" in r["message"]]
    assert logged["level"].name in ("WARNING", "ERROR") and "'send'" in logged["message"]
    assert "secret-db-password-in-traceback" in str(logged["exception"].value)


# --- the hook is asked off the run's thread, with a deadline -----------------------------------------------

def test_an_approve_that_never_answers_is_refused_after_approval_timeout_and_the_run_goes_on():
    send, sent = sender()
    release = threading.Event()

    def approve(call):
        release.wait(10)  # a hook that hangs (a prompt nobody answers)
        return True

    with FakeProvider() as fp:
        fp.add_turn(s.text("Sending " + block("send", {"to": "a"}) + block("send", {"to": "b"})))
        fp.add_turn(s.text("nothing was sent"))
        with make(fp, [send], approve=approve, approval_timeout=0.3) as engine:
            started = time.monotonic()
            events = list(engine.run(ASK))
            took = time.monotonic() - started
            release.set()
    assert sent == [] and took < 3
    results = told(events)
    assert [e.skipped for e in results] == ["not_approved", "not_approved"]
    assert all("0.3s (EngineConfig.approval_timeout)" in e.result.error for e in results)
    assert done(events).answer == "nothing was sent" and done(events).telemetry.refused == 2


def test_a_cancel_while_approve_is_asked_skips_the_held_calls_as_cancelled():
    send, sent = sender()
    asked, release, cancel = threading.Event(), threading.Event(), threading.Event()

    def approve(call):
        asked.set()
        release.wait(10)
        return True

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"}) + block("send", {"to": "b"})))
        with make(fp, [send], approve=approve) as engine:
            threading.Timer(0.0, lambda: asked.wait(5) and cancel.set()).start()
            started = time.monotonic()
            events = list(engine.run(ASK, cancel))
            took = time.monotonic() - started
            release.set()
    assert sent == [] and took < 3
    assert [e.skipped for e in told(events)] == ["cancelled", "cancelled"]
    assert done(events).telemetry.stop_reason == "cancelled" and len(fp.requests) == 1


def test_a_keyboard_interrupt_in_approve_refuses_every_held_call_once_then_propagates():
    send, sent = sender()

    def approve(call):
        raise KeyboardInterrupt

    events = []
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"}) + block("send", {"to": "b"})))
        with make(fp, [send], approve=approve, max_tools_per_round=3) as engine, \
                pytest.raises(KeyboardInterrupt):
            for event in engine.run(ASK):
                events.append(event)
    assert sent == [] and len(fp.requests) == 1
    results = told(events)
    assert Counter(e.result.call_id for e in results) == Counter({"call_inline_r1_1": 1, "call_inline_r1_2": 1})
    assert [e.skipped for e in results] == ["not_approved", "not_approved"]


# --- every refused call is told exactly once (mutant: a refusal that loses its tool_result) ----------------

def test_every_call_approve_refused_gets_exactly_one_tool_result():
    send, sent = sender()
    with FakeProvider() as fp:
        fp.add_turn(s.text("".join(block("send", {"to": who}) for who in ("a", "b", "c", "d"))))
        fp.add_turn(s.text("b only"))
        with make(fp, [send], approve=lambda call: call.args()["to"] == "b", max_tools_per_round=4) as engine:
            events = list(engine.run(ASK))
    assert sent == ["b"]
    results = told(events)
    assert Counter(e.result.call_id for e in results) == Counter(
        {"call_inline_r1_1": 1, "call_inline_r1_2": 1, "call_inline_r1_3": 1, "call_inline_r1_4": 1})
    assert [(e.skipped, e.result.ok) for e in sorted(results, key=lambda e: e.result.call_id)] == [
        ("not_approved", False), (None, True), ("not_approved", False), ("not_approved", False)]
    telemetry = done(events).telemetry
    assert telemetry.refused == 3 and telemetry.tools_ok == 1


# --- 3. the skip reason of every gate, and of the pool ---------------------------------------------------------

def test_each_gate_tells_its_skip_reason_and_calls_that_ran_have_none():
    @tool
    def look(q: str) -> str:
        """Looks."""
        if q == "bad":
            raise ValueError("broken")
        return q

    @tool
    def hidden() -> str:
        """Not allowed here."""
        return "never"

    send, _ = sender()
    first = (block("look", {"q": "a"}) + block("look", {"q": "a"}) + block("look", {"q": "bad"})
             + block("hidden") + block("nosuch") + block("send", {"to": "x"}) + block("look", {"q": "b"}))
    with FakeProvider() as fp:
        fp.add_turn(s.text(first))
        fp.add_turn(s.text(block("look", {"q": "c"}) + block("look", {"q": "d"})))
        fp.add_turn(s.text("done"))
        with make(fp, [look, hidden, send], max_tools_per_round=3, max_tools_total=4,
                  allowed_tools=["look", "send"]) as engine:
            events = list(engine.run(ASK))
    reasons = {(e.result.call_id, e.skipped) for e in told(events)}
    assert reasons == {
        ("call_inline_r1_1", None),  # look a: ran
        ("call_inline_r1_2", "duplicate"),
        ("call_inline_r1_3", None),  # look bad: ran and failed
        ("call_inline_r1_4", "not_allowed"),  # hidden: not in allowed_tools
        ("call_inline_r1_5", "not_allowed"),  # an unknown tool
        ("call_inline_r1_6", "not_approved"),  # send: round's third call, then refused
        ("call_inline_r1_7", "round_cap"),
        ("call_inline_r2_1", None),  # look c: the run's fourth call
        ("call_inline_r2_2", "request_cap"),
    }
    assert {e.result.call_id: e.result.ok for e in told(events)}["call_inline_r1_3"] is False


def test_a_call_refused_because_the_pool_was_busy_is_skipped_pool_busy():
    release, holding = threading.Event(), threading.Event()

    @tool
    def hold() -> str:
        """Holds the only worker."""
        holding.set()
        release.wait(10)
        return "held"

    @tool
    def quick() -> str:
        """Quick."""
        return "quick"

    with FakeProvider() as fp:
        fp.respond_with(lambda request: (
            [s.text(block("hold"))] if request["messages"][-1]["content"] == "a"
            else [s.text(block("quick"))] if request["messages"][-1]["content"] == "b"
            else [s.text("answered")]))
        with make(fp, [hold, quick], pool_size=1, tool_queue_timeout=0.3, max_continuations=0) as engine:
            events_a = []
            runner_a = threading.Thread(target=lambda: events_a.extend(engine.run([{"role": "user",
                                                                                    "content": "a"}])))
            runner_a.start()
            assert holding.wait(10)
            events_b = list(engine.run([{"role": "user", "content": "b"}]))
            release.set()
            runner_a.join(10)
    [busy] = told(events_b)
    assert busy.skipped == "pool_busy" and "busy" in busy.result.error
    assert [e.skipped for e in told(events_a)] == [None]


def test_a_call_cancelled_before_it_finished_is_skipped_cancelled():
    entered, stop = threading.Event(), threading.Event()

    @tool
    def wait_here() -> str:
        """Waits."""
        entered.set()
        stop.wait(10)
        return "late"

    cancel = threading.Event()
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("wait_here")), s.text(" talking on"), s.wait(stop, timeout=10))
        with make(fp, [wait_here]) as engine:
            events = []
            for event in engine.run(ASK, cancel):
                events.append(event)
                if isinstance(event, ToolStartEvent):
                    cancel.set()
            stop.set()
    [event] = told(events)
    assert event.skipped == "cancelled" and done(events).telemetry.stop_reason == "cancelled"


def test_a_timed_out_call_ran_so_it_has_no_skip_reason():
    release = threading.Event()

    @tool(timeout=0.2)
    def slow() -> str:
        """Slow."""
        release.wait(5)
        return "late"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("slow")))
        fp.add_turn(s.text("gave up"))
        with make(fp, [slow]) as engine:
            events = list(engine.run(ASK))
            release.set()
    [event] = told(events)
    assert event.result.timed_out and event.skipped is None


def test_skipped_is_in_the_sse_tool_result_payload():
    send, _ = sender()
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "a"})))
        fp.add_turn(s.text("no"))
        with make(fp, [send]) as engine:
            [event] = told(engine.run(ASK))
    frame = next(iter(encode_stream([event], ok_first=False))).decode("ascii")
    payload = json.loads(frame.split("data: ", 1)[1])
    assert payload["skipped"] == "not_approved" and payload["ok"] is False


def test_skips_are_logged_at_info(log_lines):
    @tool
    def look(q: str) -> str:
        """Looks."""
        return q

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("look", {"q": "a"}) + block("look", {"q": "a"})))
        fp.add_turn(s.text("ok"))
        with make(fp, [look]) as engine:
            engine.complete(ASK)
    skips = [r for r in log_lines if r["level"].name == "INFO" and "duplicate" in r["message"]]
    assert len(skips) == 1 and "'look'" in skips[0]["message"]
