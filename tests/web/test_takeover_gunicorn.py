"""A run whose worker is killed (kill -9) is taken over by the other worker from its last round checkpoint.

Two real gunicorn gthread workers share a run log (SQLite, Redis, PostgreSQL)
behind the round-robin proxy of test_runs_gunicorn; the run's producer is
killed while a side-effect tool of round 2 runs.  The follower on the other
worker gets ``reset`` for round 2, then the rest of the run, then one
``done`` with the whole answer; the side-effect tool ran exactly once
(counted through a file: the killed worker's memory is gone).
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from typing import List

import pytest
import requests
from run_log_kinds import shared_logs  # noqa: F401 - a fixture
from test_runs_gunicorn import LEASE_S, follower, start_run, terminal_after, two_workers

from streamengine.testing import FakeProvider, RunEvent
from streamengine.testing import steps as s

pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")

APP = textwrap.dedent("""
    import json, os, time
    from run_log_kinds import open_log
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    from streamengine.wsgi import make_wsgi_app

    @tool
    def lookup(q: str) -> str:
        "Looks up."
        return q + " is 42"

    @tool(side_effects=True)
    def send(to: str) -> str:
        "Sends, slowly: the test kills its worker meanwhile."
        with open(os.environ["SE_SENT"], "a") as sent:
            sent.write(to + "\\n")
        time.sleep(float(os.environ.get("SE_SEND_S", "0")))
        return "sent to " + to

    engine = StreamingEngine(OpenAICompatibleClient(os.environ["SE_PROVIDER"]), [lookup, send],
                             EngineConfig(models=["m"], tool_mode="native", idle_timeout=30, completion_timeout=120))
    inner = make_wsgi_app(engine, runs=open_log(json.loads(os.environ["SE_LOG"])), heartbeat_s=0.2,
                          lease_s=float(os.environ["SE_LEASE"]), detach_grace_s=30,
                          approve=lambda call, environ: True)

    def app(environ, start_response):
        def start(status, headers, exc_info=None):
            return start_response(status, headers + [("X-Worker-Pid", str(os.getpid()))], exc_info)
        return inner(environ, start)
""")


def tool_turn(fp: FakeProvider, text: str, call_id: str, name: str, args: dict) -> None:
    fp.add_turn(s.text(text), s.tool_call(0, id=call_id, name=name, arguments=json.dumps(args)), s.finish("tool_calls"))


def wait_for(events: List[RunEvent], predicate, timeout_s: float = 15.0) -> RunEvent:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = next((event for event in list(events) if predicate(event)), None)
        if found is not None:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not seen within {timeout_s}s; last events: {events[-5:]}")


def answer_of(events: List[RunEvent]) -> str:
    return events[-1].json()["answer"]


def test_kill_9_during_round_two_is_taken_over_and_the_side_effect_tool_ran_once(tmp_path, shared_logs,
                                                                                  monkeypatch):
    sent = tmp_path / "sent.txt"
    monkeypatch.setenv("SE_SENT", str(sent))
    monkeypatch.setenv("SE_SEND_S", "20")  # still running when its worker is killed
    with FakeProvider() as fp:
        tool_turn(fp, "Looking it up. ", "c1", "lookup", {"q": "x"})
        tool_turn(fp, "Sending. ", "c2", "send", {"to": "bob"})
        tool_turn(fp, "Sending again. ", "c7", "send", {"to": "bob"})  # the interrupted round, asked again
        fp.add_turn(s.text("x is 42; "), s.delay(0.05), s.text("the message may have gone to bob."), s.finish())
        with two_workers(tmp_path, fp, shared_logs.spec, APP) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            wait_for(events, lambda e: e.event == "tool_start" and e.json()["name"] == "send")
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            reset = wait_for(events, lambda e: e.event == "reset", timeout_s=LEASE_S + 5)
            assert reset.json()["round"] == 2 and "taken over" in reset.json()["reason"]
            # Noticed as a lost producer would be (lease + a reader's 1 s wait), then taken over at once.
            taken_after = times[events.index(reset)] - killed
            assert taken_after <= LEASE_S + 1.5, f"reset {taken_after:.2f}s after the kill"
            print(f"\ntakeover: reset {taken_after:.2f}s after kill -9 (lease {LEASE_S:g}s)")
            last = terminal_after(events, times, killed, LEASE_S + 8)
            thread.join(10)
            resp.close()
            status = requests_status(base, run_id)
    assert last.event == "done", last
    assert answer_of(events) == "x is 42; the message may have gone to bob."
    assert sent.read_text() == "bob\n"  # ran once, by the killed worker; not again after the takeover
    closed = events[events.index(reset) - 1].json()  # the killed worker's send: closed, not left spinning
    assert (closed["call_id"], closed["skipped"]) == ("c2", "interrupted")
    after = events[events.index(reset) + 1:]
    assert [e.event for e in after if e.event != "message"] == ["tool_result", "round", "done"]
    told = next(e.json() for e in after if e.event == "tool_result")
    assert (told["call_id"], told["name"], told["skipped"]) == ("c7", "send", "interrupted")
    assert [e.json()["round"] for e in after if e.event == "round"] == [3]
    seqs = [int(e.id.rpartition(".")[2]) for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one log, contiguous, across both producers
    assert sum(1 for e in events if e.terminal) == 1
    assert status["state"] == "done" and status["answer"] == answer_of(events)
    assert [m["role"] for m in fp.requests[3].json["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]


def test_a_run_killed_in_its_first_round_is_taken_over_from_its_start(tmp_path, shared_logs, monkeypatch):
    monkeypatch.setenv("SE_SENT", str(tmp_path / "sent.txt"))
    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(400) for step in (s.text(f"w{i} "), s.delay(0.05))])
        fp.add_turn(s.text("A short answer."), s.finish())
        with two_workers(tmp_path, fp, shared_logs.spec, APP) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            wait_for(events, lambda e: e.event == "message" and e.json() == "w3 ")
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            last = terminal_after(events, times, killed, LEASE_S + 10)
            thread.join(10)
            resp.close()
    assert last.event == "done" and answer_of(events) == "A short answer."
    reset = next(e for e in events if e.event == "reset")
    assert reset.json()["round"] == 1
    after = events[events.index(reset) + 1:]
    assert [e.json() for e in after if e.event == "message"] == ["A short answer."]
    assert fp.requests[1].json["messages"] == fp.requests[0].json["messages"]  # round 1 asked again, as it was


def requests_status(base: str, run_id: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=10).json()
        if status["state"] != "running" or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def test_a_usechat_run_taken_over_reads_right_through_the_ui_message_stream(tmp_path, shared_logs, monkeypatch):
    sent = tmp_path / "sent.txt"
    monkeypatch.setenv("SE_SENT", str(sent))
    monkeypatch.setenv("SE_SEND_S", "20")
    with FakeProvider() as fp:
        tool_turn(fp, "Looking it up. ", "c1", "lookup", {"q": "x"})
        tool_turn(fp, "Sending. ", "c2", "send", {"to": "bob"})
        tool_turn(fp, "Sending again. ", "c7", "send", {"to": "bob"})
        fp.add_turn(s.text("It may have gone to bob."), s.finish())
        with two_workers(tmp_path, fp, shared_logs.spec, APP) as base:
            body = {"id": "chat-1", "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text",
                                                                                        "text": "tell bob"}]}],
                    "trigger": "submit-message"}
            started = requests.post(f"{base}/api/chat", json=body, stream=True, timeout=30)
            assert started.status_code == 200, started.text
            pid = int(started.headers["X-Worker-Pid"])
            resumed = requests.get(f"{base}/api/chat/chat-1/stream", stream=True, timeout=30)  # the other worker
            assert resumed.status_code == 200 and int(resumed.headers["X-Worker-Pid"]) != pid
            chunks = []
            for line in resumed.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                chunks.append(json.loads(line[6:]))
                if chunks[-1]["type"] == "tool-input-available" and chunks[-1]["toolCallId"] == "c2":
                    os.kill(pid, signal.SIGKILL)
                if chunks[-1]["type"] == "finish":
                    break
            started.close()
            resumed.close()
    types = [chunk["type"] for chunk in chunks]
    assert types.count("finish") == 1 and types[-1] == "finish" and "error" not in types
    reset = types.index("data-streamengine-reset")
    assert chunks[reset]["data"]["round"] == 2
    closed = [c for c in chunks if c["type"] == "tool-output-error"]
    assert [c["toolCallId"] for c in closed] == ["c2", "c7"]  # the killed worker's card closed; the re-ask answered
    after = "".join(c["delta"] for c in chunks[reset:] if c["type"] == "text-delta")
    assert after.endswith("It may have gone to bob.")
    assert sent.read_text() == "bob\n"


def test_a_frozen_producer_whose_run_was_taken_over_is_fenced_and_its_client_reads_the_rest_from_the_log(
        tmp_path, shared_logs, monkeypatch):
    monkeypatch.setenv("SE_SENT", str(tmp_path / "sent.txt"))
    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(400) for step in (s.text(f"w{i} "), s.delay(0.05))])
        fp.add_turn(s.text("A short answer."), s.finish())
        with two_workers(tmp_path, fp, shared_logs.spec, APP) as base:
            resp, run_id, pid = start_run(base)
            events, thread, times = follower(base, run_id, pid)
            wait_for(events, lambda e: e.event == "message" and e.json() == "w3 ")
            os.kill(pid, signal.SIGSTOP)
            try:
                last = terminal_after(events, times, time.monotonic(), LEASE_S + 10)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert fp.wait_for_client_disconnects(1, timeout=10)  # revived and fenced: it cancels its provider call
            own = [line for line in resp.iter_lines(decode_unicode=True) if line.startswith(("id: ", "event: "))]
            thread.join(10)
    assert last.event == "done" and last.json()["answer"] == "A short answer."
    ids = [line[4:] for line in own if line.startswith("id: ")]
    assert ids[-1] == last.id  # the frozen worker's own client ends with the same terminal, read from the log
    assert [line for line in own if line.startswith("event: ")].count("event: done") == 1
    seqs = [int(i.rpartition(".")[2]) for i in ids]
    assert seqs == list(range(1, len(seqs) + 1))  # nothing of the revived producer after the takeover
