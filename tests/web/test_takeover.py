"""Takeover over real HTTP (waitress), on every log: a run whose producer is gone is driven on by the app.

The dead producer is played by the test: it creates the run in the log,
appends what its worker had sent (round 1 began, a side-effect call
started), saves the checkpoint a producer saves at the run's start, and
stops renewing.  The app's reader or status poll then finds the lease out
and takes the run over, or closes it as ``producer_lost`` when it cannot.
"""
from __future__ import annotations

import json
import time
from typing import List

import pytest
import requests
from run_log_kinds import logs  # noqa: F401 - a fixture
from test_runs_http import STREAM, answer_tokens, events_of
from wsgi_support import make_engine, serving

from streamengine import Checkpoint, ConfigError, Message
from streamengine.runs import MemoryRunLog, new_run_id
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.web._producer import checkpoint_record
from streamengine.wsgi import make_wsgi_app

OWNER = "anonymous"


def sender():
    sent: List[str] = []

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        sent.append(to)
        return f"sent to {to}"

    return send, sent


def abandoned_run(log, record: str = "", lease_s: float = 0.3, asks: bool = False, started: str = "tool_start",
                  before: tuple = ()) -> str:
    """A run as a worker that died in round 1 left it: the start checkpoint, round 1's frames (``before``
    first), a started send (``asks``: a send asked about, with no answer yet; ``started="tool_approved"``: a
    send approved, its worker killed before its ``tool_start`` reached the log)."""
    run_id = new_run_id()
    lease = log.create(run_id, OWNER, {"request_id": "r1"}, lease_s=lease_s)
    log.append(lease, [("round", '{"round":1}'), ("token", json.dumps("Sending. "))])
    start = Checkpoint(round=0, messages=(Message(role="user", content="tell bob"),))
    if record != "none":
        log.save_checkpoint(lease, 2, record or checkpoint_record({"conversation_id": None, "asks": asks}, start))
    call = {"id": "c1", "name": "send", "arguments": '{"to":"bob"}'}
    if before:
        log.append(lease, list(before))
    log.append(lease, [("approval_request", json.dumps({"call": call, "expires_in_s": 60})) if asks else
                       ("tool_approved", json.dumps({"call": call})) if started == "tool_approved" else
                       ("tool_start", json.dumps(call))])
    time.sleep(lease_s + 0.05)
    return run_id


@pytest.mark.parametrize("started", ["tool_start", "tool_approved"])
def test_a_reader_takes_over_a_run_whose_producer_died_and_its_started_side_effect_call_is_not_run_again(
        provider, logs, started):
    """``tool_approved``: the worker died after the app's yes was logged, before the tool's start was."""
    send, sent = sender()
    provider.add_turn(s.text("Sending again. "), s.tool_call(0, id="c9", name="send", arguments='{"to": "bob"}'),
                      s.finish("tool_calls"))
    provider.add_turn(s.text("It may have gone to bob."), s.finish())
    log = logs.new()
    with make_engine(provider, [send], tool_mode="native") as engine, \
            serving(make_wsgi_app(engine, runs=log, take_over=True, approve=lambda call, environ: True)) as base:
        run_id = abandoned_run(log, started=started)
        resp = requests.get(f"{base}/v1/runs/{run_id}/events", headers={**STREAM, "Last-Event-ID": f"{run_id}.3"},
                            stream=True, timeout=20)
        events, _ = events_of(resp)
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()
    assert sent == []
    events = [e for e in events if e.kind != "tool_approved"]  # the taker's own yes for c9, logged before it
    assert [e.kind for e in events if e.kind != "message"] == ["tool_result", "reset", "tool_result", "round", "done"]
    closed, reset = events[0].json(), events[1].json()
    told = next(e.json() for e in events[2:] if e.kind == "tool_result")
    # The dead worker's open call is closed first (its card must not spin), then round 1 is asked again.
    assert (closed["call_id"], closed["skipped"], closed["ok"]) == ("c1", "interrupted", False)
    assert "interrupted" in closed["error"]  # the app redacts error texts (expose_errors=False); skipped says it
    assert reset["round"] == 1 and "taken over after round 0" in reset["reason"]
    assert (told["call_id"], told["name"], told["skipped"], told["ok"]) == ("c9", "send", "interrupted", False)
    assert answer_tokens(events) == "Sending again. It may have gone to bob."
    assert [int(e.id.rpartition(".")[2]) for e in events if e.id] == list(range(4, 4 + len(events) - 1))
    assert status["state"] == "done" and status["answer"] == "It may have gone to bob."
    assert provider.requests[0].json["messages"] == [{"role": "user", "content": "tell bob"}]


def test_a_call_only_asked_about_is_asked_again_by_the_taker_and_runs_once_approved(provider, logs):
    send, sent = sender()
    provider.add_turn(s.tool_call(0, id="c9", name="send", arguments='{"to": "bob"}'), s.finish("tool_calls"))
    provider.add_turn(s.text("Sent to bob."), s.finish())
    log = logs.new()
    with make_engine(provider, [send], tool_mode="native") as engine, \
            serving(make_wsgi_app(engine, runs=log, take_over=True, approvals=True)) as base:
        run_id = abandoned_run(log, asks=True)
        resp = requests.get(f"{base}/v1/runs/{run_id}/events", headers={**STREAM, "Last-Event-ID": f"{run_id}.3"},
                            stream=True, timeout=20)
        seen = []
        for line in resp.iter_lines(decode_unicode=True):
            seen.append(line)
            if line.startswith("event: approval_request"):
                answered = requests.post(f"{base}/v1/runs/{run_id}/approvals/c9", json={"approved": True}, timeout=5)
                assert answered.status_code == 200
            if line == "data: [DONE]":
                break
    events = [line[7:] for line in seen if line.startswith("event: ")]
    assert events == ["tool_result", "reset", "approval_request", "tool_approved", "tool_start", "tool_result",
                      "round", "done"]
    assert sent == ["bob"]  # asked again (nobody had answered c1, so it never ran), approved, run once
    done = json.loads(next(line for line in reversed(seen) if line.startswith("data: {"))[6:])
    assert done["answer"] == "Sent to bob."


def test_an_approved_side_effect_call_is_logged_as_approved_before_it_starts(provider, logs):
    send, sent = sender()
    provider.add_turn(s.tool_call(0, id="c9", name="send", arguments='{"to": "bob"}'), s.finish("tool_calls"))
    provider.add_turn(s.text("Sent."), s.finish())
    log = logs.new()
    with make_engine(provider, [send], tool_mode="native") as engine, \
            serving(make_wsgi_app(engine, runs=log, take_over=True, approve=lambda call, environ: True)) as base:
        events, _ = events_of(requests.post(f"{base}/v1/chat/stream", json={"messages": [
            {"role": "user", "content": "tell bob"}]}, headers=STREAM, stream=True, timeout=20))
    names = [e.kind for e in events if e.kind in ("tool_approved", "tool_start", "tool_result")]
    assert names == ["tool_approved", "tool_start", "tool_result"] and sent == ["bob"]
    assert events[[e.kind for e in events].index("tool_approved")].json()["call"]["id"] == "c9"


def test_a_round_whose_takers_each_died_is_not_taken_over_a_third_time(provider, logs):
    reset = ("reset", json.dumps({"round": 1, "reason": "the run was taken over after round 0; round 1 is asked "
                                                          "again"}))
    log = logs.new()
    with make_engine(provider) as engine, serving(make_wsgi_app(engine, runs=log, take_over=True)) as base:
        run_id = abandoned_run(log, before=(reset, reset))
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()
    assert status["state"] == "failed" and status["terminal"]["data"]["code"] == "producer_lost"
    assert provider.request_count == 0


@pytest.mark.parametrize("record, take_over", [
    ("none", True),  # killed before its first checkpoint was saved
    ('{"checkpoint": "not one"}', True),  # a checkpoint that does not parse
    ("", False),  # takeover turned off
])
def test_a_run_that_cannot_be_taken_over_is_closed_as_producer_lost(provider, logs, record, take_over):
    log = logs.new()
    with make_engine(provider) as engine, serving(make_wsgi_app(engine, runs=log, take_over=take_over)) as base:
        run_id = abandoned_run(log, record)
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()
    assert status["state"] == "lost" and status["terminal"]["data"]["code"] == "producer_lost"
    assert provider.request_count == 0


def test_take_over_is_checked(provider, logs):
    with make_engine(provider) as engine:
        with pytest.raises(ConfigError, match="take_over=True needs a shared run log"):
            make_wsgi_app(engine, take_over=True)
        with pytest.raises(ConfigError, match="take_over must be True, False or None"):
            make_wsgi_app(engine, runs=logs.new(), take_over="yes")


class RevivedProducerLog(MemoryRunLog):
    """A log whose run's frozen producer comes back just after a taker's first look, and saves a newer checkpoint
    (its lease had run out, but nobody had taken the run yet)."""

    revive = None

    def checkpoint(self, run_id):
        saved = super().checkpoint(run_id)
        revive, self.revive = self.revive, None
        if revive is not None:
            revive()
        return saved


def test_a_taker_goes_on_from_a_checkpoint_saved_between_its_first_look_and_its_lease(provider):
    provider.add_turn(s.text("Round two, resumed."), s.finish())
    log = RevivedProducerLog()
    run_id = new_run_id()
    lease = log.create(run_id, OWNER, {"request_id": "r1"}, lease_s=0.3)
    log.append(lease, [("round", '{"round":1}'), ("token", json.dumps("Looked it up. "))])
    first = Checkpoint(round=0, messages=(Message(role="user", content="tell bob"),))
    log.save_checkpoint(lease, 2, checkpoint_record({"conversation_id": None, "asks": False}, first))
    after_round_1 = Checkpoint(round=1, messages=(Message(role="user", content="tell bob"),
                                                  Message(role="assistant", content="Looked it up.")))
    log.revive = lambda: log.save_checkpoint(lease, 2, checkpoint_record({"conversation_id": None, "asks": False},
                                                                       after_round_1))
    time.sleep(0.35)
    with make_engine(provider) as engine, serving(make_wsgi_app(engine, runs=log, take_over=True)) as base:
        events, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events", stream=True, timeout=20,
                                           headers={**STREAM, "Last-Event-ID": f"{run_id}.2"}))
    reset = next(e.json() for e in events if e.kind == "reset")
    assert reset["round"] == 2  # from the newer checkpoint: round 1 is not asked again
    assert [m["content"] for m in provider.requests[0].json["messages"]] == ["tell bob", "Looked it up."]
    assert answer_tokens(events) == "Round two, resumed."
