"""A bounded, one-consumer event channel between a run's reader thread and its caller.

Used only by ``engine.run(..., read_ahead=True)``: a reader thread drives the
run into it, for a consumer that is slow on purpose.  (By default the run is
driven by the consumer's own thread and needs no channel.)

Built on :class:`queue.SimpleQueue`, whose ``put`` and ``get`` are C code:
``put`` wakes a waiting consumer from C, and only the first ``put`` after the
consumer fell asleep pays for the wake-up.  A ``threading.Condition`` costs
a dozen Python-level calls per notify (measured: 86k notifies for 100k
tokens).  The consumer drains everything that arrived together in one go, so
a burst of tokens costs one wake-up.

**Bounded**, because the consumer may be slower than the model: a browser
that reads nothing while the model writes 60 MB would otherwise make the
queue hold all of it.  When ``max_items`` events wait, ``put`` blocks the
producer (the reader thread), the run stops reading the provider's socket, and
TCP pushes back on the provider.  The producer is woken by the consumer's
next drain (one ``Event.set`` per drain, not per item) or by ``cancel``;
once cancelled, ``put`` never blocks, so a cancelled run can always finish.
The time it waits is the consumer's, and the run's loop counts it as such
(``Wait.held``): the model's idle timer never spends it.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, List, Optional

from .. import _validation as validation

#: Events a channel holds before the producer waits: a few hundred kB of tokens
#: at most, and enough that a consumer draining in batches never starves it.
DEFAULT_MAX_ITEMS = 1024
_WAIT_SLICE_S = 0.5  # a blocked producer rechecks the queue this often even if no wake-up came

_CLOSED = object()  # put by close(): always the last item


class EventChannel:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS, cancel: Optional[threading.Event] = None) -> None:
        validation.count(max_items, "EventChannel max_items", minimum=1)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._max = max_items
        self._room = threading.Event()  # set by the consumer after a drain, or on cancel
        self._producer_waiting = False
        self._cancel = cancel
        self._stop_watch = _watch(cancel, self._room.set)
        self._closing = False
        self._done = False  # the close marker was taken: nothing more will come

    def put(self, item: Any) -> None:
        """Queue ``item``; waits while ``max_items`` are queued, unless the run is cancelled."""
        q = self._queue
        q.put(item)
        if q.qsize() >= self._max:
            self._wait_while_full()

    def _wait_while_full(self) -> None:
        q = self._queue
        cancel = self._cancel
        while q.qsize() >= self._max and not (cancel is not None and cancel.is_set()):
            self._room.clear()
            self._producer_waiting = True  # before the recheck: a drain after it will set _room
            if q.qsize() < self._max:
                break
            self._room.wait(_WAIT_SLICE_S)
        self._producer_waiting = False

    def close(self) -> None:
        """No more items will come; wakes the consumer.

        The marker goes in before ``closed`` can say so: a consumer that looked
        in between would otherwise count the last item (the run's ``done``) as
        the marker, and never take it.
        """
        if not self._closing:
            self._queue.put(_CLOSED)
            self._closing = True
            self._stop_watch()

    @property
    def closed(self) -> bool:
        """Closed and every item taken (the marker, queued before ``_closing`` is set, is all that is left)."""
        return self._done or (self._closing and self._queue.qsize() <= 1)

    @property
    def backlog(self) -> int:
        """Items waiting now (for tests and monitoring)."""
        return self._queue.qsize()

    def drain(self, timeout: Optional[float]) -> List[Any]:
        """Everything queued now; waits up to ``timeout`` for the first item.

        Returns ``[]`` on timeout, or when the channel is closed and empty.
        """
        if self._done:
            return []
        q = self._queue
        try:
            first = q.get(True, timeout) if timeout is None or timeout > 0 else q.get(False)
        except queue.Empty:
            return []
        items = [first]
        get = q.get_nowait
        for _ in range(q.qsize()):  # only this thread takes items: qsize() of them are there
            items.append(get())
        if self._producer_waiting:
            self._room.set()
        if items[-1] is _CLOSED:
            items.pop()
            self._done = True
        return items


def _watch(cancel: Optional[threading.Event], wake: Any) -> Any:
    """Wake a blocked producer on cancel; returns the remover (free with a CancelToken)."""
    add = getattr(cancel, "add_callback", None)
    if add is None:  # a plain Event is rechecked every _WAIT_SLICE_S
        return lambda: None
    return add(wake)
