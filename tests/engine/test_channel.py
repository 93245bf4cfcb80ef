"""EventChannel: bounded (the producer waits), released by a drain or a cancel, flush hint for batching."""
from __future__ import annotations

import threading

import pytest
from conftest import wait_for

from streamengine import CancelToken
from streamengine._engine.run import EventChannel

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def producer(channel: EventChannel, count: int, done: threading.Event, progress: list) -> threading.Thread:
    def run():
        for i in range(count):
            channel.put(i)
            progress.append(i)
        done.set()

    thread = threading.Thread(target=run, name="test-producer")
    thread.start()
    return thread


def test_a_full_channel_blocks_the_producer_until_the_consumer_drains():
    channel = EventChannel(max_items=4)
    done, progress = threading.Event(), []
    thread = producer(channel, 10, done, progress)
    assert wait_for(lambda: channel.backlog == 4)  # the 4th put is queued and waits for room
    assert not done.wait(0.3) and len(progress) == 3 and channel.backlog == 4  # stuck there, not slow
    got = []
    while len(got) < 10:
        got += channel.drain(5)
    thread.join(5)
    assert got == list(range(10)) and done.is_set()


def test_a_cancel_releases_a_blocked_producer_and_later_puts_never_block():
    token = CancelToken()
    channel = EventChannel(max_items=2, cancel=token)
    done, progress = threading.Event(), []
    thread = producer(channel, 50, done, progress)
    assert not done.wait(0.2)
    token.set()
    assert done.wait(5)
    thread.join(5)
    assert channel.backlog == 50


def test_close_marks_the_end_and_drain_returns_everything_once():
    channel = EventChannel()
    for i in range(3):
        channel.put(i)
    channel.close()
    assert channel.drain(1) == [0, 1, 2] and channel.closed and channel.drain(1) == []


def test_a_channel_never_reads_as_closed_while_its_last_item_is_untaken():
    """``closed`` looked at while ``close()`` runs (another thread) must not hide the last item."""
    channel = EventChannel()
    seen_while_closing = []

    class Watched(type(channel._queue)):
        def put(self, item, *args):
            seen_while_closing.append(channel.closed)  # the consumer looks now, between close()'s steps
            super().put(item, *args)

    channel._queue = Watched()
    channel.put("done")
    channel.close()
    assert seen_while_closing == [False, False]
    assert channel.drain(1) == ["done"] and channel.closed


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_items_is_checked(bad):
    with pytest.raises(ValueError, match="max_items"):
        EventChannel(max_items=bad)
