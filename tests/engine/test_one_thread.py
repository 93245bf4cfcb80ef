"""The run driven by the consumer's thread, over real HTTP: what must reach the caller while the model is silent.

One thread per stream means a run only moves when its driver waits in the
run's selector; these tests pin down that the wait ends for everything that
matters (a finished tool, a tool's deadline, a queue wait behind it), and
that ``read_ahead=True`` keeps a slow consumer from holding tools back.
"""
from __future__ import annotations

import threading
import time

import pytest
from gc_support import left_for_the_collector
from test_engine import block, make_engine  # the same engine and block helpers as the engine's own tests

from streamengine import DoneEvent, HeartbeatEvent, TokenEvent, ToolResultEvent, ToolStartEvent
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MESSAGES = [{"role": "user", "content": "question"}]


def run_thread_names():
    return [t.name for t in threading.enumerate()
            if t.name.startswith("streamengine-run") or t.name.startswith("streamengine-stream")
            or t.name == "streamengine-read-ahead"]


def test_a_tool_result_while_the_provider_is_silent_arrives_at_once():
    """The model says nothing for 2 s after the call: the result still goes out before its next token."""
    @tool
    def quick(city: str) -> str:
        """Answers at once."""
        return f"sunny in {city}"

    seen = []
    during = []
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("quick", {"city": "Oslo"})), s.delay(2.0), s.text("after the silence"))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [quick]) as engine:
            for event in engine.run(MESSAGES):
                seen.append(event)
                during.append(run_thread_names())
    kinds = [type(e).__name__ for e in seen]
    result_at = kinds.index("ToolResultEvent")
    after_at = next(i for i, e in enumerate(seen) if isinstance(e, TokenEvent) and "silence" in e.text)
    assert kinds.index("ToolStartEvent") < result_at < after_at  # woken through the pipe, not by a token
    assert seen[result_at].result.ok and isinstance(seen[-1], DoneEvent)
    assert all(names == [] for names in during)  # the consumer's thread drove the run: no thread of its own


def test_a_tool_timeout_after_a_queue_wait_fires_at_its_deadline():
    """One worker: 'slow' waits behind 'hold', starts, and times out at start + 0.3 s, while the model is silent.

    Before the fix the dispatcher kept the deadline it saw at submit (the
    queue limit, 5 s here), so the timeout came only after the model spoke again.
    """
    hold_done = threading.Event()

    @tool
    def hold() -> str:
        """Occupies the only worker for a moment."""
        hold_done.wait(0.3)
        return "held"

    @tool(timeout=0.3)
    def slow(ctx: ToolContext) -> str:
        """Runs past its own timeout."""
        ctx.cancel_event.wait(10)
        return "too late"

    seen = []
    with FakeProvider() as fp:
        fp.add_turn(s.text(block("hold")), s.text(block("slow")), s.delay(2.0), s.text("model is back"))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [hold, slow], pool_size=1, tool_queue_timeout=5.0) as engine:
            seen = list(engine.run(MESSAGES))
    back_at = next(i for i, e in enumerate(seen) if isinstance(e, TokenEvent) and "back" in e.text)
    starts = [e.call.name for e in seen if isinstance(e, ToolStartEvent)]
    results = {e.result.name: (i, e.result) for i, e in enumerate(seen) if isinstance(e, ToolResultEvent)}
    assert starts == ["hold", "slow"]
    slow_at, timed_out = results["slow"]
    assert results["hold"][0] < slow_at < back_at  # fired at its deadline, before the model spoke again
    assert timed_out.timed_out and timed_out.queue_wait_s > 0  # it did wait in the queue first
    assert timed_out.ended_at - timed_out.started_at >= 0.3  # counted from the start, not from the submit


def test_a_rate_limit_back_off_keeps_heartbeats_going_and_a_cancel_from_another_thread_ends_it():
    """The provider says 429, retry after 20 s: the driving thread waits in its selector, not in a sleep.

    So heartbeats keep a served stream alive during the back-off, and a cancel
    from another thread ends it at once (before, the back-off slept in the
    driving thread: no heartbeat until the retry).
    """
    cancel = threading.Event()
    cancelled_at = []

    def cancel_now():
        cancelled_at.append(time.monotonic())
        cancel.set()

    seen = []
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "20"}))
        fp.add_turn(s.text("never asked"))
        with make_engine(fp) as engine:
            canceller = None
            for event in engine.run(MESSAGES, cancel=cancel, heartbeat_s=0.05):
                seen.append((time.monotonic(), event))
                beats = sum(isinstance(e, HeartbeatEvent) for _, e in seen)
                if beats == 3 and canceller is None:
                    canceller = threading.Thread(target=cancel_now)
                    canceller.start()
            assert canceller is not None, "no heartbeat went out during the back-off"
            canceller.join()
        assert len(fp.requests) == 1  # the retry never went out
    ended_at, last = seen[-1]
    assert isinstance(last, DoneEvent) and last.result.telemetry.stop_reason == "cancelled"
    assert not any(isinstance(e, TokenEvent) for _, e in seen)
    assert ended_at - cancelled_at[0] < 10.0  # cut short: the back-off asked for 20 s


def test_read_ahead_keeps_tool_starts_prompt_under_a_consumer_that_sleeps_per_event():
    """A consumer that takes 0.2 s per event (it speaks them): the reader thread still reads on and starts tools.

    The words come in one burst, the call 50 ms later: driven directly, the
    run would read the call only after the consumer took every word (1.6 s).
    """
    started_at = []

    @tool
    def lookup(city: str) -> str:
        """Records when it started."""
        started_at.append(time.monotonic())
        return f"sunny in {city}"

    received_at = []
    with FakeProvider() as fp:
        words = [s.text(f"word{i} ") for i in range(8)]
        fp.add_turn(*words, s.delay(0.05), s.text(block("lookup", {"city": "Oslo"})), s.text(" more"))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [lookup]) as engine:
            for event in engine.run(MESSAGES, read_ahead=True):
                received_at.append((time.monotonic(), event))
                time.sleep(0.2)  # the slow consumer under test
    tokens = [at for at, event in received_at if isinstance(event, TokenEvent)]
    assert started_at and len(tokens) >= 8
    # The tool started before the consumer had taken the fourth of the eight words before its call.
    assert started_at[0] < tokens[3]
    assert isinstance(received_at[-1][1], DoneEvent) and received_at[-1][1].result.tool_results[0].ok


def test_the_cap_ends_a_run_whose_chunks_never_stop():
    """Every wait ends readable (a token each 10 ms): the cap is still the driver's to fire, at 0.8 s."""
    with FakeProvider() as fp:
        fp.add_turn(*[x for _ in range(800) for x in (s.text("x"), s.delay(0.01))])
        with make_engine(fp, idle_timeout=2.0, completion_timeout=0.8) as engine:
            seen = list(engine.run(MESSAGES))
    tokens = [e for e in seen if isinstance(e, TokenEvent) and e.text == "x"]
    errors = [e for e in seen if e.name == "error"]
    assert len(errors) == 1 and isinstance(seen[-1], DoneEvent)
    assert "stream exceeded the 0.8s cap" in errors[0].message, errors[0].message
    assert 1 < len(tokens) < 800


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_finished_run_leaves_nothing_for_the_garbage_collector(read_ahead):
    """A run's objects die with their last reference: none of them waits for a collection in a cycle.

    The runner and its dispatcher held each other (the dispatcher's callbacks
    are the runner's methods), so every finished run left its state, loop,
    telemetry and events to the collector: ~50 objects a served session.
    """
    @tool
    def quick(city: str) -> str:
        """Answers at once."""
        return f"sunny in {city}"

    with FakeProvider() as fp:
        for _ in range(2):  # a warm run, then the one looked at
            fp.add_turn(s.text("looking "), s.text(block("quick", {"city": "Oslo"})), s.text(" more"))
            fp.add_turn(s.text("done"))
        with make_engine(fp, [quick]) as engine:
            # warm: imports and pools leave what they leave once
            assert isinstance(list(engine.run(MESSAGES))[-1], DoneEvent)
            ours = left_for_the_collector(lambda: list(engine.run(MESSAGES, read_ahead=read_ahead)))
    assert ours == []



# --- one run API: a Run, read as events or as batches ---------------------------------------------------------

def test_a_run_is_read_as_events_or_as_batches_and_batches_end_where_the_run_waits():
    with FakeProvider() as fp:
        fp.add_turn(s.text("one "), s.delay(0.2), s.text("two"))
        fp.add_turn(s.text("one "), s.delay(0.2), s.text("two"))
        with make_engine(fp, []) as engine:
            events = list(engine.run(MESSAGES))
            batches = list(engine.run(MESSAGES).batches())
    def shown(events):
        return [(type(e).__name__, getattr(e, "text", None)) for e in events]
    assert shown([e for batch in batches for e in batch]) == shown(events)
    tokens = [[e.text for e in batch if isinstance(e, TokenEvent)] for batch in batches]
    assert ["one "] in tokens and ["two"] in tokens  # the pause split them: no token waited for the next
    assert isinstance(batches[-1][-1], DoneEvent)


def test_a_run_read_event_by_event_cannot_switch_to_batches_and_close_cancels_it():
    from streamengine import ConfigError

    with FakeProvider() as fp:
        fp.add_turn(s.text("first "), s.stall())
        with make_engine(fp, []) as engine:
            run = engine.run(MESSAGES)
            first = next(iter(run))
            with pytest.raises(ConfigError, match="event by event"):
                run.batches()
            started = time.monotonic()
            run.close()  # ends the stalled stream now: no wait for its idle timeout
            assert time.monotonic() - started < 2.0
    assert type(first).__name__ in ("RoundEvent", "TokenEvent") and run_thread_names() == []


def test_a_run_that_asked_approve_leaves_nothing_for_the_garbage_collector():
    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        return f"sent to {to}"

    with FakeProvider() as fp:
        for _ in range(2):  # a warm run, then the one looked at
            fp.add_turn(s.text(block("send", {"to": "a"})))
            fp.add_turn(s.text("sent"))
        with make_engine(fp, [send], approve=lambda call: True) as engine:
            assert isinstance(list(engine.run(MESSAGES))[-1], DoneEvent)
            ours = left_for_the_collector(lambda: list(engine.run(MESSAGES)))
    assert ours == []


def test_set_heartbeat_changes_how_often_a_quiet_run_wakes_from_the_next_wait_on():
    """``Run.set_heartbeat``: the run-log producer wakes a quiet run often only while tokens wait to be appended."""
    seen = []
    with FakeProvider() as fp:
        fp.add_turn(s.text("first"), s.delay(1.2), s.text("second"))
        with make_engine(fp) as engine:
            run = engine.run(MESSAGES, heartbeat_s=0.05)
            for batch in run.batches():
                seen.extend(batch)
                if any(isinstance(e, TokenEvent) and e.text == "first" for e in batch):
                    beats_before = sum(isinstance(e, HeartbeatEvent) for e in seen)
                    run.set_heartbeat(None)  # from now on: no heartbeat while the model is silent
    assert [e.text for e in seen if isinstance(e, TokenEvent)] == ["first", "second"]
    assert sum(isinstance(e, HeartbeatEvent) for e in seen) == beats_before  # none in the 1.2 s silence

    seen = []
    with FakeProvider() as fp:
        fp.add_turn(s.text("first"), s.delay(0.6), s.text("second"))
        with make_engine(fp) as engine:
            run = engine.run(MESSAGES)  # no heartbeat asked for
            run.set_heartbeat(0.05)  # before it starts: from its first wait on
            for batch in run.batches():
                seen.extend(batch)
    assert sum(isinstance(e, HeartbeatEvent) for e in seen) >= 4  # the 0.6 s silence, at 0.05 s
