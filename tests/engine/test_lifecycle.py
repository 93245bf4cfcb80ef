"""Tool lifecycle under many users, over real HTTP: truthful tool_start, results as they finish,
gates in order in every round, drafts kept, parse problems and filing failures told, failover
after tokens, approval of side effects."""
from __future__ import annotations

import threading
import time

import pytest
from test_engine import approve_all, block, collect, done, make_engine, names

from streamengine import (
    DoneEvent,
    EngineConfig,
    ErrorEvent,
    HeartbeatEvent,
    OpenAICompatibleClient,
    ResetEvent,
    StreamingEngine,
    TokenEvent,
    ToolResultEvent,
    ToolStartEvent,
)
from streamengine.rag import SqliteRagStore
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, ToolHandle, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

Q = [{"role": "user", "content": "q"}]


def recording_look(ran):
    """A ``look(q)`` tool that answers ``q`` and records each call in ``ran``."""

    @tool
    def look(q: str) -> str:
        """Looks."""
        ran.append(q)
        return q

    return look


def results(events):
    return [e.result for e in events if isinstance(e, ToolResultEvent)]


# --- 1. tool_start is sent when the function is entered, not when it waits for a worker -----------

def test_tool_start_waits_for_a_free_worker():
    release_first = threading.Event()
    entered = []

    @tool
    def hold(name: str, ctx: ToolContext) -> str:
        """Holds its worker until released."""
        entered.append(name)
        if name == "a":
            release_first.wait(10)
        return name

    with FakeProvider() as fp:
        fp.respond_with(lambda request: [s.text(block("hold", {"name": request["messages"][-1]["content"]}))]
                        if request["messages"][-1]["role"] == "user" and
                        request["messages"][-1]["content"] in ("a", "b") else [s.text("done")])
        with make_engine(fp, [hold], pool_size=1) as engine:
            run_a = engine.run([{"role": "user", "content": "a"}], heartbeat_s=0.05)
            seen_a = []
            for event in run_a:
                seen_a.append(event)
                if isinstance(event, ToolStartEvent):
                    break
            run_b = engine.run([{"role": "user", "content": "b"}], heartbeat_s=0.05)
            seen_b = []
            heartbeats = 0
            for event in run_b:  # b's call is queued behind a's: no tool_start while it waits
                seen_b.append(event)
                heartbeats += isinstance(event, HeartbeatEvent)
                if heartbeats == 10 or isinstance(event, DoneEvent):
                    break
            assert entered == ["a"]
            assert "tool_start" not in names(seen_b)
            release_first.set()
            seen_a += list(run_a)
            seen_b += list(run_b)
    assert entered == ["a", "b"]
    for seen in (seen_a, seen_b):
        order = [n for n in names(seen) if n in ("tool_start", "tool_result")]
        assert order == ["tool_start", "tool_result"]
        assert done(seen).tool_results[0].ok


# --- 2. tool_result the moment the tool finishes, while the model still talks ------------------------

def test_tool_result_arrives_before_the_stream_ends():
    result_seen = threading.Event()

    @tool
    def quick(x: str) -> str:
        """Answers at once."""
        return x.upper()

    with FakeProvider() as fp:
        # The provider finishes its answer only once the consumer has seen the tool's result.
        fp.add_turn(s.text("Let me look. " + block("quick", {"x": "hi"})), s.wait(result_seen, timeout=5),
                    s.text(" Still talking."))
        fp.add_turn(s.text("HI it is."))
        with make_engine(fp, [quick]) as engine:
            events = []
            for event in engine.run(Q):
                events.append(event)
                if isinstance(event, ToolResultEvent):
                    result_seen.set()
    order = names(events)
    assert order.index("tool_result") < max(i for i, e in enumerate(events) if isinstance(e, TokenEvent)
                                           and e.text == " Still talking.")
    assert done(events).tool_results[0].text == "HI"
    assert "HI" in fp.requests[1].json["messages"][-1]["content"]


def test_every_tool_start_has_exactly_one_tool_result_across_many_runs_sharing_an_engine():
    lock = threading.Lock()

    @tool
    def work(n: int) -> str:
        """Does a little work."""
        return str(n * 2)

    with FakeProvider() as fp:
        def answer(request):
            if request["messages"][-1]["role"] == "user" and request["messages"][-1]["content"].startswith("q"):
                base = int(request["messages"][-1]["content"][1:])
                return [s.text("go " + "".join(block("work", {"n": base * 10 + i}) for i in range(3))),
                        s.delay(0.01), s.text(" ok")]
            return [s.text("final")]
        fp.respond_with(answer)
        with make_engine(fp, [work], pool_size=4) as engine:
            outcomes = [None] * 8

            def one(i):
                events = list(engine.run([{"role": "user", "content": f"q{i}"}]))
                with lock:
                    outcomes[i] = events

            threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    for events in outcomes:
        starts = [e.call.id for e in events if isinstance(e, ToolStartEvent)]
        ends = [e.result.call_id for e in events if isinstance(e, ToolResultEvent)]
        assert len(starts) == 3 and sorted(starts) == sorted(ends)
        for call_id in starts:  # the start precedes the result of the same call
            first_start = next(i for i, e in enumerate(events)
                               if isinstance(e, ToolStartEvent) and e.call.id == call_id)
            first_end = next(i for i, e in enumerate(events)
                             if isinstance(e, ToolResultEvent) and e.result.call_id == call_id)
            assert first_start < first_end
        assert all(r.ok for r in done(events).tool_results)


# --- 3. dedup remembers only calls that started -------------------------------------------------------

def test_a_call_skipped_by_the_round_cap_runs_when_asked_again():
    ran = []
    look = recording_look(ran)

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("look", {"q": "a"}) + block("look", {"q": "b"})))
        fp.add_turn(s.text(block("look", {"q": "b"})))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [look], max_tools_per_round=1) as engine:
            result = engine.complete(Q)
    assert ran == ["a", "b"]
    assert result.telemetry.cap_skipped == 1 and result.telemetry.dedup_skipped == 0
    assert [r.ok for r in result.tool_results] == [True, False, True]


def test_a_side_effect_call_held_on_a_cut_stream_runs_when_asked_again():
    sent = []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends mail."""
        sent.append(to)
        return "sent"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "x"})), s.finish("length"))
        fp.add_turn(s.text(block("send", {"to": "x"})))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [send], approve=approve_all) as engine:
            result = engine.complete(Q)
    assert sent == ["x"]
    assert result.telemetry.dedup_skipped == 0
    assert "not run" in result.tool_results[0].error and result.tool_results[1].ok


# --- 4. gates in order in every round; the last round's calls run --------------------------------------

def test_the_last_round_runs_its_calls_and_counts_a_duplicate_as_a_duplicate():
    ran = []
    look = recording_look(ran)

    with FakeProvider() as fp:
        fp.add_turn(s.text("one " + block("look", {"q": "a"})))
        fp.add_turn(s.text("two " + block("look", {"q": "a"}) + block("look", {"q": "b"})))
        with make_engine(fp, [look], max_continuations=1) as engine:
            result = engine.complete(Q)
    assert ran == ["a", "b"]
    assert result.telemetry.dedup_skipped == 1 and result.telemetry.cap_skipped == 0
    assert result.telemetry.stop_reason == "max_continuations_reached"
    assert "one" in result.answer and "two" in result.answer


def test_max_continuations_zero_is_one_round_with_tools_running(tmp_path):
    @tool
    def look(q: str) -> str:
        """Looks."""
        return f"found {q} here"

    with FakeProvider() as fp, SqliteRagStore(str(tmp_path / "s.db")) as store:
        fp.add_turn(s.text("checking " + block("look", {"q": "wombats"})))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [look],
                             EngineConfig(models=["m"], max_continuations=0), rag=store) as engine:
            events = collect(engine)
        assert len(fp.requests) == 1
        assert [r.text for r in results(events)] == ["found wombats here"]
        assert store.count() >= 1  # filed, though no round reads it


# --- 5. the answer keeps what was shown ----------------------------------------------------------------

def test_a_later_round_failing_before_its_first_token_keeps_the_draft():
    look = recording_look([])

    with FakeProvider() as fp:
        fp.add_turn(s.text("Here is my draft. " + block("look", {"q": "a"})))
        fp.add_turn(s.http_error(500, {"error": {"message": "boom"}}))
        with make_engine(fp, [look], max_retries=0) as engine:
            result = engine.complete(Q)
    assert "Here is my draft." in result.answer
    assert result.error is not None and "LLM error" in result.answer


# --- 7. filing failures are visible and bounded ---------------------------------------------------------

class BrokenStore:
    def __init__(self, block_until=None):
        self.block_until = block_until

    def add_chunks(self, source, chunks, embed_model=None, *, scope=""):
        if self.block_until is not None:
            self.block_until.wait(10)
        raise RuntimeError("database is locked")

    def search(self, query, k=5, source=None, *, scope=""):
        return []


@pytest.mark.parametrize("blocking", [False, True], ids=["raises", "hangs"])
def test_a_lost_filing_is_told_in_telemetry_and_an_event(blocking):
    release = threading.Event()

    @tool
    def look(q: str) -> str:
        """Looks."""
        return "some text worth keeping"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("look", {"q": "a"})))
        fp.add_turn(s.text("done"))
        store = BrokenStore(release if blocking else None)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [look],
                             EngineConfig(models=["m"], filing_timeout=0.2), rag=store) as engine:
            events = collect(engine)
            release.set()
    notices = [e for e in events if isinstance(e, ErrorEvent)]
    assert notices and all(not n.fatal for n in notices)
    assert "RAG store" in notices[0].message
    result = done(events)
    assert result.telemetry.filing_errors == 1 and result.error is None and result.answer == "done"


# --- 7b. a result is told before the run goes on ---------------------------------------------------------

@pytest.fixture
def slow_to_tell(monkeypatch):
    """Tool workers pause between fixing a result and telling it (a thread switch there, made long)."""
    driver = threading.get_ident()
    call_safely = ToolHandle._safely

    def late(handle, callback, what):
        if what == "done callback" and threading.get_ident() != driver:
            time.sleep(0.3)
        call_safely(handle, callback, what)

    monkeypatch.setattr(ToolHandle, "_safely", late)


def answered_when_started():
    """A tool that returns once the consumer saw it start: its done callback is registered by then."""
    go = threading.Event()

    @tool
    def look(q: str) -> str:
        """Looks."""
        go.wait(10)
        return "some text worth keeping"

    def consume(run):
        events = []
        for event in run:
            events.append(event)
            if isinstance(event, ToolStartEvent):
                go.set()
        return events

    return look, consume


def test_a_result_fixed_on_its_worker_is_told_before_done(slow_to_tell):
    """A handle is done before its worker has told the result: the run waits for the telling."""
    look, consume = answered_when_started()
    with FakeProvider() as fp:
        fp.add_turn(s.text("checking " + block("look", {"q": "a"})))
        with make_engine(fp, [look], max_continuations=0) as engine:
            events = consume(engine.run(Q))
    assert names(events).count("tool_result") == 1 and isinstance(events[-1], DoneEvent)
    assert done(events).telemetry.tools_ok == 1


def test_a_reused_result_and_its_filing_are_waited_for_in_the_replay(slow_to_tell):
    """The replay of a failed attempt reuses the attempt's tool: its report and filing are still waited for."""
    look, consume = answered_when_started()
    with FakeProvider() as fp:
        fp.respond_with(flaky_first_attempt("a", "a", "never asked: no continuation"))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [look],
                             EngineConfig(models=["flaky", "steady"], failover_after_tokens=True, max_retries=0,
                                          max_continuations=0), rag=BrokenStore()) as engine:
            events = consume(engine.run(Q))
    assert names(events).count("reset") == 1 and isinstance(events[-1], DoneEvent)
    assert names(events).count("tool_result") == 1
    result = done(events)
    assert result.telemetry.tools_ok == 1 and result.telemetry.filing_errors == 1
    assert any(isinstance(e, ErrorEvent) and "RAG store" in e.message for e in events)


def test_a_call_given_up_as_its_tool_returns_is_told_once_before_done(monkeypatch):
    """The run gives up on a call (cancel) just as its worker fixes the real result: the worker's telling wins.

    The driving thread makes its "cancelled" result and, before telling it, lets the tool return; the worker
    claims the telling first and pauses before sending it.  The run must wait for that, not end without it.
    """
    from streamengine import ToolResult
    from streamengine._engine import tool_calls

    driver, returned, claimed = threading.get_ident(), threading.Event(), threading.Event()

    @tool
    def slow() -> str:
        """Returns when the run gives up on it."""
        returned.wait(10)
        return "real"

    make_result, make_event = ToolResult.error_result.__func__, tool_calls.ToolResultEvent

    def error_result(cls, call, reason, **fields):
        if reason.startswith("cancelled: the run") and threading.get_ident() == driver:
            returned.set()
            claimed.wait(5)  # the worker has fixed its result and claimed the telling
        return make_result(cls, call, reason, **fields)

    def event(result, skipped=None, call=None):
        if threading.get_ident() != driver:
            claimed.set()
            time.sleep(0.002)  # a thread switch before the worker sends it
        return make_event(result, skipped, call)

    monkeypatch.setattr(ToolResult, "error_result", classmethod(error_result))
    monkeypatch.setattr(tool_calls, "ToolResultEvent", event)
    cancel = threading.Event()
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("slow")))
        with make_engine(fp, [slow]) as engine:
            events = []
            for e in engine.run(Q, cancel):
                events.append(e)
                if isinstance(e, ToolStartEvent):
                    cancel.set()
    told = results(events)
    assert [r.text for r in told] == ["real"] and isinstance(events[-1], DoneEvent)
    assert [r.text for r in done(events).tool_results] == ["real"]


# --- 8. failover after tokens, opt-in ----------------------------------------------------------------------

def flaky_first_attempt(first_q, replay_q, final, drop_after=0.05):
    """Model "flaky" asks ``look(first_q)`` in round 1, then drops; the next model asks ``look(replay_q)``."""
    def respond(request):
        if len(request["messages"]) > 2:
            return [s.text(final)]
        if request["model"] == "flaky":
            return [s.text("Partial " + block("look", {"q": first_q})), s.delay(drop_after), s.drop()]
        return [s.text("Again " + block("look", {"q": replay_q}))]
    return respond


def failover_engine(fp, look):
    return make_engine(fp, [look], models=["flaky", "steady"], failover_after_tokens=True, max_retries=0)


def test_failover_after_tokens_resets_the_round_and_reuses_started_tools():
    ran = []

    @tool
    def look(q: str) -> str:
        """Looks."""
        ran.append(q)
        return "42"

    with FakeProvider() as primary_fp:
        primary_fp.respond_with(flaky_first_attempt("a", "a", "It is 42."))
        with failover_engine(primary_fp, look) as engine:
            events = collect(engine)
    resets = [e for e in events if isinstance(e, ResetEvent)]
    assert len(resets) == 1 and resets[0].round == 1 and "flaky" in resets[0].reason
    assert ran == ["a"]  # started once, its result reused by the replay
    result = done(events)
    assert result.error is None and result.answer == "It is 42."
    assert result.rounds[0].startswith("Again")
    (start,) = [e for e in events if isinstance(e, ToolStartEvent)]
    assert [r.call_id for r in result.tool_results] == [start.call.id]  # an exact repeat keeps the told id


def test_a_replay_that_asks_for_another_call_tells_it_under_an_id_of_its_own():
    """The failed attempt's call was told under its id; the replay's different call must not pass for it."""
    ran = []
    look = recording_look(ran)
    with FakeProvider() as fp:
        fp.respond_with(flaky_first_attempt("a", "b", "Both.", drop_after=0.3))
        with failover_engine(fp, look) as engine:
            events = collect(engine)
    assert sorted(ran) == ["a", "b"]
    starts = {e.call.id: e.call.args()["q"] for e in events if isinstance(e, ToolStartEvent)}
    told = {r.call_id: r.text for r in results(events)}
    assert sorted(starts.values()) == ["a", "b"] and len(starts) == 2
    assert told == starts  # each result told under its own call's id
    result = done(events)
    assert result.telemetry.tools_ok == 2 and result.answer == "Both."
    assert [(r.call_id, r.text) for r in result.tool_results if r.text == "b"] == \
        [(i, q) for i, q in starts.items() if q == "b"]


def test_a_replay_never_tells_a_result_under_an_id_its_attempt_told_another_under():
    """An exact repeat stopped by a gate in the replay is told under a fresh id; a told id is never reused."""
    def respond(request):
        if len(request["messages"]) > 3:
            return [s.text("final")]
        if request["model"] == "flaky":
            return [s.text("Partial " + block("nosuch") + block("look", {"q": "a"})), s.delay(0.3), s.drop()]
        return [s.text("Again " + block("look", {"q": "b"}) + block("look", {"q": "a"}))]  # a: over the cap

    with FakeProvider() as fp:
        fp.respond_with(respond)
        with make_engine(fp, [recording_look([])], models=["flaky", "steady"], failover_after_tokens=True,
                         max_retries=0, max_tools_per_round=1) as engine:
            events = collect(engine)
    starts = {e.call.id: e.call.args()["q"] for e in events if isinstance(e, ToolStartEvent)}
    told = [r.call_id for r in results(events)]
    assert len(told) == len(set(told))  # each id told once
    for call_id, q in starts.items():  # and a started call's id is told with its own result
        assert [r.text for r in results(events) if r.call_id == call_id] == [q]
    skipped = [r for r in done(events).tool_results if not r.ok]
    assert len(skipped) == 1 and "limit" in skipped[0].error and skipped[0].call_id not in starts


def test_without_the_flag_a_failure_after_tokens_ends_the_run():
    with FakeProvider() as fp:
        fp.add_turn(s.text("Partial"), s.drop())
        fp.add_turn(s.text("never asked"))
        with make_engine(fp, models=["a", "b"], max_retries=0) as engine:
            events = collect(engine)
    assert not [e for e in events if isinstance(e, ResetEvent)]
    assert done(events).error is not None and len(fp.requests) == 1


def test_without_the_flag_a_drop_after_a_native_tool_started_and_before_any_text_ends_the_run():
    entered = threading.Event()
    ran = []

    @tool
    def look(q: str) -> str:
        """Looks."""
        ran.append(q)
        entered.set()
        return q

    with FakeProvider() as fp:
        # The second call's start completes the first, which is dispatched (and entered) before the drop.
        fp.add_turn(s.tool_call(0, id="c1", name="look", arguments='{"q": "a"}'),
                    s.tool_call(1, id="c2", name="look", arguments='{"q": '),
                    s.wait(entered, timeout=10), s.drop())
        fp.add_turn(s.tool_call(0, id="c1", name="look", arguments='{"q": "a"}'), s.finish("tool_calls"))
        fp.add_turn(s.text("never asked"))
        with make_engine(fp, [look], models=["a", "b"], max_retries=0, tool_mode="native") as engine:
            events = collect(engine)
    assert [r.json["model"] for r in fp.requests] == ["a"]  # the second model was never asked
    assert not [e for e in events if isinstance(e, (ResetEvent, TokenEvent))]
    assert done(events).telemetry.stop_reason == "llm_error_after_tokens"
    assert ran == ["a"]
    assert [(r.call_id, r.text) for r in results(events)] == [("c1", "a")]  # told once, with its result


# --- approval of side effects ----------------------------------------------------------------------------

@pytest.mark.parametrize("verdict", [True, False])
def test_approve_decides_whether_a_side_effect_call_runs(verdict):
    sent, asked = [], []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends mail."""
        sent.append(to)
        return "sent"

    def approve(call):
        asked.append((call.name, call.args()))
        return verdict

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("send", {"to": "boss"})))
        fp.add_turn(s.text("ok"))
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [send], EngineConfig(models=["m"]),
                             approve=approve) as engine:
            result = engine.complete(Q)
    assert asked == [("send", {"to": "boss"})]
    assert sent == (["boss"] if verdict else [])
    assert result.tool_results[0].ok is verdict
    if not verdict:
        assert "not approved" in result.tool_results[0].error
        assert "not approved" in fp.requests[1].json["messages"][-1]["content"]
        assert result.telemetry.refused == 1
