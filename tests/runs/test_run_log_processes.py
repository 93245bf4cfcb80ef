"""The shared logs (SQLite, Redis, PostgreSQL) across processes: what one worker writes, another sees.

The other process is tests/support/run_log_kinds.py run as a script; it prints
``ready`` once its log is open, so process start-up never counts against a
timeout here.
"""
from __future__ import annotations

import json
import os
import signal
import time

from run_log_kinds import in_another_process, lease_json, shared_logs  # noqa: F401 - a fixture

from streamengine.runs import Frame, RunFencedError, new_run_id

OWNER = "alice"


def _ready(process) -> None:
    assert process.stdout.readline() == "ready\n"


def test_a_second_log_on_the_same_store_sees_the_same_runs(shared_logs):
    first, second = shared_logs.new(), shared_logs.new()
    run_id = new_run_id()
    lease = first.create(run_id, OWNER)
    first.append(lease, [("token", "{}")])
    assert [frame.seq for frame in second.read(run_id, OWNER)] == [1]
    second.append(lease, [("token", "{}")])  # the lease is the store's, not the log object's
    assert [frame.seq for frame in first.read(run_id, OWNER, after_seq=1)] == [2]


def test_a_blocked_read_wakes_when_another_process_appends(shared_logs):
    log = shared_logs.new()
    run_id = new_run_id()
    lease = log.create(run_id, OWNER)
    writer = in_another_process("append", shared_logs.spec, lease=lease_json(lease), delay_s=0.3,
                                events=[["token", json.dumps({"text": "from afar"})]])
    try:
        _ready(writer)
        began = time.monotonic()
        frames = log.read(run_id, OWNER, timeout_s=20)
        waited = time.monotonic() - began
        assert writer.wait(10) == 0
    finally:
        writer.kill()
        writer.wait(5)
    assert frames == [Frame(1, "token", json.dumps({"text": "from afar"}))]
    assert waited < 10.0  # woken by the write (0.3 s after "ready"), long before the read's timeout


def test_a_stop_requested_in_another_process_reaches_the_producer(shared_logs):
    log = shared_logs.new()
    run_id = new_run_id()
    lease = log.create(run_id, OWNER)
    stopper = in_another_process("request_stop", shared_logs.spec, run_id=run_id, owner=OWNER)
    try:
        _ready(stopper)
        assert stopper.wait(10) == 0
    finally:
        stopper.kill()
        stopper.wait(5)
    assert log.stop_requested(lease) is True


def test_a_killed_producer_is_noticed_after_its_lease_and_closed_as_lost(shared_logs):
    log = shared_logs.new()
    run_id = new_run_id()
    producer = in_another_process("create_and_hang", shared_logs.spec, run_id=run_id, owner=OWNER, lease_s=0.3)
    try:
        _ready(producer)
        assert producer.stdout.readline() == "created\n"
        assert log.status(run_id, OWNER).lease_expired is False
        os.kill(producer.pid, signal.SIGKILL)
        killed = time.monotonic()
        while not log.status(run_id, OWNER).lease_expired:
            assert time.monotonic() - killed < 5, "the lease never expired"
            time.sleep(0.02)
        assert time.monotonic() - killed < 0.3 + 1.0
    finally:
        producer.kill()
        producer.wait(5)
    assert log.close_lost(run_id) is True
    status = log.status(run_id, OWNER)
    assert status.state == "lost" and json.loads(status.terminal.data)["code"] == "producer_lost"


def test_a_revived_producer_is_fenced_after_another_worker_closed_its_run(shared_logs):
    producer_log, reader_log = shared_logs.new(), shared_logs.new()
    run_id = new_run_id()
    lease = producer_log.create(run_id, OWNER, lease_s=0.2)
    producer_log.append(lease, [("token", "{}")])
    time.sleep(0.3)  # the producer froze (SIGSTOP) past its lease
    assert reader_log.close_lost(run_id) is True
    for write in (lambda: producer_log.append(lease, [("token", "{}")]), lambda: producer_log.renew(lease),
                  lambda: producer_log.finish(lease, ("done", "{}")), lambda: producer_log.stop_requested(lease)):
        try:
            write()
        except RunFencedError:
            continue
        raise AssertionError("a fenced producer wrote")
    assert [frame.seq for frame in reader_log.read(run_id, OWNER)] == [1, 2]
