"""The run-log contract (docs/runs.md), the same tests on every log: memory, SQLite, Redis, PostgreSQL.

Leases and retentions are a few hundred milliseconds so expiry is real and
the suite stays fast; every wait for one is a bounded poll.
"""
from __future__ import annotations

import json
import threading
import time

import pytest
from run_log_kinds import logs  # noqa: F401 - a fixture

from streamengine import ConfigError
from streamengine.runs import (
    ApprovalAnswer,
    Frame,
    Gap,
    RunExistsError,
    RunFencedError,
    RunNotFound,
    SavedCheckpoint,
    new_run_id,
)

OWNER = "alice"


def token(text: str) -> tuple:
    return ("token", json.dumps({"text": text}))


def seqs(items: list) -> list:
    return [item.seq for item in items if isinstance(item, Frame)]


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def caplog_lines():
    """Every line streamengine logs during the test."""
    from loguru import logger

    from streamengine import enable_logging

    lines: list = []
    handler = enable_logging(level="INFO", sink=lines.append)
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def started(log, **create) -> tuple:
    run_id = new_run_id()
    return run_id, log.create(run_id, OWNER, {"question": "hi"}, **create)


# -- sequence and reading ---------------------------------------------------------------------

def test_seq_is_contiguous_per_run_and_read_returns_what_follows(logs):
    log = logs.new()
    run_id, lease = started(log)
    other_id, other = started(log)
    assert log.append(lease, [token("a")]) == 1
    assert log.append(other, [token("x"), token("y")]) == 2
    assert log.append(lease, [token("b"), token("c"), token("d")]) == 4
    assert log.append(lease, []) == 4
    frames = log.read(run_id, OWNER)
    assert seqs(frames) == [1, 2, 3, 4]
    assert [json.loads(frame.data)["text"] for frame in frames] == ["a", "b", "c", "d"]
    assert {frame.name for frame in frames} == {"token"} and not any(frame.terminal for frame in frames)
    assert seqs(log.read(run_id, OWNER, after_seq=2)) == [3, 4]
    assert seqs(log.read(run_id, OWNER, after_seq=1, limit=2)) == [2, 3]
    assert log.read(run_id, OWNER, after_seq=4) == []
    assert seqs(log.read(other_id, OWNER)) == [1, 2]


def test_a_read_with_nothing_new_waits_for_its_timeout_then_returns_empty(logs):
    log = logs.new()
    run_id, _ = started(log)
    began = time.monotonic()
    assert log.read(run_id, OWNER, timeout_s=0.3) == []
    assert time.monotonic() - began >= 0.25


def test_a_blocked_read_wakes_when_another_thread_appends(no_thread_leak, logs):
    log = logs.new()
    run_id, lease = started(log)
    got = {}

    def reader() -> None:
        began = time.monotonic()
        got["frames"] = log.read(run_id, OWNER, timeout_s=10)
        got["waited"] = time.monotonic() - began

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.3)
    log.append(lease, [token("late")])
    thread.join(10)
    assert seqs(got["frames"]) == [1]
    assert 0.2 < got["waited"] < 3.0  # it blocked, and the append ended the wait long before the timeout


def test_a_blocked_read_wakes_for_the_terminal_and_then_returns_at_once(logs):
    log = logs.new()
    run_id, lease = started(log)
    log.append(lease, [token("a")])
    threading.Timer(0.2, log.finish, (lease, ("done", '{"answer":"a"}'))).start()
    frames = log.read(run_id, OWNER, after_seq=1, timeout_s=10)
    assert [(frame.seq, frame.name, frame.terminal) for frame in frames] == [(2, "done", True)]
    began = time.monotonic()
    assert log.read(run_id, OWNER, after_seq=2, timeout_s=10) == []  # ended: nothing will come, no wait
    assert time.monotonic() - began < 1.0


# -- the terminal event and fencing -----------------------------------------------------------

def test_finish_appends_exactly_one_terminal_and_fences_everything_after(logs):
    log = logs.new()
    run_id, lease = started(log)
    log.append(lease, [token("a")])
    assert log.finish(lease, ("done", '{"answer":"a"}')) == 2
    status = log.status(run_id, OWNER)
    assert (status.state, status.last_seq) == ("done", 2)
    assert status.terminal == Frame(2, "done", '{"answer":"a"}', True)
    assert status.meta == {"question": "hi"}
    for write in (lambda: log.append(lease, [token("b")]), lambda: log.renew(lease),
                  lambda: log.finish(lease, ("done", "{}")), lambda: log.stop_requested(lease),
                  lambda: log.approval_answer(lease, "call_1")):
        with pytest.raises(RunFencedError, match="no longer valid"):
            write()
    assert seqs(log.read(run_id, OWNER)) == [1, 2]
    assert log.close_lost(run_id) is False


def test_finish_states_and_their_checks(logs):
    log = logs.new()
    run_id, lease = started(log)
    with pytest.raises(ConfigError, match="one of done, cancelled, failed"):
        log.finish(lease, ("error", "{}"), state="lost")
    log.finish(lease, ("done", '{"stop_reason":"cancelled"}'), state="cancelled")
    assert log.status(run_id, OWNER).state == "cancelled"


def test_a_stale_lease_from_another_run_or_token_is_fenced(logs):
    log = logs.new()
    run_id, lease = started(log)
    forged = type(lease)(run_id, "not-the-token", lease.lease_s, lease.retain_s)
    with pytest.raises(RunFencedError):
        log.append(forged, [token("x")])
    assert log.read(run_id, OWNER) == []


def test_lease_expiry_is_seen_on_the_store_clock_and_renew_extends_it(logs):
    log = logs.new()
    run_id, lease = started(log, lease_s=0.6)
    for _ in range(3):  # renewed every 0.15 s for 0.45 s: never expired (a wide margin for a loaded machine)
        time.sleep(0.15)
        log.renew(lease)
        assert log.status(run_id, OWNER).lease_expired is False
        assert log.close_lost(run_id) is False
    log.append(lease, [token("a")])  # an append renews too
    assert log.status(run_id, OWNER).lease_expired is False
    assert wait_until(lambda: log.status(run_id, OWNER).lease_expired, timeout_s=3)


def test_close_lost_ends_an_expired_run_once_and_fences_its_producer(logs):
    log = logs.new()
    run_id, lease = started(log, lease_s=0.2)
    log.append(lease, [token("a")])
    assert wait_until(lambda: log.status(run_id, OWNER).lease_expired, timeout_s=3)
    assert log.close_lost(run_id) is True
    assert log.close_lost(run_id) is False
    status = log.status(run_id, OWNER)
    assert (status.state, status.last_seq, status.lease_expired) == ("lost", 2, False)
    assert status.terminal.name == "error"
    assert json.loads(status.terminal.data)["fatal"] is True
    assert json.loads(status.terminal.data)["code"] == "producer_lost"
    with pytest.raises(RunFencedError):  # the frozen producer wakes up: it writes nothing
        log.append(lease, [token("b")])
    with pytest.raises(RunFencedError):
        log.renew(lease)
    assert seqs(log.read(run_id, OWNER)) == [1, 2]


def test_exactly_one_terminal_when_finish_races_close_lost(logs):
    log = logs.new()
    outcomes = set()
    for _ in range(8):
        run_id, lease = started(log, lease_s=0.05)
        log.append(lease, [token("a")])
        time.sleep(0.08)
        winners = _race_finish_and_two_close_lost(log, run_id, lease)
        assert winners.count(True) == 1, winners
        frames = log.read(run_id, OWNER)
        assert seqs(frames) == [1, 2] and [frame.terminal for frame in frames] == [False, True]
        outcomes.add(log.status(run_id, OWNER).state)
    assert outcomes <= {"done", "lost"}


def _race_finish_and_two_close_lost(log, run_id: str, lease) -> list:
    """Which of finish, close_lost, close_lost wrote the terminal, released together by a barrier."""
    gate = threading.Barrier(3)
    results = {}

    def finish() -> None:
        gate.wait()
        try:
            results["finish"] = log.finish(lease, ("done", "{}")) > 0
        except RunFencedError:
            results["finish"] = False

    def close(name: str) -> None:
        gate.wait()
        results[name] = log.close_lost(run_id)

    threads = [threading.Thread(target=finish), threading.Thread(target=close, args=("lost1",)),
               threading.Thread(target=close, args=("lost2",))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return [results["finish"], results["lost1"], results["lost2"]]


def test_create_refuses_a_taken_id_and_bad_arguments(logs):
    log = logs.new()
    run_id, _ = started(log)
    with pytest.raises(RunExistsError, match="already exists"):
        log.create(run_id, "bob")
    with pytest.raises(ConfigError, match="run id"):
        log.create("short", OWNER)
    with pytest.raises(ConfigError, match="owner"):
        log.create(new_run_id(), "")
    assert len(new_run_id()) == 22 and new_run_id() != new_run_id()


def test_events_are_checked_before_anything_is_written(logs):
    log = logs.new()
    run_id, lease = started(log)
    for bad in ([("token", "two\nlines")], [("has space", "{}")], [("token", 5)], [["token", "{}"]],
                [token("fine"), ("", "{}")]):
        with pytest.raises(ConfigError):
            log.append(lease, bad)
    assert log.read(run_id, OWNER) == []
    assert log.append(lease, [token("ok")]) == 1


# -- stop and approvals -----------------------------------------------------------------------

def test_stop_is_a_flag_the_owner_sets_and_the_producer_polls(logs):
    log = logs.new()
    run_id, lease = started(log)
    assert log.stop_requested(lease) is False
    log.request_stop(run_id, OWNER)
    log.request_stop(run_id, OWNER)  # idempotent
    assert log.stop_requested(lease) is True
    assert log.status(run_id, OWNER).stop_requested is True
    with pytest.raises(RunNotFound):
        log.request_stop(run_id, "mallory")


def test_an_append_reports_the_stop_flag_so_a_producer_that_appends_need_not_poll(logs):
    log = logs.new()
    run_id, lease = started(log)
    assert log.append_and_poll(lease, [token("a")]) == (1, False)
    log.request_stop(run_id, OWNER)
    appended = log.append_and_poll(lease, [token("b"), token("c")])
    assert (appended.last_seq, appended.stop_requested) == (3, True)
    log.finish(lease, ("done", "{}"), state="cancelled")
    with pytest.raises(RunFencedError):
        log.append_and_poll(lease, [token("d")])


def test_mark_read_is_a_reader_heartbeat_the_status_shows_on_the_store_clock(logs):
    log = logs.new()
    run_id, _ = started(log)
    assert log.status(run_id, OWNER).read_ago_s is None
    log.mark_read(run_id, OWNER)
    assert 0.0 <= log.status(run_id, OWNER).read_ago_s < 1.0
    time.sleep(0.3)
    assert 0.25 <= log.status(run_id, OWNER).read_ago_s < 2.0
    log.mark_read(run_id, OWNER)
    assert log.status(run_id, OWNER).read_ago_s < 0.25
    with pytest.raises(RunNotFound):
        log.mark_read(run_id, "mallory")
    with pytest.raises(RunNotFound):
        log.mark_read(new_run_id(), OWNER)


def test_the_first_approval_answer_wins(logs):
    log = logs.new()
    run_id, lease = started(log)
    assert log.approval_answer(lease, "call_1") is None
    first = log.answer_approval(run_id, OWNER, "call_1", True, "looks safe")
    assert first == ApprovalAnswer("call_1", True, "looks safe")
    assert log.answer_approval(run_id, OWNER, "call_1", False, "changed my mind") == first
    assert log.approval_answer(lease, "call_1") == first
    assert log.approval_answer(lease, "call_2") is None
    with pytest.raises(RunNotFound):
        log.answer_approval(run_id, "mallory", "call_2", True)
    assert log.approval_answer(lease, "call_2") is None


def test_racing_approval_answers_all_see_the_same_winner(logs):
    log = logs.new()
    run_id, lease = started(log)
    gate = threading.Barrier(6)
    answers = []

    def answer(approved: bool) -> None:
        gate.wait()
        answers.append(log.answer_approval(run_id, OWNER, "call_9", approved, str(approved)))

    threads = [threading.Thread(target=answer, args=(index % 2 == 0,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(answers) == 6 and len(set(answers)) == 1
    assert log.approval_answer(lease, "call_9") == answers[0]


def test_approval_answers_per_run_are_capped(logs):
    log = logs.new(max_approvals=2)
    run_id, _ = started(log)
    log.answer_approval(run_id, OWNER, "a", True)
    log.answer_approval(run_id, OWNER, "b", True)
    assert log.answer_approval(run_id, OWNER, "a", False).approved is True  # a repeat is not a new answer
    with pytest.raises(Exception, match="max_approvals"):
        log.answer_approval(run_id, OWNER, "c", True)


# -- owners, bounds, retention ----------------------------------------------------------------

def test_another_owners_run_is_as_unknown_as_a_missing_one(logs):
    log = logs.new()
    run_id, lease = started(log)
    log.append(lease, [token("secret")])
    missing = new_run_id()
    for run in (run_id, missing):
        for look, *args in ((log.status,), (log.read,), (log.request_stop,), (log.answer_approval, "c", True)):
            with pytest.raises(RunNotFound) as caught:
                look(run, "mallory", *args)
            assert str(caught.value) == str(RunNotFound(run))
    with pytest.raises(RunNotFound):
        log.close_lost(missing)


def test_a_run_past_its_event_cap_is_trimmed_and_the_reader_is_told_the_gap(logs):
    log = logs.new(max_events=5)
    run_id, lease = started(log)
    log.append(lease, [token(str(index)) for index in range(4)])
    log.append(lease, [token(str(index)) for index in range(4, 12)])
    items = log.read(run_id, OWNER)
    assert isinstance(items[0], Gap)
    assert (items[0].after_seq, items[0].next_seq) == (0, 8)
    assert items[0].status.state == "running" and items[0].status.first_seq == 8
    assert seqs(items) == [8, 9, 10, 11, 12]
    assert seqs(log.read(run_id, OWNER, after_seq=9)) == [10, 11, 12]  # within the log: no gap
    log.finish(lease, ("done", "{}"))
    items = log.read(run_id, OWNER, after_seq=3)
    assert isinstance(items[0], Gap) and items[0].status.state == "done"
    assert seqs(items) == [9, 10, 11, 12, 13] and items[-1].terminal


def test_a_run_past_its_byte_cap_keeps_its_newest_events(logs):
    log = logs.new(max_bytes=100)
    run_id, lease = started(log)
    for index in range(30):
        log.append(lease, [("token", json.dumps({"text": f"{index:04d}"}))])  # 5 + 16 = 21 bytes each
    status = log.status(run_id, OWNER)
    assert (status.first_seq, status.last_seq) == (27, 30)  # 4 x 21 = 84 <= 100 < 5 x 21
    log.append(lease, [("token", json.dumps({"text": "x" * 500}))])  # alone over the cap: it stays
    assert seqs(log.read(run_id, OWNER, after_seq=30)) == [31]
    assert log.status(run_id, OWNER).first_seq == 31


def test_a_long_run_stays_within_its_caps(logs):
    log = logs.new(max_events=50)
    run_id, lease = started(log)
    for start in range(0, 2000, 100):
        log.append(lease, [token(str(index)) for index in range(start, start + 100)])
    status = log.status(run_id, OWNER)
    assert (status.first_seq, status.last_seq) == (1951, 2000)
    assert seqs(log.read(run_id, OWNER, after_seq=1950)) == list(range(1951, 2001))


def test_a_finished_run_is_gone_after_its_retention(logs):
    log = logs.new(retain_s=0.3)
    run_id, lease = started(log)
    log.append(lease, [token("a")])
    log.finish(lease, ("done", "{}"))
    assert log.status(run_id, OWNER).state == "done"
    assert wait_until(lambda: _gone(log, run_id), timeout_s=3)
    with pytest.raises(RunNotFound):
        log.read(run_id, OWNER)
    with pytest.raises(RunNotFound):
        log.close_lost(run_id)
    log.create(run_id, OWNER)  # the id is free again; nothing of the old run remains
    assert log.read(run_id, OWNER) == [] and log.status(run_id, OWNER).last_seq == 0


def test_an_abandoned_running_run_is_gone_after_lease_and_retention(logs):
    log = logs.new(retain_s=0.3)
    run_id, lease = started(log, lease_s=0.2)
    log.append(lease, [token("a")])
    began = time.monotonic()
    assert wait_until(lambda: _gone(log, run_id), timeout_s=3)
    assert time.monotonic() - began >= 0.4
    with pytest.raises(RunFencedError):
        log.append(lease, [token("b")])


def _gone(log, run_id: str) -> bool:
    try:
        log.status(run_id, OWNER)
    except RunNotFound:
        return True
    return False


# -- checkpoints -------------------------------------------------------------------------------

def test_a_checkpoint_is_saved_under_the_lease_replaced_by_the_next_and_read_by_a_taker(logs):
    log = logs.new()
    run_id, lease = started(log, lease_s=0.2)
    assert log.checkpoint(run_id) is None
    assert log.save_checkpoint(lease, 0, '{"round":0}') is True
    log.append(lease, [token("a"), token("b")])
    assert log.save_checkpoint(lease, 2, '{"round":1}') is True
    other = log if logs.kind == "memory" else logs.new()  # another worker's log on the same store
    assert other.checkpoint(run_id) == SavedCheckpoint(2, '{"round":1}')
    assert wait_until(lambda: other.status(run_id, OWNER).lease_expired, timeout_s=3)
    successor = other.take_over(run_id)
    assert successor is not None
    with pytest.raises(RunFencedError):
        log.save_checkpoint(lease, 3, '{"round":2}')  # the old producer writes nothing
    assert other.checkpoint(run_id) == SavedCheckpoint(2, '{"round":1}')
    assert other.save_checkpoint(successor, 2, '{"round":1,"again":true}') is True
    other.finish(successor, ("done", "{}"))
    with pytest.raises(RunFencedError):
        other.save_checkpoint(successor, 3, "{}")  # ended: nothing after the terminal


def test_a_checkpoint_over_its_cap_or_none_clears_the_one_before(logs, caplog_lines):
    log = logs.new(max_checkpoint_bytes=64)
    run_id, lease = started(log)
    assert log.save_checkpoint(lease, 0, '{"round":0}') is True
    assert log.save_checkpoint(lease, 0, json.dumps({"big": "x" * 100})) is False
    assert log.checkpoint(run_id) is None  # an older checkpoint must not outlive a round that was not saved
    assert any("over max_checkpoint_bytes=64" in line and "producer_lost" in line for line in caplog_lines)
    assert log.save_checkpoint(lease, 0, '{"round":0}') is True
    assert log.save_checkpoint(lease, 0, None) is False
    assert log.checkpoint(run_id) is None


def test_checkpoint_arguments_are_checked(logs):
    log = logs.new()
    _, lease = started(log)
    with pytest.raises(ConfigError, match="JSON text or None"):
        log.save_checkpoint(lease, 0, b"{}")
    with pytest.raises(ConfigError, match="after_seq"):
        log.save_checkpoint(lease, -1, "{}")
    with pytest.raises(ConfigError, match="run id"):
        log.checkpoint("no")
    with pytest.raises(ConfigError, match="max_checkpoint_bytes"):
        logs.new(max_checkpoint_bytes=-1)


# -- take-over ---------------------------------------------------------------------------------

def test_a_run_whose_lease_expired_can_be_taken_over_once_and_the_old_producer_is_fenced(logs):
    log = logs.new()
    run_id, lease = started(log, lease_s=0.2)
    log.append(lease, [token("a")])
    assert log.take_over(run_id) is None  # its lease holds
    assert wait_until(lambda: log.status(run_id, OWNER).lease_expired, timeout_s=3)
    gate = threading.Barrier(4)
    taken = []

    def take() -> None:
        gate.wait()
        taken.append(log.take_over(run_id))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    leases = [lease for lease in taken if lease is not None]
    assert len(taken) == 4 and len(leases) == 1
    successor = leases[0]
    assert (successor.run_id, successor.lease_s) == (run_id, 0.2) and successor.token != lease.token
    with pytest.raises(RunFencedError):
        log.append(lease, [token("stale")])
    assert log.close_lost(run_id) is False  # the successor holds a fresh lease
    assert log.append(successor, [token("b")]) == 2
    assert log.finish(successor, ("done", "{}")) == 3
    assert log.take_over(run_id) is None  # ended
    assert [frame.data for frame in log.read(run_id, OWNER)][:2] == [token("a")[1], token("b")[1]]
