"""The run log in this process's memory: resume on the same worker only.

One lock guards every run (each operation is a few dict and deque steps);
blocked readers wait on their run's Condition, never holding the lock.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional

from ._contract import (
    LOST,
    RUNNING,
    Appended,
    ApprovalAnswer,
    Event,
    Frame,
    Lease,
    RunExistsError,
    RunFencedError,
    RunLog,
    RunLogError,
    RunNotFound,
    RunStatus,
    SavedCheckpoint,
    Waker,
    event_size,
    over_caps,
    parse_meta,
    plan_trim,
    too_many_approvals,
)

_SWEEP_EVERY_S = 1.0


class _Run:
    """One run's state; touched only under the log's lock."""

    __slots__ = (
        "approvals",
        "checkpoint",
        "expires_at",
        "frames",
        "last_seq",
        "lease_s",
        "lease_until",
        "meta_json",
        "owner",
        "read_at",
        "retain_s",
        "size",
        "sizes",
        "state",
        "stop",
        "token",
    )

    def __init__(self, lease: Lease, owner: str, meta_json: str, now: float) -> None:
        self.owner = owner
        self.meta_json = meta_json
        self.state = RUNNING
        self.token = lease.token
        self.lease_s = lease.lease_s
        self.retain_s = lease.retain_s
        self.frames: Deque[Frame] = deque()
        self.sizes: Deque[int] = deque()
        self.size = 0
        self.last_seq = 0
        self.stop = False
        self.approvals: Dict[str, ApprovalAnswer] = {}
        self.read_at: Optional[float] = None
        self.checkpoint: Optional[SavedCheckpoint] = None
        self.lease_until = self.expires_at = 0.0
        self.extend(now)

    @property
    def first_seq(self) -> int:
        return self.frames[0].seq if self.frames else self.last_seq + 1

    def extend(self, now: float) -> None:
        """A live producer: its lease from now, and the run kept a retention past that."""
        self.lease_until = now + self.lease_s
        self.expires_at = self.lease_until + self.retain_s


class MemoryRunLog(RunLog):
    """A :class:`RunLog` in this process's memory (threads only; a restart loses it).

    The clock is ``time.monotonic()``.  Expired runs are dropped on access
    and by a sweep at most once a second on ``create``.
    """

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        self._lock = threading.Lock()
        self._runs: Dict[str, _Run] = {}
        self._waker = Waker()
        self._next_sweep = 0.0

    def _live(self, run_id: str, now: float) -> Optional[_Run]:
        run = self._runs.get(run_id)
        if run is not None and run.expires_at <= now:
            del self._runs[run_id]
            return None
        return run

    def _owned(self, run_id: str, owner: str, now: float) -> _Run:
        run = self._live(run_id, now)
        if run is None or run.owner != owner:
            raise RunNotFound(run_id)
        return run

    def _leased(self, lease: Lease, now: float, doing: str) -> _Run:
        run = self._live(lease.run_id, now)
        if run is None or run.token != lease.token or run.state != RUNNING:
            raise RunFencedError(lease.run_id, doing)
        return run

    def _sweep(self, now: float) -> None:
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_EVERY_S
            for run_id in [run_id for run_id, run in self._runs.items() if run.expires_at <= now]:
                del self._runs[run_id]

    def _push(self, run: _Run, events: List[Event], terminal: bool) -> int:
        for index, (name, data) in enumerate(events, 1):
            run.last_seq += 1
            run.frames.append(Frame(run.last_seq, name, data, terminal and index == len(events)))
            run.sizes.append(event_size(name, data))
            run.size += run.sizes[-1]
        if over_caps(run.first_seq, run.last_seq, run.size, self.limits):
            first, freed = plan_trim(((frame.seq, size) for frame, size in zip(run.frames, run.sizes)),
                                     run.first_seq, run.last_seq, run.size, self.limits)
            while run.frames and run.frames[0].seq < first:
                run.frames.popleft()
                run.sizes.popleft()
            run.size -= freed
        return run.last_seq

    def _end(self, run: _Run, event: Event, state: str, now: float) -> int:
        seq = self._push(run, [event], terminal=True)
        run.state = state
        run.expires_at = now + run.retain_s
        return seq

    def close(self) -> None:
        """Nothing to release: the runs go with the object."""

    # -- RunLog ----------------------------------------------------------------------------

    def _do_create(self, lease: Lease, owner: str, meta_json: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            if self._live(lease.run_id, now) is not None:
                raise RunExistsError(f"run {lease.run_id!r} already exists; make a fresh id with new_run_id()")
            self._runs[lease.run_id] = _Run(lease, owner, meta_json, now)

    def _do_append(self, lease: Lease, events: List[Event]) -> Appended:
        now = time.monotonic()
        with self._lock:
            run = self._leased(lease, now, "append to")
            run.extend(now)
            appended = Appended(self._push(run, events, terminal=False), run.stop)
        self._waker.wake(lease.run_id)
        return appended

    def _do_renew(self, lease: Lease) -> None:
        now = time.monotonic()
        with self._lock:
            self._leased(lease, now, "renew the lease of").extend(now)

    def _do_finish(self, lease: Lease, terminal: Event, state: str) -> int:
        now = time.monotonic()
        with self._lock:
            seq = self._end(self._leased(lease, now, "finish"), terminal, state, now)
        self._waker.wake(lease.run_id)
        return seq

    def _do_stop_requested(self, lease: Lease) -> bool:
        with self._lock:
            return self._leased(lease, time.monotonic(), "poll the stop flag of").stop

    def _do_approval_answer(self, lease: Lease, call_id: str) -> Optional[ApprovalAnswer]:
        with self._lock:
            return self._leased(lease, time.monotonic(), "read an approval of").approvals.get(call_id)

    def _do_read(self, run_id: str, owner: str, after_seq: int, timeout_s: float, limit: int) -> List[Frame]:
        deadline = time.monotonic() + timeout_s
        with self._waker.watching(run_id) as waiters:
            while True:
                seen = waiters.version
                now = time.monotonic()
                with self._lock:
                    run = self._owned(run_id, owner, now)
                    if run.last_seq > after_seq:
                        start = max(0, after_seq + 1 - run.first_seq)
                        return [run.frames[index] for index in range(start, min(len(run.frames), start + limit))]
                    if run.state != RUNNING or now >= deadline:
                        return []
                waiters.wait(seen, deadline - now)

    def _do_status(self, run_id: str, owner: str) -> RunStatus:
        now = time.monotonic()
        with self._lock:
            run = self._owned(run_id, owner, now)
            return RunStatus(run_id, run.state, run.first_seq, run.last_seq, parse_meta(run.meta_json),
                             run.state == RUNNING and now >= run.lease_until, run.stop,
                             None if run.state == RUNNING else run.frames[-1],
                             None if run.read_at is None else max(0.0, now - run.read_at))

    def _do_close_lost(self, run_id: str, event: Event) -> bool:
        now = time.monotonic()
        with self._lock:
            run = self._live(run_id, now)
            if run is None:
                raise RunNotFound(run_id)
            if run.state != RUNNING or now < run.lease_until:
                return False
            self._end(run, event, LOST, now)
        self._waker.wake(run_id)
        return True

    def _do_take_over(self, run_id: str, token: str) -> Optional[Lease]:
        now = time.monotonic()
        with self._lock:
            run = self._live(run_id, now)
            if run is None:
                raise RunNotFound(run_id)
            if run.state != RUNNING or now < run.lease_until:
                return None
            run.token = token
            run.extend(now)
            return Lease(run_id, token, run.lease_s, run.retain_s)

    def _do_request_stop(self, run_id: str, owner: str) -> None:
        with self._lock:
            self._owned(run_id, owner, time.monotonic()).stop = True

    def _do_mark_read(self, run_id: str, owner: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._owned(run_id, owner, now).read_at = now

    def _do_answer_approval(self, run_id: str, owner: str, answer: ApprovalAnswer) -> ApprovalAnswer:
        with self._lock:
            approvals = self._owned(run_id, owner, time.monotonic()).approvals
            if answer.call_id not in approvals:
                if len(approvals) >= self.limits.max_approvals:
                    raise RunLogError(too_many_approvals(run_id, self.limits.max_approvals))
                approvals[answer.call_id] = answer
            return approvals[answer.call_id]

    def _do_save_checkpoint(self, lease: Lease, after_seq: int, data: str) -> bool:
        with self._lock:
            self._leased(lease, time.monotonic(), "save a checkpoint of").checkpoint = SavedCheckpoint(after_seq, data)
        return True

    def _do_checkpoint(self, run_id: str) -> Optional[SavedCheckpoint]:
        with self._lock:
            run = self._live(run_id, time.monotonic())
            return run.checkpoint if run is not None else None
