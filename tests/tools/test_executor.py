"""ToolExecutor: concurrency, deadlines, stuck workers, cancel, shutdown, interpreter exit.

Every wait is on an Event or a condition with a generous guard timeout; no
assertion depends on wall-clock speed.  Short tool deadlines (0.1-0.2 s) are
the behaviour under test, not a speed budget.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

import pytest

from streamengine import CancelToken, ConfigError, ToolCall
from streamengine.tools import ToolContext, ToolExecutor, ToolResult, tool

GUARD_S = 10.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_thread_leaks():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + GUARD_S
    for thread in set(threading.enumerate()) - before:
        thread.join(max(0.0, deadline - time.monotonic()))
    leaked = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert leaked == []


@pytest.fixture
def releases():
    """Events that hold stuck tools; all are set at teardown so their threads can end."""
    events: List[threading.Event] = []

    def make() -> threading.Event:
        event = threading.Event()
        events.append(event)
        return event

    yield make
    for event in events:
        event.set()


@pytest.fixture
def make_executor():
    made: List[ToolExecutor] = []

    def make(**kwargs) -> ToolExecutor:
        executor = ToolExecutor(**kwargs)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.shutdown(wait=True, timeout=GUARD_S)


def wait_until(predicate: Callable[[], bool], guard_s: float = GUARD_S) -> bool:
    """Poll a condition that has no event of its own (thread counts); False at the guard."""
    end = time.monotonic() + guard_s
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


_ids = iter(range(1, 10_000))


def call(name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(f"call_{next(_ids)}", name, arguments)


def blocking_tool(release: threading.Event, started: Optional[threading.Event] = None, name: str = "stuck"):
    """A tool that ignores its cancel flag and returns only when the test releases it."""
    def body() -> str:
        if started is not None:
            started.set()
        release.wait(GUARD_S * 3)
        return "late"

    return tool(body, name=name)


# --------------------------------------------------------------------------- running


def test_runs_tools_concurrently(make_executor):
    barrier = threading.Barrier(3, timeout=GUARD_S)

    @tool
    def meet(n: int) -> str:
        barrier.wait()  # only returns when all three run at the same time
        return f"met {n}"

    executor = make_executor(max_workers=3)
    handles = [executor.submit(meet, call("meet", f'{{"n": {n}}}'), timeout=GUARD_S) for n in range(3)]
    results = [h.result() for h in handles]
    assert [r.text for r in results] == ["met 0", "met 1", "met 2"]
    assert all(r.ok and r.error is None for r in results)
    assert [r.call_id for r in results] == [h.call.id for h in handles]


def test_result_carries_timestamps_and_on_start_runs_first(make_executor):
    entered = []

    @tool
    def echo(text: str) -> str:
        entered.append(time.monotonic())
        return text

    hook_handles = []
    executor = make_executor()
    handle = executor.submit(echo, call("echo", '{"text": "hi"}'), timeout=GUARD_S, on_start=hook_handles.append)
    result = handle.result()
    assert result.ok and result.text == "hi" and result.name == "echo"
    assert hook_handles == [handle]
    assert handle.submitted_at <= handle.started_at <= entered[0] <= result.ended_at
    assert result.started_at == handle.started_at
    assert result.duration_s == pytest.approx(result.ended_at - result.started_at)
    assert handle.done() and not handle.running()


def test_idle_worker_is_reused(make_executor):
    @tool
    def noop() -> str:
        return "ok"

    executor = make_executor(max_workers=4)
    for _ in range(5):
        assert executor.submit(noop, call("noop"), timeout=GUARD_S).result().ok
        # the worker goes idle right after settling the result; wait for it before the next submit
        assert wait_until(lambda: len(executor._idle) == 1)
    assert executor.threads_alive() == 1


def test_context_is_passed_with_the_deadline(make_executor):
    seen: List[ToolContext] = []

    @tool
    def f(ctx: ToolContext) -> str:
        seen.append(ctx)
        return "ok"

    executor = make_executor()
    handle = executor.submit(f, call("f"), timeout=7)
    assert handle.result().ok
    assert seen[0].deadline == handle.deadline == handle.started_at + 7  # counted from the start, not submit
    assert seen[0].cancel_event is handle.cancel_event


def test_tool_exception_becomes_an_error_result(make_executor):
    @tool
    def boom(x: int) -> str:
        raise ValueError(f"bad input {x}")

    executor = make_executor()
    result = executor.submit(boom, call("boom", '{"x": 3}'), timeout=GUARD_S).result()
    assert not result.ok and result.text == ""
    assert result.error == "tool 'boom' failed: ValueError: bad input 3"
    # the worker survives the exception
    assert executor.submit(tool(lambda: "fine", name="fine"), call("fine"), timeout=GUARD_S).result().text == "fine"


def test_invalid_arguments_give_an_immediate_error_and_never_run(make_executor):
    ran = threading.Event()

    @tool
    def f(n: int) -> str:
        ran.set()
        return "ran"

    executor = make_executor()
    for arguments, expected in [
        ('{"n": "x"}', "argument 'n' must be integer"),
        ('{"m": 1}', "unknown argument 'm'"),
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
    ]:
        handle = executor.submit(f, call("f", arguments), timeout=GUARD_S)
        assert handle.done()
        result = handle.result(timeout=0)
        assert not result.ok and expected in result.error
        assert handle.started_at is None and not handle.cancel()
    assert executor.threads_alive() == 0  # nothing was even scheduled
    assert not ran.is_set()


def test_tool_timeout_wins_over_submit_timeout_and_bad_timeouts_are_config_errors(make_executor):
    @tool(timeout=3)
    def own() -> str:
        return ""

    @tool
    def none() -> str:
        return ""

    executor = make_executor()
    assert executor.submit(own, call("own"), timeout=100).timeout == 3.0
    assert executor.submit(none, call("none"), timeout=100).timeout == 100.0
    for bad in (None, 0, -1, float("nan"), float("inf"), "5"):
        with pytest.raises(ConfigError, match="timeout"):
            executor.submit(none, call("none"), timeout=bad)


# --------------------------------------------------------------------------- deadlines


def test_deadline_gives_the_timeout_error_and_sets_the_cancel_flag(make_executor):
    saw_cancel = threading.Event()

    @tool
    def slow(ctx: ToolContext) -> str:
        if ctx.cancel_event.wait(GUARD_S):
            saw_cancel.set()
        return "too late"

    executor = make_executor()
    handle = executor.submit(slow, call("slow"), timeout=0.2)
    result = handle.result()
    assert not result.ok and result.timed_out
    assert result.error == "tool 'slow' timed out after 0.2s"
    assert result.text == ""
    assert saw_cancel.wait(GUARD_S)
    assert wait_until(lambda: executor.stuck_workers() == 0)
    assert handle.result() is result  # the late "too late" was discarded


def test_late_result_is_discarded_even_if_nobody_waited(make_executor, releases):
    release = releases()
    started = threading.Event()
    executor = make_executor()
    handle = executor.submit(blocking_tool(release, started), call("stuck"), timeout=0.1)
    assert started.wait(GUARD_S)
    threading.Event().wait(max(0.0, handle.deadline - time.monotonic()) + 0.02)  # let the deadline pass
    release.set()
    assert wait_until(lambda: executor.stuck_workers() == 0 and len(executor._idle) == 1)
    result = handle.result()
    assert result.timed_out and result.error == "tool 'stuck' timed out after 0.1s"
    assert handle.cancel_event.is_set()


def test_result_with_a_shorter_timeout_gives_up_but_wait_does_not(make_executor, releases):
    release = releases()
    executor = make_executor()
    waiting = executor.submit(blocking_tool(release, name="a"), call("a"), timeout=GUARD_S)
    assert waiting.wait(0.01) is False and not waiting.done() and not waiting.cancel_event.is_set()
    result = waiting.result(timeout=0.01)
    assert result.timed_out and result.error.startswith("tool 'a' timed out after ")
    assert waiting.cancel_event.is_set() and waiting.done()


def test_done_fixes_a_timeout_once_the_deadline_passed(make_executor, releases):
    release = releases()
    executor = make_executor()
    handle = executor.submit(blocking_tool(release), call("stuck"), timeout=0.1)
    assert wait_until(handle.done)
    assert handle.cancel_event.is_set()
    assert handle.result(timeout=0).error == "tool 'stuck' timed out after 0.1s"


# --------------------------------------------------------------------------- stuck workers


def test_pool_exhaustion_is_an_immediate_error_then_recovers(make_executor, releases):
    release = releases()
    executor = make_executor(max_workers=2)
    stuck = [executor.submit(blocking_tool(release), call("stuck"), timeout=0.1) for _ in range(2)]
    assert all(h.result().timed_out for h in stuck)
    assert executor.stuck_workers() == 2

    ran = threading.Event()
    fresh = tool(lambda: ran.set() or "fresh", name="fresh")
    refused = executor.submit(fresh, call("fresh"), timeout=GUARD_S)
    assert refused.done()
    result = refused.result(timeout=0)
    assert not result.ok and result.error == (
        "tool pool exhausted: all 2 workers are stuck in tools that timed out or ignored a cancel; try again later")
    assert executor.threads_alive() == 2  # no extra thread was started for it

    release.set()  # the stuck functions return; their slots come back
    assert wait_until(lambda: executor.stuck_workers() == 0)
    assert executor.submit(fresh, call("fresh"), timeout=GUARD_S).result().text == "fresh"
    assert ran.is_set()


def test_exhaustion_is_detected_from_deadlines_without_result_calls(make_executor, releases):
    release = releases()
    executor = make_executor(max_workers=1)
    handle = executor.submit(blocking_tool(release), call("stuck"), timeout=0.1)
    assert wait_until(lambda: time.monotonic() > handle.deadline)
    refused = executor.submit(tool(lambda: "x", name="x"), call("x"), timeout=GUARD_S)
    assert "tool pool exhausted: all 1 workers" in refused.result(timeout=0).error
    assert handle.cancel_event.is_set()  # noticing the stuck worker raised its flag


def test_a_busy_but_not_stuck_pool_queues(make_executor, releases):
    release = releases()
    executor = make_executor(max_workers=1)
    first = executor.submit(blocking_tool(release, name="busy"), call("busy"), timeout=GUARD_S)
    second = executor.submit(tool(lambda: "second", name="second"), call("second"), timeout=GUARD_S)
    assert not second.done()
    release.set()
    assert first.result().text == "late" and second.result().text == "second"


def test_a_call_waiting_past_the_queue_timeout_never_runs(make_executor, releases):
    release = releases()
    ran = threading.Event()
    executor = make_executor(max_workers=1, queue_timeout=0.1)
    executor.submit(blocking_tool(release, name="busy"), call("busy"), timeout=GUARD_S)
    queued = executor.submit(tool(lambda: ran.set() or "x", name="queued"), call("queued"), timeout=GUARD_S)
    result = queued.result()
    assert result.error == ("tool 'queued' not started: the tool pool was busy for 0.1s (all 1 workers were in "
                            "use); try again later")
    assert queued.started_at is None and queued.state == "cancelled" and result.queue_wait_s >= 0.1
    release.set()
    assert executor.submit(tool(lambda: "after", name="after"), call("after"), timeout=GUARD_S).result().ok
    assert not ran.is_set()


# --------------------------------------------------------------------------- cancel


def test_cancel_of_a_queued_call_never_runs_it(make_executor, releases):
    release = releases()
    started = threading.Event()
    ran = threading.Event()
    executor = make_executor(max_workers=1)
    busy = executor.submit(blocking_tool(release, started, name="busy"), call("busy"), timeout=GUARD_S)
    assert started.wait(GUARD_S)
    queued = executor.submit(tool(lambda: ran.set() or "x", name="queued"), call("queued"), timeout=GUARD_S)
    assert queued.cancel() is True
    result = queued.result(timeout=0)
    assert not result.ok and result.error == "tool 'queued' cancelled before it started"
    assert queued.cancel() is False  # already settled
    release.set()
    assert busy.result().ok
    # FIFO: a call submitted after the cancelled one ran, so the cancelled one was skipped
    assert executor.submit(tool(lambda: "after", name="after"), call("after"), timeout=GUARD_S).result().ok
    assert not ran.is_set()


def test_cancel_of_a_running_call_sets_its_flag(make_executor):
    started = threading.Event()

    @tool
    def cooperative(ctx: ToolContext) -> str:
        started.set()
        ctx.cancel_event.wait(GUARD_S)
        return "stopped early" if ctx.cancelled else "finished"

    executor = make_executor()
    handle = executor.submit(cooperative, call("cooperative"), timeout=GUARD_S * 2)
    assert started.wait(GUARD_S)
    assert handle.running()
    assert handle.cancel() is False  # it was running: only the flag
    result = handle.result()
    assert result.ok and result.text == "stopped early"


@pytest.mark.parametrize("make_cancel", [CancelToken, threading.Event], ids=["CancelToken", "Event"])
def test_the_callers_cancel_event_reaches_queued_and_running_calls(make_executor, make_cancel, releases):
    cancel = make_cancel()
    started = threading.Event()
    ran = threading.Event()

    @tool
    def cooperative(ctx: ToolContext) -> str:
        started.set()
        ctx.cancel_event.wait(GUARD_S)
        return "stopped" if ctx.cancel_event.is_set() else "finished"

    executor = make_executor(max_workers=1)
    running = executor.submit(cooperative, call("cooperative"), timeout=GUARD_S * 2, cancel=cancel)
    assert started.wait(GUARD_S)
    queued = executor.submit(tool(lambda: ran.set() or "x", name="queued"), call("queued"), timeout=GUARD_S * 2,
                             cancel=cancel)
    cancel.set()
    assert running.result().text == "stopped"
    assert queued.result().error == "tool 'queued' cancelled before it started"
    assert not ran.is_set()
    # a cancel that is already set refuses at once
    late = executor.submit(tool(lambda: ran.set() or "x", name="late"), call("late"), timeout=GUARD_S, cancel=cancel)
    assert late.done() and "cancelled" in late.result(timeout=0).error
    assert not ran.is_set()


def test_cancel_token_callbacks_are_removed_when_calls_end(make_executor):
    token = CancelToken()
    executor = make_executor()
    for _ in range(3):
        executor.submit(tool(lambda: "x", name="x"), call("x"), timeout=GUARD_S, cancel=token).result()
    assert token._callbacks == []


# --------------------------------------------------------------------------- shutdown and threads


def test_shutdown_cancels_queued_flags_running_and_skips_stuck(releases):
    release_stuck, release_blocker = releases(), releases()
    started = threading.Event()
    executor = ToolExecutor(max_workers=3)
    stuck = executor.submit(blocking_tool(release_stuck), call("stuck"), timeout=0.1)
    assert stuck.result().timed_out

    @tool
    def cooperative(ctx: ToolContext) -> str:
        started.set()
        ctx.cancel_event.wait(GUARD_S)
        return "stopped"

    running = executor.submit(cooperative, call("cooperative"), timeout=GUARD_S * 3)
    assert started.wait(GUARD_S)
    blocker = executor.submit(blocking_tool(release_blocker, name="blocker"), call("blocker"), timeout=GUARD_S * 3)
    queued = executor.submit(tool(lambda: "never", name="queued"), call("queued"), timeout=GUARD_S * 3)

    finished = threading.Event()
    shutter = threading.Thread(target=lambda: (executor.shutdown(wait=True, timeout=GUARD_S * 3), finished.set()))
    shutter.start()
    assert running.result().text == "stopped"  # its cancel flag was set
    assert queued.result(timeout=0).error == "tool 'queued' cancelled: the tool executor shut down before it started"
    assert blocker.cancel_event.is_set()
    assert not finished.is_set()  # it waits for the running, not-stuck blocker (up to its timeout)...
    release_blocker.set()
    assert finished.wait(GUARD_S)  # ...but not for the stuck tool, still blocked
    assert blocker.result().text == "late"
    assert executor.threads_alive() == 1
    refused = executor.submit(tool(lambda: "x", name="x"), call("x"), timeout=GUARD_S)
    assert "shut down" in refused.result(timeout=0).error
    release_stuck.set()
    shutter.join(GUARD_S)
    assert wait_until(lambda: executor.threads_alive() == 0)


def test_shutdown_returns_while_a_stuck_tool_still_runs(releases):
    release = releases()
    executor = ToolExecutor(max_workers=2)
    stuck = executor.submit(blocking_tool(release), call("stuck"), timeout=0.1)
    assert stuck.result().timed_out
    finished = threading.Event()
    shutter = threading.Thread(target=lambda: (executor.shutdown(wait=True, timeout=GUARD_S * 3), finished.set()))
    shutter.start()
    assert finished.wait(GUARD_S)  # returned although the stuck thread is still alive
    assert executor.threads_alive() == 1
    release.set()
    shutter.join(GUARD_S)
    assert wait_until(lambda: executor.threads_alive() == 0)


def test_idle_workers_exit(make_executor):
    barrier = threading.Barrier(3, timeout=GUARD_S)
    executor = make_executor(max_workers=3, idle_exit_s=0.05)
    meet = tool(lambda: str(barrier.wait()), name="meet")
    handles = [executor.submit(meet, call("meet"), timeout=GUARD_S) for _ in range(3)]
    assert all(h.result().ok for h in handles)
    assert executor.threads_alive() <= 3
    assert wait_until(lambda: executor.threads_alive() == 0)
    # the pool grows again on demand
    assert executor.submit(tool(lambda: "again", name="again"), call("again"),
                           timeout=GUARD_S).result().text == "again"


def test_context_manager_shuts_down():
    with ToolExecutor() as executor:
        assert executor.submit(tool(lambda: "x", name="x"), call("x"), timeout=GUARD_S).result().ok
    assert wait_until(lambda: executor.threads_alive() == 0)


def test_invalid_constructor_arguments():
    with pytest.raises(ConfigError, match="max_workers"):
        ToolExecutor(max_workers=0)
    with pytest.raises(ConfigError, match="idle_exit_s"):
        ToolExecutor(idle_exit_s=0)


_EXIT_SCRIPT = textwrap.dedent("""
    import threading
    from streamengine import ToolCall
    from streamengine.tools import ToolExecutor, tool

    @tool
    def hang() -> str:
        threading.Event().wait()  # never returns and ignores its cancel flag
        return ""

    started = threading.Event()
    executor = ToolExecutor()
    timed_out = executor.submit(hang, ToolCall("c1", "hang"), 0.05)
    print(timed_out.result().error, flush=True)
    running = executor.submit(hang, ToolCall("c2", "hang"), 3600, on_start=lambda h: started.set())
    started.wait()
    if {shutdown}:
        executor.shutdown(wait=True, timeout=0.2)  # the running tool ignores its flag: bounded wait
    print("exiting", flush=True)
""")


@pytest.mark.parametrize("shutdown", [False, True], ids=["no-shutdown", "shutdown"])
def test_a_stuck_tool_does_not_block_interpreter_exit(shutdown):
    script = _EXIT_SCRIPT.format(shutdown=shutdown)
    # a hang here is the failure; the guard turns it into a clear error
    done = subprocess.run([sys.executable, "-c", script], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["tool 'hang' timed out after 0.05s", "exiting"]


def test_result_error_fields_for_timeouts_are_consistent(make_executor, releases):
    release = releases()
    started = threading.Event()
    executor = make_executor()
    handle = executor.submit(blocking_tool(release, started), call("stuck"), timeout=0.1)
    assert started.wait(GUARD_S)
    result = handle.result()
    assert isinstance(result, ToolResult)
    assert result.call_id == handle.call.id and result.name == "stuck"
    assert result.started_at == handle.started_at and result.ended_at >= handle.deadline
    assert result.duration_s == pytest.approx(result.ended_at - result.started_at)


def test_shutdown_stops_waiting_when_a_running_tool_passes_its_deadline(releases):
    release = releases()
    started = threading.Event()
    executor = ToolExecutor()
    handle = executor.submit(blocking_tool(release, started), call("stuck"), timeout=0.2)
    assert started.wait(GUARD_S)
    finished = threading.Event()
    # not stuck yet when shutdown begins; it becomes stuck during the join, which then gives up on it
    shutter = threading.Thread(target=lambda: (executor.shutdown(wait=True, timeout=GUARD_S * 3), finished.set()))
    shutter.start()
    assert finished.wait(GUARD_S)
    assert handle.result(timeout=0).error == "tool 'stuck' timed out after 0.2s"
    release.set()
    shutter.join(GUARD_S)
    assert wait_until(lambda: executor.threads_alive() == 0)


def test_done_callbacks_run_once_for_results_timeouts_and_settled_handles(make_executor, releases):
    release = releases()
    seen: List[str] = []
    ok_done = threading.Event()
    executor = make_executor()

    handle = executor.submit(tool(lambda: "fine", name="fine"), call("fine"), timeout=GUARD_S)
    handle.add_done_callback(lambda h: (seen.append(h.result(timeout=0).text), ok_done.set()))
    assert ok_done.wait(GUARD_S)

    stuck = executor.submit(blocking_tool(release), call("stuck"), timeout=0.1)
    stuck.add_done_callback(lambda h: seen.append(h.result(timeout=0).error))
    stuck.add_done_callback(lambda h: 1 / 0)  # logged, does not break the others
    timed_out = stuck.result()  # may be called while the call is still queued: it wakes when the call starts
    assert timed_out.timed_out and timed_out.started_at is not None
    # fixed at start + timeout, never at the queue limit (10 s by default) the wait began with
    assert stuck.deadline <= timed_out.ended_at < stuck.queue_limit

    invalid = executor.submit(tool(lambda n: "", name="needs_n"), call("needs_n"), timeout=GUARD_S)
    invalid.add_done_callback(lambda h: seen.append("invalid: " + h.result(timeout=0).error))
    release.set()
    assert wait_until(lambda: executor.stuck_workers() == 0)
    assert seen == ["fine", "tool 'stuck' timed out after 0.1s",
                    "invalid: invalid arguments for tool 'needs_n': missing required argument 'n' (any value)"]


def test_result_called_while_queued_returns_at_the_deadline_counted_from_the_start(make_executor, releases):
    """A waiter that slept towards the queue limit wakes when the call starts, and gives up at its deadline."""
    release_busy, release_queued, busy_started = releases(), releases(), threading.Event()
    executor = make_executor(max_workers=1, queue_timeout=GUARD_S)
    executor.submit(blocking_tool(release_busy, busy_started, name="busy"), call("busy"), timeout=GUARD_S)
    assert busy_started.wait(GUARD_S)
    queued = executor.submit(blocking_tool(release_queued, name="queued"), call("queued"), timeout=0.1)
    assert queued.state == "pending"
    freeing = threading.Timer(0.2, release_busy.set)  # the worker frees up while result() already waits
    freeing.start()
    result = queued.result()
    freeing.join()
    assert result.timed_out and result.queue_wait_s > 0 and result.started_at is not None
    assert queued.deadline <= result.ended_at < queued.queue_limit  # not the queue limit it began waiting for
