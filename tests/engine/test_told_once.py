"""Every call is told exactly once, under an id of the run's own, and filing never holds a tool worker.

Engine runs over real HTTP (FakeProvider) with real stores; a stuck store is
one whose ``add_chunks`` waits for the test, or an SQLite file another
connection holds locked.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter

import pytest

from streamengine import (
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    OpenAICompatibleClient,
    SqliteRagStore,
    StreamingEngine,
    ToolResultEvent,
    ToolStartEvent,
    tool,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = [{"role": "user", "content": "go"}]


def block(name, args=None):
    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def done(events):
    assert isinstance(events[-1], DoneEvent)
    return events[-1].result


def make(fp, tools, rag=None, approve=None, **config):
    config.setdefault("models", ["m"])
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config), rag=rag,
                           approve=approve)


def yes(call):
    return True


def recording_sender():
    """A side-effect tool and the list of whom it sent to."""
    ran = []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        ran.append(to)
        return f"sent to {to}"

    return send, ran


# --- a busy refusal is told -----------------------------------------------------------------------

def test_a_call_refused_as_pool_busy_gets_its_tool_result_and_is_counted():
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
        with make(fp, [hold, quick], pool_size=1, tool_queue_timeout=0.3) as engine:
            events_a = []
            runner_a = threading.Thread(target=lambda: events_a.extend(engine.run([{"role": "user",
                                                                                    "content": "a"}])))
            runner_a.start()
            assert holding.wait(10)
            events_b = list(engine.run([{"role": "user", "content": "b"}]))
            release.set()
            runner_a.join(10)
    told = of(events_b, ToolResultEvent)
    assert len(told) == 1 and "busy" in told[0].result.error
    assert of(events_b, ToolStartEvent) == []  # it never ran
    assert not [e for e in of(events_b, ErrorEvent) if "filing" in e.message]  # no store: no filing wait
    telemetry = done(events_b).telemetry
    assert (telemetry.tools_started, telemetry.tools_failed, telemetry.filing_errors) == (1, 1, 0)
    assert telemetry.tools_started == telemetry.tools_ok + telemetry.tools_failed + telemetry.tools_timed_out
    assert done(events_a).answer == "answered"


def test_a_call_refused_as_pool_busy_is_not_a_duplicate_when_asked_again_next_round():
    release, holding, a_done = threading.Event(), threading.Event(), threading.Event()
    quick_ran = []

    @tool
    def hold() -> str:
        """Holds the only worker."""
        holding.set()
        release.wait(10)
        return "held"

    @tool
    def quick() -> str:
        """Quick."""
        quick_ran.append(1)
        return "quick"

    def respond(request):
        last = request["messages"][-1]["content"]
        if last == "a":
            return [s.text(block("hold"))]
        if last == "b":
            return [s.text(block("quick"))]
        if "quick" in last and "busy" in last:  # b's continuation: the pool is free again once a is done
            release.set()
            return [s.wait(a_done, timeout=10), s.text("Again " + block("quick"))]
        return [s.text("answered")]

    with FakeProvider() as fp:
        fp.respond_with(respond)
        with make(fp, [hold, quick], pool_size=1, tool_queue_timeout=0.3) as engine:
            events_a = []

            def run_a():
                events_a.extend(engine.run([{"role": "user", "content": "a"}]))
                a_done.set()

            runner_a = threading.Thread(target=run_a)
            runner_a.start()
            assert holding.wait(10)
            events_b = list(engine.run([{"role": "user", "content": "b"}]))
            release.set()
            runner_a.join(10)
    busy, retried = of(events_b, ToolResultEvent)
    assert "busy" in busy.result.error and busy.skipped == "pool_busy"
    assert retried.result.ok and retried.result.text == "quick" and retried.skipped is None
    assert quick_ran == [1]
    telemetry = done(events_b).telemetry
    assert telemetry.dedup_skipped == 0 and telemetry.tools_ok == 1


def test_a_tool_given_up_and_returning_later_is_told_once():
    late = threading.Event()

    @tool(timeout=0.2)
    def slow() -> str:
        """Returns after its deadline."""
        late.wait(5)
        return "too late"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("slow")))
        fp.add_turn(s.text("ok"))
        with make(fp, [slow]) as engine:
            events = list(engine.run(ASK))
            late.set()
            engine.executor.shutdown(wait=True)  # the late return has happened: it is not told again
    told = Counter(e.result.call_id for e in of(events, ToolResultEvent))
    assert list(told.values()) == [1] and of(events, ToolResultEvent)[0].result.timed_out


# --- side effects ----------------------------------------------------------------------------------

def test_a_side_effect_call_repeated_in_its_round_runs_once():
    send, ran = recording_sender()

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "bob"}) + " and again " + block("send", {"to": "bob"})))
        fp.add_turn(s.text("sent"))
        with make(fp, [send], approve=yes) as engine:
            result = engine.complete(ASK)
    assert ran == ["bob"]
    assert result.telemetry.dedup_skipped == 1
    assert [r.ok for r in result.tool_results] == [True, False]


# --- ids are the run's -----------------------------------------------------------------------------

def test_a_provider_id_repeated_in_one_response_is_renamed_and_both_calls_are_answered():
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q}"

    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.tool_call(0, id="dup", name="look", arguments='{"q": "a"}'),
                    s.tool_call(1, id="dup", name="look", arguments='{"q": "b"}'), s.finish("tool_calls"))
        fp.add_turn(s.text("both"))
        with make(fp, [look], rag=store, tool_mode="native") as engine:
            events = list(engine.run(ASK))
        assert store.count(source="tool:look:dup") == 1 and store.count(source="tool:look:dup_2") == 1
    assert [e.call.id for e in of(events, ToolStartEvent)].count("dup") == 1
    assert sorted(e.result.call_id for e in of(events, ToolResultEvent)) == ["dup", "dup_2"]
    messages = fp.requests[1].json["messages"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["dup", "dup_2"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[2:]] == [("dup", "found a"), ("dup_2", "found b")]


def test_a_native_id_that_equals_an_earlier_inline_id_is_answered_under_the_providers_id():
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q}"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("look", {"q": "inline"})),
                    s.tool_call(0, id="call_inline_r1_1", name="look", arguments='{"q": "native"}'),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("both"))
        with make(fp, [look], tool_mode="auto") as engine:
            events = list(engine.run(ASK))
    result = done(events)
    told = Counter(e.result.call_id for e in of(events, ToolResultEvent))
    assert len(told) == 2 and set(told.values()) == {1}  # each call told once, under an id of its own
    assert {r.text for r in result.tool_results} == {"found inline", "found native"}
    messages = fp.requests[1].json["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_inline_r1_1"]  # the provider's, unchanged
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages] == [("call_inline_r1_1", "found native")]
    assert "found inline" in messages[-1]["content"] and "found native" not in messages[-1]["content"]


def test_a_native_id_that_equals_an_inline_id_of_an_earlier_round_is_answered_under_the_providers_id():
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q}"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("look", {"q": "inline"})))
        fp.add_turn(s.tool_call(0, id="call_inline_r1_1", name="look", arguments='{"q": "native"}'),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("both"))
        with make(fp, [look], tool_mode="auto") as engine:
            events = list(engine.run(ASK))
    told = Counter(e.result.call_id for e in of(events, ToolResultEvent))
    assert len(told) == 2 and set(told.values()) == {1}
    messages = fp.requests[2].json["messages"]
    assistant = [m for m in messages if m["role"] == "assistant"][-1]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_inline_r1_1"]
    assert [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"] == \
        [("call_inline_r1_1", "found native")]


# --- filing never holds a worker -----------------------------------------------------------------

class StuckStore(SqliteRagStore):
    """A store whose filings hang until released (a locked table without a timeout)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        self.entered.set()
        self.release.wait(20)
        raise RuntimeError("the table is locked")


def test_a_stuck_store_never_holds_a_tool_worker_and_counts_once_per_filing():
    @tool
    def fetch(n: int) -> str:
        """Fetches."""
        return f"page {n} " * 20

    store = StuckStore()
    try:
        with FakeProvider() as fp:
            fp.respond_with(lambda request: [s.text(block("fetch", {"n": 1}))]
                            if request["messages"][-1]["content"] == "go" else [s.text("done")])
            with make(fp, [fetch], rag=store, pool_size=2, filing_timeout=0.3, max_continuations=1) as engine:
                runs = [list(engine.run(ASK)) for _ in range(4)]  # more filings than workers, all stuck
                assert store.entered.is_set()
                # Another run's tool still starts and answers: no worker is held by a filing.
                started = threading.Event()
                late = []
                thread = threading.Thread(target=lambda: late.extend(
                    e for e in engine.run(ASK) if not (isinstance(e, ToolStartEvent) and started.set())))
                thread.start()
                assert started.wait(0.3 + 2)
                thread.join(10)
                assert engine.executor.stuck_workers() == 0
                store.release.set()
    finally:
        store.release.set()
        store.close()
    for events in runs + [late]:
        result = done(events)
        assert result.answer == "done" and result.telemetry.filing_errors == 1
        assert len([e for e in of(events, ErrorEvent) if "RAG store" in e.message]) == 1


class SlowStore(SqliteRagStore):
    """A store whose filings wait until released, then file (a slow embedding, a busy server)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        self.entered.set()
        self.release.wait(20)
        return super().add_chunks(source, chunks, embed_model, scope=scope)


def test_the_wait_for_filing_keeps_heartbeats_going_and_the_next_round_finds_the_result():
    """The round waits for its filing in the run's selector, not in a blocking wait of the driving thread."""
    @tool
    def fetch() -> str:
        """Fetches."""
        return "the page says forty-two"

    store = SlowStore()
    try:
        with FakeProvider() as fp:
            fp.add_turn(s.text(block("fetch")))
            fp.add_turn(s.text("done"))
            with make(fp, [fetch], rag=store, filing_timeout=30) as engine:
                events, beats_while_filing = [], 0
                for event in engine.run(ASK, heartbeat_s=0.05):
                    events.append(event)
                    if store.entered.is_set() and not store.release.is_set() and event.name == "heartbeat":
                        beats_while_filing += 1
                        if beats_while_filing == 3:
                            store.release.set()
            assert store.count() == 1 and len(fp.requests) == 2
    finally:
        store.release.set()
        store.close()
    assert beats_while_filing == 3  # the stream stayed alive while the store was slow
    result = done(events)
    assert result.answer == "done" and result.telemetry.filing_errors == 0


def test_an_sqlite_file_locked_by_another_connection_is_a_filing_error_not_a_hang(tmp_path):
    @tool
    def fetch() -> str:
        """Fetches."""
        return "some page text"

    path = str(tmp_path / "locked.db")
    store = SqliteRagStore(path, busy_timeout=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it
    try:
        with FakeProvider() as fp:
            fp.add_turn(s.text(block("fetch")))
            fp.add_turn(s.text("done"))
            with make(fp, [fetch], rag=store, filing_timeout=5) as engine:
                result = engine.complete(ASK)
    finally:
        other.execute("ROLLBACK")
        other.close()
        store.close()
    assert result.answer == "done" and result.telemetry.filing_errors == 1


def test_cancelling_while_a_tool_runs_after_the_stream_ended_does_not_wait_for_filing():
    entered, release = threading.Event(), threading.Event()

    @tool
    def slow() -> str:
        """Slow."""
        entered.set()
        release.wait(10)
        return "late text"

    with FakeProvider() as fp, SqliteRagStore() as store:
        fp.add_turn(s.text(block("slow")))
        with make(fp, [slow], rag=store, filing_timeout=30, tool_timeout=30) as engine:
            cancel = threading.Event()
            events, finished = [], threading.Event()

            def consume():
                events.extend(engine.run(ASK, cancel))
                finished.set()

            thread = threading.Thread(target=consume)
            thread.start()
            assert entered.wait(10)
            cancel.set()
            assert finished.wait(5)  # a guard: the filing_timeout of 30 s is not waited for
            release.set()
            thread.join(5)
        # The engine closed: the tool returned after it was told as cancelled.  That late
        # result is not told again: not counted, not filed.
        assert store.count() == 0
    result = done(events)
    assert result.telemetry.stop_reason == "cancelled" and result.telemetry.filing_errors == 0
    assert [e.result.call_id for e in of(events, ToolResultEvent)] == ["call_inline_r1_1"]
    telemetry = result.telemetry
    assert (telemetry.tools_started, telemetry.tools_failed, telemetry.tools_ok) == (1, 1, 0)


def test_native_arguments_refuse_duplicate_keys_as_inline_blocks_do():
    send, ran = recording_sender()

    with FakeProvider() as fp:
        fp.add_turn(s.tool_call(0, id="c1", name="send", arguments='{"to": "bob", "to": "eve"}'),
                    s.finish("tool_calls"))
        fp.add_turn(s.text('<tool name="send">{"to": "bob", "to": "eve"}</tool>'))
        fp.add_turn(s.text("refused twice"))
        with make(fp, [send], approve=yes) as engine:
            result = engine.complete(ASK)
    assert ran == []
    native, inline = result.tool_results
    assert "appears twice" in native.error and "appears twice" in inline.error
    assert result.telemetry.parse_errors == 2


# --- amplification ----------------------------------------------------------------------------------

def test_thousands_of_blocks_are_summed_up_not_told_one_by_one():
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q}"

    blocks = "".join(block("look", {"q": str(n)}) for n in range(2000))
    with FakeProvider() as fp:
        fp.add_turn(s.text(blocks))
        fp.add_turn(s.text("ok"))
        with make(fp, [look], max_tools_per_round=3, max_tools_total=5) as engine:
            events = list(engine.run(ASK))
    told = of(events, ToolResultEvent)
    told_stopped = len(told) - 3  # the engine's bound on stopped calls told one by one
    assert 0 < told_stopped <= 50
    telemetry = done(events).telemetry
    assert telemetry.cap_skipped == 2000 - 3 and telemetry.tools_started == 3
    summary = [e for e in of(events, ErrorEvent) if "counted, not told one by one" in e.message]
    assert len(summary) == 1 and f"{2000 - 3 - told_stopped} more" in summary[0].message
    continuation = fp.requests[1].json["messages"][-1]["content"]
    assert f"[+{2000 - 3 - told_stopped}] further tool calls were not run" in continuation
    assert len(continuation) < 10_000 and continuation.count("(call id") == 3 + told_stopped


def test_native_calls_past_the_bound_are_not_sent_back_but_summed_up():
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q}"

    with FakeProvider() as fp:
        fp.add_turn(*[s.tool_call(n, id=f"n{n}", name="look", arguments=json.dumps({"q": str(n)}))
                      for n in range(40)], s.finish("tool_calls"))
        fp.add_turn(s.text("ok"))
        with make(fp, [look], tool_mode="native", max_tools_per_round=3) as engine:
            engine.complete(ASK)
    messages = fp.requests[1].json["messages"]
    assistant = next(m for m in messages if m["role"] == "assistant")
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert [c["id"] for c in assistant["tool_calls"]] == answered and len(answered) == 13
    assert "[+27] further tool calls were not run" in messages[-1]["content"]
