"""ToolExecutor lifecycle and sharing: start-relative deadlines, queue limits, owners served in turn.

Waits are on events; the short deadlines and queue limits are the behaviour
under test, not speed budgets.
"""
from __future__ import annotations

import threading
from typing import List, Optional

import pytest

from streamengine import ToolCall
from streamengine.tools import ToolExecutor, tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

GUARD_S = 10.0
_ids = iter(range(1, 10_000))


def call(name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(f"call_{next(_ids)}", name, arguments)


@pytest.fixture
def gate():
    """An event that holds tools back; set at teardown so every thread can end."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make_executor():
    made: List[ToolExecutor] = []

    def make(**kwargs) -> ToolExecutor:
        made.append(ToolExecutor(**kwargs))
        return made[-1]

    yield make
    for executor in made:
        executor.shutdown(wait=True, timeout=GUARD_S)


def holding(gate: threading.Event, name: str, started: Optional[threading.Event] = None):
    def body() -> str:
        if started is not None:
            started.set()
        gate.wait(GUARD_S * 3)
        return name

    return tool(body, name=name)


def test_on_start_fires_when_the_function_is_entered_and_the_deadline_counts_from_then(make_executor, gate):
    executor = make_executor(max_workers=1)
    busy_started = threading.Event()
    busy = executor.submit(holding(gate, "busy", busy_started), call("busy"), timeout=GUARD_S)
    assert busy_started.wait(GUARD_S)
    entered: List[float] = []
    hooked: List[float] = []

    @tool
    def quick() -> str:
        import time
        entered.append(time.monotonic())
        return "quick"

    queued = executor.submit(quick, call("quick"), timeout=0.2,
                             on_start=lambda handle: hooked.append(handle.started_at))
    assert not queued.wait(0.3)  # queued longer than its own timeout: not timed out, it has not started
    assert hooked == [] and queued.state == "pending" and queued.started_at is None
    assert queued.next_limit == queued.queue_limit < queued.deadline  # before the start: wake at the queue limit
    gate.set()
    result = queued.result()
    assert result.ok and result.text == "quick" and busy.result().ok
    assert hooked == [queued.started_at] and queued.started_at <= entered[0]
    assert queued.deadline == queued.started_at + 0.2 == queued.next_limit
    assert result.queue_wait_s == queued.started_at - queued.submitted_at >= 0.3


def test_owners_are_served_in_turn_fifo_within_one(make_executor, gate):
    executor = make_executor(max_workers=1)
    started = threading.Event()
    executor.submit(holding(gate, "blocker", started), call("blocker"), timeout=GUARD_S, owner="x")
    assert started.wait(GUARD_S)
    order: List[str] = []

    def record(label: str):
        return tool(lambda: order.append(label) or label, name=label.replace(":", "_"))

    submitted = [("a", "a:1"), ("a", "a:2"), ("a", "a:3"), ("b", "b:1"), ("b", "b:2")]
    handles = [executor.submit(record(label), call(label.replace(":", "_")), timeout=GUARD_S, owner=owner)
               for owner, label in submitted]
    gate.set()
    assert all(h.result().ok for h in handles)
    assert order == ["a:1", "b:1", "a:2", "b:2", "a:3"]


def test_one_owners_stuck_tools_do_not_starve_another_owner(make_executor, gate):
    executor = make_executor(max_workers=4, max_per_owner=2)
    started = [threading.Event(), threading.Event()]
    stuck = [executor.submit(holding(gate, f"stuck{i}", started[i]), call(f"stuck{i}"), timeout=GUARD_S, owner="a")
             for i in range(2)]
    assert all(e.wait(GUARD_S) for e in started)
    third = executor.submit(tool(lambda: "third", name="third"), call("third"), timeout=GUARD_S, owner="a")
    other = executor.submit(tool(lambda: "other", name="other"), call("other"), timeout=GUARD_S, owner="b")
    assert other.result().text == "other"  # b runs at once while a holds its two workers
    assert third.state == "pending" and not third.done()  # a is at its limit though two workers are free
    gate.set()
    assert third.result().text == "third" and all(h.result().ok for h in stuck)


def test_an_owner_at_its_limit_is_refused_as_busy_after_the_queue_timeout(make_executor, gate):
    executor = make_executor(max_workers=4, max_per_owner=1, queue_timeout=0.1)
    started = threading.Event()
    executor.submit(holding(gate, "first", started), call("first"), timeout=GUARD_S, owner="run-1")
    assert started.wait(GUARD_S)
    second = executor.submit(tool(lambda: "no", name="second"), call("second"), timeout=GUARD_S, owner="run-1")
    result = second.result()
    assert result.error == ("tool 'second' not started: the tool pool was busy for 0.1s (its run already held "
                            "its limit of 1 workers); try again later")
    assert not result.ok and not result.timed_out and result.queue_wait_s >= 0.1


def test_invalid_sharing_options_are_config_errors():
    from streamengine import ConfigError

    with pytest.raises(ConfigError, match="queue_timeout must be a number of seconds > 0, got 0"):
        ToolExecutor(queue_timeout=0)
    with pytest.raises(ConfigError, match=r"max_per_owner must be an integer >= 1, got 1\.5"):
        ToolExecutor(max_per_owner=1.5)
    with pytest.raises(ConfigError, match=r"remote must be a concurrent\.futures\.Executor, got str"):
        ToolExecutor(remote="dask")
