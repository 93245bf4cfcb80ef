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

from streamengine._engine.events import DoneEvent, TokenEvent, ToolResultEvent, ToolStartEvent
from streamengine.testing import FakeProvider, steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

from test_engine import block, make_engine  # the same engine and block helpers as the engine's own tests

MESSAGES = [{"role": "user", "content": "question"}]


def run_thread_names():
    return [t.name for t in threading.enumerate()
            if t.name.startswith("streamengine-run") or t.name.startswith("streamengine-deadlines")
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
