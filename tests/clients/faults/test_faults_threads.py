"""Threads: a tool that never returns, a pool full of them, cancel, and interpreter exit.

A hung tool cannot be killed in Python.  What the engine promises instead:
the run gets ``tool 'NAME' timed out after Ns`` at the deadline, the tool's
cancel flag is set (it may poll it), its worker slot stays counted as stuck
until the function really returns, a pool whose every slot is stuck answers
new calls at once with an error instead of queueing them forever, and none of
this keeps the interpreter from exiting.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from conftest import wait_for
from faultkit import GUARD_S

from streamengine import DoneEvent, EngineConfig, OpenAICompatibleClient, StreamingEngine, ToolStartEvent
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import ToolContext, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ROOT = Path(__file__).resolve().parents[3]
MESSAGES = [{"role": "user", "content": "q"}]


def block(name, args=None):
    import json

    return f'<tool name="{name}">{json.dumps(args or {})}</tool>'


class Hung:
    """A tool that never returns by itself: it ignores its cancel flag and waits for the test."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.flags_seen = []
        self.lock = threading.Lock()

        @tool
        def hang(n: int = 0, ctx: ToolContext = None) -> str:
            """Hangs until the test releases it."""
            self.started.set()
            flagged = ctx.cancel_event.wait(GUARD_S)
            with self.lock:
                self.flags_seen.append(flagged)
            self.release.wait(GUARD_S * 3)
            return "too late"

        self.tool = hang


@pytest.fixture
def hung():
    h = Hung()
    yield h
    h.release.set()  # the stuck threads end, so no_thread_leak sees them gone


def engine_for(fp, tools, **config):
    config.setdefault("models", ["m"])
    config.setdefault("idle_timeout", 5.0)
    config.setdefault("completion_timeout", 10.0)
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), tools, EngineConfig(**config))


def test_a_tool_that_never_returns_errors_at_its_deadline_with_its_flag_set_and_its_slot_counted(hung):
    with FakeProvider() as fp, engine_for(fp, [hung.tool], tool_timeout=0.2, pool_size=2) as engine:
        fp.add_turn(s.text("checking " + block("hang")))
        fp.add_turn(s.text("the tool timed out, sorry"))
        events = list(engine.run(MESSAGES))
        result = events[-1].result
        assert [r.error for r in result.tool_results] == ["tool 'hang' timed out after 0.2s"]
        assert result.tool_results[0].timed_out and result.telemetry.tools_timed_out == 1
        assert wait_for(lambda: hung.flags_seen == [True])  # its cancel flag was set at the deadline
        assert engine.executor.stuck_workers() == 1  # the slot is still taken, and counted
        assert "timed out after 0.2s" in fp.requests[1].json["messages"][-1]["content"]
        assert result.answer == "the tool timed out, sorry"
        hung.release.set()
        assert wait_for(lambda: engine.executor.stuck_workers() == 0)


def test_when_every_slot_is_stuck_new_calls_get_an_immediate_error_then_the_pool_recovers(hung):
    @tool
    def quick() -> str:
        """Answers at once."""
        return "quick answer"

    config = {"tool_timeout": 0.2, "pool_size": 2, "max_tools_per_round": 3}
    with FakeProvider() as fp, engine_for(fp, [hung.tool, quick], **config) as engine:
        fp.add_turn(s.text(block("hang", {"n": 1}) + block("hang", {"n": 2})))
        fp.add_turn(s.text("both timed out"))
        first = list(engine.run(MESSAGES))[-1].result
        assert [r.error for r in first.tool_results] == ["tool 'hang' timed out after 0.2s"] * 2
        assert engine.executor.stuck_workers() == 2

        fp.add_turn(s.text(block("quick")))
        fp.add_turn(s.text("no tools right now"))
        second = list(engine.run(MESSAGES))[-1].result
        refused = second.tool_results[0]
        assert refused.error == ("tool pool exhausted: all 2 workers are stuck in tools that timed out or "
                                 "ignored a cancel; try again later")
        assert refused.started_at == 0.0 and not refused.timed_out  # it never ran, it was not queued

        hung.release.set()
        assert wait_for(lambda: engine.executor.stuck_workers() == 0)
        fp.add_turn(s.text(block("quick")))
        fp.add_turn(s.text("done"))
        third = list(engine.run(MESSAGES))[-1].result
        assert [(r.ok, r.text) for r in third.tool_results] == [(True, "quick answer")]
    assert hung.flags_seen == [True, True]


def test_cancelling_a_run_stuck_in_a_tool_ends_it_at_once_and_flags_the_tool(hung):
    cancel = threading.Event()
    with FakeProvider() as fp, engine_for(fp, [hung.tool], tool_timeout=60.0) as engine:
        fp.add_turn(s.text(block("hang")))
        fp.add_turn(s.text("never asked"))
        events = []
        for event in engine.run(MESSAGES, cancel):
            events.append(event)
            if isinstance(event, ToolStartEvent):
                assert hung.started.wait(GUARD_S)
                cancel.set()  # long before the 60 s deadline
        result = events[-1].result
        assert isinstance(events[-1], DoneEvent)
        assert result.telemetry.stop_reason == "cancelled"
        assert result.tool_results[0].error.startswith("cancelled")
        assert wait_for(lambda: hung.flags_seen == [True])
        assert fp.request_count == 1


def test_leaving_the_iteration_mid_stream_cancels_the_running_tool(hung):
    with FakeProvider() as fp, engine_for(fp, [hung.tool], tool_timeout=60.0) as engine:
        fp.add_turn(s.text(block("hang")), s.text(" still talking"), s.stall())
        run = engine.run(MESSAGES)
        for event in run:
            if isinstance(event, ToolStartEvent):
                assert hung.started.wait(GUARD_S)
                break
        run.close()  # the browser went away
        assert wait_for(lambda: hung.flags_seen == [True])
        assert fp.wait_for_client_disconnects(1)  # and the provider stream was shut down


_EXIT_SCRIPT = textwrap.dedent("""
    import threading
    from streamengine import OpenAICompatibleClient
    from streamengine import EngineConfig, StreamingEngine
    from streamengine.testing import FakeProvider, steps as s
    from streamengine.tools import tool

    forever = threading.Event()

    @tool
    def hang() -> str:
        '''Blocks forever and ignores its cancel flag.'''
        forever.wait()
        return "never"

    fp = FakeProvider()
    fp.add_turn(s.text('<tool name="hang">{{}}</tool>'))
    fp.add_turn(s.text("gave up on the tool"))
    engine = StreamingEngine(OpenAICompatibleClient(fp.base_url), [hang],
                             EngineConfig(models=["m"], tool_timeout=0.2))
    result = engine.complete([{{"role": "user", "content": "q"}}])
    print(result.tool_results[0].error, flush=True)
    print(result.answer, flush=True)
    if {close}:
        engine.close()
        fp.close()
    print("exiting", flush=True)
""")


@pytest.mark.parametrize("close", [False, True], ids=["left-open", "closed"])
def test_a_tool_blocked_forever_does_not_keep_the_interpreter_from_exiting(close):
    # A hang here is the failure; the subprocess timeout turns it into a clear error.
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT.format(close=close)], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tool 'hang' timed out after 0.2s", "gave up on the tool", "exiting"]


def test_tools_of_cancelled_runs_that_ignore_their_flag_count_as_stuck(hung):
    """Browsers that leave while a tool hangs must not make later calls queue for a whole deadline.

    Before the fix, a cancelled tool still running was "busy", not "stuck",
    until its own deadline (here 60 s): the next request's tool call was
    queued behind it and timed out only after its own 60 s.
    """
    @tool
    def quick() -> str:
        """Answers at once."""
        return "quick answer"

    with FakeProvider() as fp, engine_for(fp, [hung.tool, quick], tool_timeout=60.0, pool_size=1) as engine:
        engine.executor.cancel_grace_s = 0.2
        cancel = threading.Event()
        fp.add_turn(s.text(block("hang")))
        for event in engine.run(MESSAGES, cancel):
            if isinstance(event, ToolStartEvent):
                assert hung.started.wait(GUARD_S)
                cancel.set()
        assert wait_for(lambda: engine.executor.stuck_workers() == 1)  # after the grace, not after 60 s
        fp.add_turn(s.text(block("quick")))
        fp.add_turn(s.text("no tools right now"))
        result = list(engine.run(MESSAGES))[-1].result
        # Refused at once: queued behind the stuck tool, it would have timed out after its 60 s instead.
        assert result.tool_results[0].error.startswith("tool pool exhausted: all 1 workers are stuck")
        assert not result.tool_results[0].timed_out
        # close() does not wait for a tool that ignored an earlier cancel either (its join would take 5 s).
        closed = threading.Event()
        closer = threading.Thread(target=lambda: (engine.close(), closed.set()))
        closer.start()
        assert closed.wait(4.0)
        closer.join()
    hung.release.set()


def test_a_long_lived_pool_does_not_keep_every_thread_it_ever_started():
    """Idle workers retire and new ones start, all day long in a server: the pool must not
    remember each one (it kept a Thread object per start until someone called threads_alive())."""
    from streamengine import ToolCall
    from streamengine.tools import ToolExecutor

    @tool
    def quick() -> str:
        """Answers at once."""
        return "ok"

    executor = ToolExecutor(max_workers=2, idle_exit_s=0.02)
    try:
        for i in range(30):
            assert executor.submit(quick, ToolCall(f"c{i}", "quick", "{}"), 5.0).result().ok
            assert wait_for(lambda: not [t for t in threading.enumerate()
                                         if t.name.startswith(f"streamengine-tool-{executor._pool_id}-")])
        assert len(executor._threads) <= executor.max_workers
    finally:
        executor.shutdown()


def test_closing_the_client_closes_its_provider_connections_at_once():
    """urllib3 2 only drops its pools on close; a pool held by a reference cycle (an exception's
    traceback...) kept its keep-alive sockets -- and the provider's threads -- alive until a full GC."""
    from gc_support import collector_off

    with FakeProvider() as fp:
        client = OpenAICompatibleClient(fp.base_url)
        fp.add_turn(s.text("kept alive"))
        contents = [c.content for c in client.stream(MESSAGES)]  # read to the end: the connection goes back to the pool
        assert contents[0] == "kept alive"
        adapter = client._session.get_adapter(fp.base_url + "/chat/completions")
        # Hold the pools as a cycle would; urllib3's RecentlyUsedContainer refuses iteration, hence keys().
        held = [adapter.poolmanager.pools[key] for key in adapter.poolmanager.pools.keys()]  # noqa: SIM118

        def conn_threads():
            return [t for t in threading.enumerate() if t.name == f"FakeProvider-{fp.port}-conn"]

        assert len(conn_threads()) == 1  # the pooled keep-alive connection is served by a thread
        with collector_off():  # no collector run may hide the bug
            client.close()
            assert wait_for(lambda: not conn_threads()), "the pooled connection was left open"
        assert held  # the pools were still referenced the whole time
