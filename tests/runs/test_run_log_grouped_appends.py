"""Appends of many runs at once: each run stays contiguous and in order; Redis writes them in shared round trips."""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, List

import pytest
from run_log_kinds import LogMaker, logs  # noqa: F401 - a fixture

from streamengine.runs import Frame, RunFencedError, new_run_id

OWNER = "alice"
RUNS = 12
APPENDS = 40


def _append_concurrently(log: Any, leases: List[Any]) -> Dict[str, List[int]]:
    """Every run appended APPENDS times from a thread of its own, all starting together; the seqs each got."""
    got: Dict[str, List[int]] = {}
    start = threading.Barrier(len(leases))

    def produce(lease: Any) -> None:
        start.wait()
        got[lease.run_id] = [log.append(lease, [("token", json.dumps({"n": n}))]) for n in range(APPENDS)]

    threads = [threading.Thread(target=produce, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    return got


def test_many_runs_appending_at_once_each_stay_contiguous_and_in_order(no_thread_leak, logs):
    log = logs.new()
    leases = [log.create(new_run_id(), OWNER) for _ in range(RUNS)]
    got = _append_concurrently(log, leases)
    for lease in leases:
        assert got[lease.run_id] == list(range(1, APPENDS + 1))
        frames = [item for item in log.read(lease.run_id, OWNER) if isinstance(item, Frame)]
        assert [json.loads(frame.data)["n"] for frame in frames] == list(range(APPENDS))


@pytest.fixture
def redis_logs(tmp_path):
    maker = LogMaker("redis", tmp_path)
    yield maker
    maker.cleanup()


def test_redis_writes_the_appends_of_busy_runs_in_shared_round_trips(no_thread_leak, redis_logs):
    log = redis_logs.new(group_delay_s=0.01)
    round_trips = []
    pipeline = log._redis.pipeline  # counted where the grouped appends go out: one pipeline, one round trip

    def counted(*args: Any, **kwargs: Any) -> Any:
        round_trips.append(1)
        return pipeline(*args, **kwargs)

    log._redis.pipeline = counted
    leases = [log.create(new_run_id(), OWNER) for _ in range(RUNS)]
    got = _append_concurrently(log, leases)
    assert all(got[lease.run_id] == list(range(1, APPENDS + 1)) for lease in leases)
    assert len(round_trips) < RUNS * APPENDS / 3, f"{len(round_trips)} round trips for {RUNS * APPENDS} appends"


def test_redis_groups_a_fenced_run_with_others_and_only_it_is_refused(redis_logs):
    log = redis_logs.new(group_delay_s=0.05)
    live, ended = (log.create(new_run_id(), OWNER) for _ in range(2))
    log.append(live, [("token", "{}")])  # the store is busy now: the next appends wait to be grouped
    log.finish(ended, ("done", "{}"))
    outcomes: Dict[str, Any] = {}

    def append(name: str, lease: Any) -> None:
        try:
            outcomes[name] = log.append(lease, [("token", "{}")])
        except RunFencedError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=append, args=item) for item in (("live", live), ("ended", ended))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert outcomes["live"] == 2
    assert isinstance(outcomes["ended"], RunFencedError) and ended.run_id in str(outcomes["ended"])


def test_redis_appends_again_after_the_server_forgot_its_scripts(redis_logs):
    import redis

    log = redis_logs.new()
    lease = log.create(new_run_id(), OWNER)
    assert log.append(lease, [("token", "{}")]) == 1
    with redis.Redis.from_url(redis_logs.spec["url"]) as admin:
        admin.script_flush()  # as after a restart without persistence of the script cache
    assert log.append(lease, [("token", "{}"), ("token", "{}")]) == 3
    assert log.finish(lease, ("done", "{}")) == 4
