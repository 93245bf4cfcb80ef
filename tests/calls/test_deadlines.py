"""A call's deadlines are kept by its waits, whatever the client: one that blocks in its reads is read on a worker."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for

from streamengine import (
    CancelToken,
    Chunk,
    DoneEvent,
    EngineConfig,
    LlmCancelledError,
    LlmTimeoutError,
    ScriptedClient,
    StreamingEngine,
    TokenEvent,
    ToolResultEvent,
)
from streamengine._calls.strategies import StreamingCallStrategy
from streamengine._engine.run import EventChannel
from streamengine._wait import drive
from streamengine.tools import tool

pytestmark = pytest.mark.usefixtures("no_thread_leak")

GUARD = 5.0  # failure guard only
MESSAGES = [{"role": "user", "content": "hi"}]


def stream_workers():
    return [t for t in threading.enumerate() if t.name.startswith("streamengine-stream") and t.is_alive()]


class Blocking(ScriptedClient):
    """A client of your own whose ``stream()`` blocks in its reads (it honours ``cancel``); one script a call."""

    def __init__(self, *script, then=()):
        super().__init__()
        self.scripts = [script, *then]

    def stream(self, messages, tools=None, options=None, cancel=None):
        for item in self.scripts.pop(0):
            if isinstance(item, float):
                if cancel.wait(item):  # a blocked read that the cancel ends
                    raise LlmCancelledError("cancelled")
            else:
                yield item


def test_a_streaming_call_reads_in_the_calling_thread_and_starts_no_thread():
    """The client passes its waits up: the call keeps its own deadlines, no watcher thread."""
    before = {t.ident for t in threading.enumerate()}
    seen = []

    def on_chunk(chunk):
        started = [t.name for t in threading.enumerate() if t.ident not in before]
        seen.append((threading.current_thread() is threading.main_thread(), started))

    drive(StreamingCallStrategy(ScriptedClient([["a", "b"]]), idle_timeout=GUARD, completion_timeout=GUARD).stream_call(
        MESSAGES, on_chunk=on_chunk))
    assert seen and all(in_caller and started == [] for in_caller, started in seen)


def test_a_client_that_blocks_in_its_reads_times_out_and_its_worker_ends():
    client = Blocking(Chunk(content="a"), GUARD)
    started = time.monotonic()
    with pytest.raises(LlmTimeoutError, match="idle timeout") as info:
        drive(StreamingCallStrategy(client, idle_timeout=0.1, completion_timeout=GUARD).stream_call(MESSAGES))
    assert info.value.chunks_received == 1 and time.monotonic() - started < 1.0
    assert stream_workers() == []  # joined when the call ended: the cancel unblocked its read


def test_a_blocking_client_is_read_on_a_worker_and_cancelled_by_the_caller():
    cancel = CancelToken()
    threading.Timer(0.1, cancel.set).start()
    seen = []
    with pytest.raises(LlmCancelledError):
        drive(StreamingCallStrategy(Blocking(Chunk(content="a"), GUARD), idle_timeout=GUARD,
                                    completion_timeout=GUARD).stream_call(MESSAGES, cancel=cancel,
                                                                          on_chunk=seen.append))
    assert [c.content for c in seen] == ["a"] and stream_workers() == []


def test_a_blocking_clients_run_tells_tool_results_while_its_read_blocks():
    """The run's loop waits on the worker's hand-over: a tool's result is not held back until the next chunk."""

    @tool
    def quick() -> str:
        """Answers at once."""
        return "quick answer"

    client = Blocking(Chunk(content='<tool name="quick">{}</tool>'), 1.0,
                      Chunk(content=" after", is_completed=True, finish_reason="stop"),
                      then=[(Chunk(content="done", is_completed=True, finish_reason="stop"),)])
    with StreamingEngine(client, [quick], EngineConfig(models=["m"], idle_timeout=GUARD)) as engine:
        timed = [(time.monotonic(), e) for e in engine.run(MESSAGES)]
    told = [at for at, e in timed if isinstance(e, ToolResultEvent)]
    after = [at for at, e in timed if isinstance(e, TokenEvent) and e.text == " after"]
    assert told and after and after[0] - told[0] > 0.5  # told during the second-long blocked read
    assert isinstance(timed[-1][1], DoneEvent) and timed[-1][1].result.answer == "done"


def test_a_slow_consumer_does_not_use_up_a_blocking_clients_idle_time():
    client = Blocking(*[Chunk(content=c) for c in "abc"], Chunk(content="d", is_completed=True, finish_reason="stop"))
    texts = []
    with StreamingEngine(client, [], EngineConfig(models=["m"], idle_timeout=0.2)) as engine:
        for event in engine.run(MESSAGES):
            if isinstance(event, TokenEvent):
                texts.append(event.text)
                time.sleep(0.3)  # the consumer holds the thread longer than the idle timeout, each time
    assert texts == ["a", "b", "c", "d"] and event.result.error is None


def test_a_consumer_that_holds_the_run_back_does_not_fire_the_idle_timeout():
    """Backpressure: the run waits in a full channel for longer than the idle timeout, then finishes."""
    channel = EventChannel(max_items=1)
    finished = threading.Event()
    drained = []

    def slow_consumer():
        threading.Event().wait(0.6)  # reads nothing for three idle periods (the slowness under test)
        while not (finished.is_set() and not channel.backlog):
            drained.extend(channel.drain(0.05))

    consumer = threading.Thread(target=slow_consumer)
    consumer.start()
    strategy = StreamingCallStrategy(ScriptedClient([["a", "b", "c"]]), idle_timeout=0.2, completion_timeout=GUARD)
    try:
        response = drive(strategy.stream_call(MESSAGES, on_chunk=lambda chunk: channel.put(chunk.content)))
    finally:
        finished.set()
        consumer.join(GUARD)
    assert response.content == "abc"
    assert drained[:3] == ["a", "b", "c"]


def test_the_idle_timer_still_fires_after_a_hold_when_the_model_then_goes_silent():
    channel = EventChannel(max_items=2)
    channel.put("occupied")  # one short of full: the first chunk's event fills it and waits for the consumer

    def consume_later():
        threading.Event().wait(0.3)
        channel.drain(0)

    consumer = threading.Thread(target=consume_later)
    consumer.start()
    strategy = StreamingCallStrategy(ScriptedClient([["a", ScriptedClient.STALL]]), idle_timeout=0.2,
                                     completion_timeout=GUARD)
    with pytest.raises(LlmTimeoutError, match=r"idle timeout.*after 1 chunks"):
        drive(strategy.stream_call(MESSAGES, on_chunk=lambda chunk: chunk.content and channel.put(chunk.content)))
    consumer.join(GUARD)


def test_chunks_a_timeout_cut_short_are_not_fed_on():
    client = ScriptedClient([["a"] + [x for _ in range(300) for x in (0.01, Chunk())]])
    seen = []
    strategy = StreamingCallStrategy(client, idle_timeout=0.15, completion_timeout=GUARD)
    with pytest.raises(LlmTimeoutError) as info:
        drive(strategy.stream_call(MESSAGES, on_chunk=seen.append))
    assert info.value.chunks_received == 1
    assert len(seen) < 301  # the keep-alives stopped with the timeout


def test_a_blocking_client_still_reading_after_its_answer_is_stopped_not_waited_for():
    client = Blocking(Chunk(content="all", is_completed=True, finish_reason="stop"), GUARD)  # then blocks reading on
    started = time.monotonic()
    response = drive(StreamingCallStrategy(client, idle_timeout=GUARD, completion_timeout=GUARD).stream_call(MESSAGES))
    assert response.content == "all" and time.monotonic() - started < 1.0
    assert wait_for(lambda: not stream_workers(), GUARD)
