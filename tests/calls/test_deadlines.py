"""The shared deadline watcher: fires, re-arms, holds, ends when idle; a streaming call starts no thread."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for

from streamengine._calls import deadlines
from streamengine._calls.strategies import StreamingCallStrategy
from streamengine._cancel import CancelToken
from streamengine._clients.scripted import ScriptedClient
from streamengine._engine.channel import EventChannel
from streamengine._errors import LlmCancelledError, LlmTimeoutError
from streamengine._messages import Chunk

pytestmark = pytest.mark.usefixtures("no_thread_leak")

GUARD = 5.0  # failure guard only
MESSAGES = [{"role": "user", "content": "hi"}]


def watcher_threads():
    return [t for t in threading.enumerate() if t.name == "streamengine-deadlines" and t.is_alive()]


def test_an_idle_deadline_that_passes_sets_the_token_and_says_which():
    token = CancelToken()
    with deadlines.watch(token, idle_s=0.1, cap_s=GUARD) as watched:
        assert token.wait(GUARD)
    assert watched.fired == deadlines.IDLE and watched.fired_at > 0


def test_a_moved_idle_deadline_re_arms_instead_of_firing():
    token = CancelToken()
    with deadlines.watch(token, idle_s=0.5, cap_s=1.0) as watched:
        watched.idle_deadline = time.monotonic() + 60  # what the run thread does on a meaningful chunk
        assert token.wait(GUARD)
    assert watched.fired == deadlines.CAP  # the idle deadline was looked at again, not fired


def test_a_token_the_caller_set_is_not_reported_as_a_timeout():
    token = CancelToken()
    with deadlines.watch(token, idle_s=0.05, cap_s=0.1) as watched:
        token.set()
        assert wait_for(lambda: time.monotonic() > watched.cap_deadline + 0.1, GUARD)  # both deadlines passed
        assert watched.fired is None


def test_held_stops_the_idle_clock_and_re_arms_it_with_the_time_held():
    token = CancelToken()
    with deadlines.watch(token, idle_s=0.1, cap_s=GUARD) as watched:
        with deadlines.held():
            assert not token.wait(0.4)  # four idle periods held by the consumer: no timeout
        assert token.wait(GUARD)  # the clock runs again
    assert watched.fired == deadlines.IDLE


def test_held_is_free_outside_a_watched_call():
    with deadlines.held():
        pass
    assert watcher_threads() == []


def test_one_thread_for_many_calls_ended_once_none_is_watched():
    tokens = [CancelToken() for _ in range(20)]
    entered = threading.Barrier(len(tokens) + 1)
    release = threading.Event()

    def call(token):
        with deadlines.watch(token, idle_s=GUARD, cap_s=GUARD):
            entered.wait(GUARD)
            release.wait(GUARD)

    callers = [threading.Thread(target=call, args=(t,)) for t in tokens]
    for caller in callers:
        caller.start()
    entered.wait(GUARD)
    assert len(watcher_threads()) == 1 and deadlines.watcher().alive
    release.set()
    for caller in callers:
        caller.join(GUARD)
    assert wait_for(lambda: not watcher_threads(), GUARD)
    assert not deadlines.watcher().alive and not any(t.is_set() for t in tokens)
    token = CancelToken()  # and it starts again for the next call
    with deadlines.watch(token, idle_s=0.05, cap_s=GUARD):
        assert token.wait(GUARD)


def test_a_streaming_call_reads_in_the_calling_thread_and_starts_no_thread():
    """The client passes its waits up: the call keeps its own deadlines, no watcher thread."""
    before = {t.ident for t in threading.enumerate()}
    seen = []

    def on_chunk(chunk):
        started = [t.name for t in threading.enumerate() if t.ident not in before]
        seen.append((threading.current_thread() is threading.main_thread(), started))

    StreamingCallStrategy(ScriptedClient([["a", "b"]]), idle_timeout=GUARD, completion_timeout=GUARD).call(
        MESSAGES, on_chunk=on_chunk)
    assert seen and all(in_caller and started == [] for in_caller, started in seen)


def test_a_client_that_blocks_in_its_reads_gets_the_watcher():
    class Blocking(ScriptedClient):
        def stream(self, messages, tools=None, options=None, cancel=None):
            yield Chunk(content="a")
            cancel.wait(GUARD)  # blocks: only the watcher's cancel ends it
            raise LlmCancelledError("cancelled")

    with pytest.raises(LlmTimeoutError, match="idle timeout"):
        StreamingCallStrategy(Blocking(), idle_timeout=0.1, completion_timeout=GUARD).call(MESSAGES)
    assert wait_for(lambda: not watcher_threads())


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
        response = strategy.call(MESSAGES, on_chunk=lambda chunk: channel.put(chunk.content))
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
    with pytest.raises(LlmTimeoutError, match="idle timeout.*after 1 chunks"):
        strategy.call(MESSAGES, on_chunk=lambda chunk: chunk.content and channel.put(chunk.content))
    consumer.join(GUARD)


def test_chunks_the_watcher_cut_short_are_not_fed_on():
    client = ScriptedClient([["a"] + [x for _ in range(300) for x in (0.01, Chunk())]])
    seen = []
    strategy = StreamingCallStrategy(client, idle_timeout=0.15, completion_timeout=GUARD)
    with pytest.raises(LlmTimeoutError) as info:
        strategy.call(MESSAGES, on_chunk=seen.append)
    assert info.value.chunks_received == 1
    assert len(seen) < 301  # the keep-alives stopped with the timeout


def test_calls_that_follow_each_other_closely_still_time_out():
    """A call ending (the watcher may be about to exit) and the next starting at once: the next still fires."""
    for _ in range(20):
        with deadlines.watch(CancelToken(), idle_s=GUARD, cap_s=GUARD):
            pass
        token = CancelToken()
        with deadlines.watch(token, idle_s=0.01, cap_s=GUARD) as watched:
            assert token.wait(GUARD)
        assert watched.fired == deadlines.IDLE
