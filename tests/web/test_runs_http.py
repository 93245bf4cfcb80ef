"""Runs that outlive their connection, over real HTTP (waitress) on every run log (issue 38).

``make_wsgi_app(engine, runs=log)``: every frame carries ``id: <run>.<seq>``,
a client resumes with Last-Event-ID, stops a run from another request,
answers a held call; a dead producer, an abandoned run and a shutdown each
end the run with exactly one terminal frame.
"""
from __future__ import annotations

import json
import re
import socket
import time
from typing import Dict, List, Optional, Tuple

import pytest
import requests
from conftest import wait_for
from run_log_kinds import logs  # noqa: F401 - a fixture
from serve_support import served
from wsgi_support import block, make_engine, read1_pieces, serving

from streamengine import ConfigError
from streamengine.runs import MemoryRunLog, new_run_id, shutdown_runs
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = {"messages": [{"role": "user", "content": "hello"}]}
STREAM = {"Accept": "text/event-stream"}


class Event:
    """One SSE event as a client sees it: its id, type and data."""

    def __init__(self, id: Optional[str], kind: str, data: str) -> None:
        self.id, self.kind, self.data = id, kind, data

    def json(self):
        return json.loads(self.data)

    def __repr__(self) -> str:
        return f"Event({self.id!r}, {self.kind!r}, {self.data[:60]!r})"


def events_of(resp: requests.Response, stop_after: Optional[int] = None) -> Tuple[List[Event], Optional[int]]:
    """The events of a stream (parsed by the WHATWG rules that matter here) and its ``retry:``, if any."""
    events: List[Event] = []
    retry = None
    buffer = b""
    fields: Dict[str, str] = {}
    for piece in read1_pieces(resp):
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode("utf-8")
            if text == "":
                if "data" in fields:
                    events.append(Event(fields.get("id"), fields.get("event", "message"), fields["data"]))
                    if stop_after is not None and len(events) >= stop_after:
                        return events, retry
                fields = {}
            elif text.startswith(":"):
                continue
            else:
                name, _, value = text.partition(": ")
                if name == "retry":
                    retry = int(value)
                else:
                    fields[name] = value
    return events, retry


def answer_tokens(events: List[Event]) -> str:
    return "".join(e.json() for e in events if e.kind == "message" and e.data != "[DONE]")


def seqs(events: List[Event], run_id: str) -> List[int]:
    out = []
    for event in events:
        if event.id is not None:
            run, _, seq = event.id.rpartition(".")
            assert run == run_id
            out.append(int(seq))
    return out


def start(base: str, **kwargs) -> requests.Response:
    resp = requests.post(f"{base}/v1/chat/stream", json=ASK, stream=True, timeout=20, **kwargs)
    assert resp.status_code == 200, resp.text
    return resp


def slow_reply(provider, words: int, every_s: float) -> None:
    steps = []
    for index in range(words):
        steps += [s.text(f"w{index} "), s.delay(every_s)]
    provider.add_turn(*steps)


@pytest.fixture
def closing():
    opened = []
    yield opened.append
    for thing in opened:
        thing.close()


def test_every_frame_has_the_runs_id_and_a_finished_run_answers_from_the_log(provider, logs, closing):
    provider.add_turn(*s.reply("Hello there", pieces=4))
    engine = make_engine(provider)
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new())) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        assert len(run_id) >= 22 and resp.headers["Location"] == f"/v1/runs/{run_id}/events"
        events, retry = events_of(resp)
        assert retry == 1000
        assert answer_tokens(events) == "Hello there"
        numbered = [e for e in events if e.data != "[DONE]"]
        assert seqs(numbered, run_id) == list(range(1, len(numbered) + 1))
        assert numbered[-1].kind == "done" and events[-1].data == "[DONE]"
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()
        assert status["state"] == "done" and status["answer"] == "Hello there"
        # A reader that has the terminal gets 204 (EventSource stops); one from the middle gets the rest.
        last = numbered[-1].id
        assert requests.get(f"{base}/v1/runs/{run_id}/events", headers={**STREAM, "Last-Event-ID": last},
                            timeout=5).status_code == 204
        again, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events?last_event_id={run_id}.2",
                                          headers=STREAM, stream=True, timeout=5))
        assert [(e.id, e.kind, e.data) for e in again] == [(e.id, e.kind, e.data) for e in events[2:]]


def test_a_dropped_client_resumes_the_same_run_with_last_event_id(provider, logs, closing):
    slow_reply(provider, 12, 0.05)
    engine = make_engine(provider)
    closing(engine)
    app = make_wsgi_app(engine, runs=logs.new(), on_disconnect="detach")
    with serving(app) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        first, _ = events_of(resp, stop_after=3)
        resp.close()  # the connection drops mid-answer
        rest, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events",
                                         headers={**STREAM, "Last-Event-ID": first[-1].id}, stream=True, timeout=20))
        both = first + rest
        assert answer_tokens(both) == "".join(f"w{i} " for i in range(12))
        numbered = [e for e in both if e.id]
        assert seqs(numbered, run_id) == list(range(1, len(numbered) + 1))
        assert [e.kind for e in numbered].count("done") == 1 and numbered[-1].kind == "done"
        assert provider.request_count == 1  # resumed, not asked again


def test_get_with_a_last_event_id_resumes_instead_of_asking_again(provider, logs, closing):
    provider.add_turn(*s.reply("once only", pieces=3))
    engine = make_engine(provider)
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new())) as base:
        events, _ = events_of(requests.get(f"{base}/v1/chat/stream?q=hi", headers=STREAM, stream=True, timeout=10))
        first_id = events[0].id
        run_id = first_id.rpartition(".")[0]
        again, _ = events_of(requests.get(f"{base}/v1/chat/stream?q=hi",
                                          headers={**STREAM, "Last-Event-ID": first_id}, stream=True, timeout=10))
        assert [e.id for e in again if e.id] == [e.id for e in events[1:] if e.id]
        done = requests.get(f"{base}/v1/chat/stream?q=hi", headers={**STREAM, "Last-Event-ID": events[-2].id},
                            timeout=10)
        assert done.status_code == 204 and provider.request_count == 1
        assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()["answer"] == "once only"


def test_stop_from_another_request_cancels_the_run_with_its_reason(provider, logs, closing):
    slow_reply(provider, 200, 0.05)
    engine = make_engine(provider)
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new())) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        events_of(resp, stop_after=2)
        stopped = requests.post(f"{base}/v1/runs/{run_id}/stop", timeout=5)
        assert stopped.status_code == 202
        began = time.monotonic()
        rest, _ = events_of(resp)
        assert time.monotonic() - began < 3
        terminal = [e for e in rest if e.id][-1]
        assert terminal.kind == "done" and terminal.json()["cancel_reason"] == "stopped"
        assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()["state"] == "cancelled"
        assert provider.wait_for_client_disconnects(1)


def test_unknown_expired_and_other_owners_runs_get_the_same_404(provider, logs, closing):
    provider.add_turn(*s.reply("mine", pieces=1))
    engine = make_engine(provider)
    closing(engine)
    app = make_wsgi_app(engine, runs=logs.new(), owner=lambda environ: environ.get("HTTP_X_USER", ""))
    with serving(app) as base:
        resp = start(base, headers={"X-User": "alice"})
        run_id = resp.headers["X-Run-Id"]
        events_of(resp)
        assert requests.get(f"{base}/v1/runs/{run_id}", headers={"X-User": "alice"}, timeout=5).status_code == 200
        bodies = []
        for rid, user in ((run_id, "mallory"), (new_run_id(), "alice")):
            for method, path in (("GET", ""), ("POST", "/stop"), ("GET", "/events")):
                got = requests.request(method, f"{base}/v1/runs/{rid}{path}", headers={**STREAM, "X-User": user},
                                       timeout=5)
                assert got.status_code == 404
                bodies.append(got.content)
        assert len(set(bodies)) == 1 and run_id.encode() not in bodies[0]
        assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).status_code == 401  # no owner at all


def test_a_dead_producer_is_closed_as_producer_lost_within_its_lease(provider, logs, closing):
    log = logs.new()
    engine = make_engine(provider)
    closing(engine)
    run_id = new_run_id()
    lease = log.create(run_id, "anonymous", lease_s=0.5)
    log.append(lease, [("token", '"partial "')])  # then its worker "dies": no more renewals
    with serving(make_wsgi_app(engine, runs=log)) as base:
        began = time.monotonic()
        events, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events", headers=STREAM, stream=True,
                                           timeout=10))
        assert time.monotonic() - began < 0.5 + 1.5
        assert [e.kind for e in events] == ["message", "error", "message"]
        assert events[1].json()["code"] == "producer_lost" and events[1].id == f"{run_id}.2"
        assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()["state"] == "lost"


def test_a_status_poll_alone_notices_a_dead_producer(provider, logs, closing):
    """A backend that only polls ``GET /v1/runs/<id>`` learns the run is lost, with no reader attached."""
    log = logs.new()
    engine = make_engine(provider)
    closing(engine)
    run_id = new_run_id()
    lease = log.create(run_id, "anonymous", lease_s=2.0)
    log.append(lease, [("token", '"partial "')])  # then its worker "dies": no more renewals
    with serving(make_wsgi_app(engine, runs=log)) as base:
        assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()["state"] == "running"

        def polled() -> dict:
            return requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()

        assert wait_for(lambda: polled()["state"] == "lost", timeout=10)
        assert polled()["terminal"]["data"]["code"] == "producer_lost"


def test_a_detached_run_nobody_comes_back_for_is_cancelled_as_abandoned(provider, logs, closing):
    slow_reply(provider, 400, 0.05)
    engine = make_engine(provider)
    closing(engine)
    app = make_wsgi_app(engine, runs=logs.new(), on_disconnect="detach", detach_grace_s=0.5)
    with serving(app) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        events_of(resp, stop_after=2)
        resp.close()
        deadline = time.monotonic() + 8
        state = "running"
        while state == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            state = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()["state"]
        status = requests.get(f"{base}/v1/runs/{run_id}", timeout=5).json()
        assert status["state"] == "cancelled", status
        assert status["terminal"]["data"]["cancel_reason"] == "abandoned"
        assert provider.wait_for_client_disconnects(1)


def test_shutdown_runs_ends_a_running_run_with_worker_shutdown(provider, logs, closing):
    slow_reply(provider, 400, 0.05)
    engine = make_engine(provider)
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new())) as base:
        resp = start(base)
        events_of(resp, stop_after=2)
        began = time.monotonic()
        assert shutdown_runs(2.0) == 1
        assert time.monotonic() - began < 2.5
        rest, _ = events_of(resp)
        terminal = [e for e in rest if e.id][-1]
        assert terminal.kind == "error" and terminal.json()["code"] == "worker_shutdown"
        assert rest[-1].data == "[DONE]"


def test_a_reader_past_the_logs_cap_gets_a_gap_not_a_silent_jump(provider, logs, closing):
    provider.add_turn(*s.reply("a b c d e f g h i j", pieces=10))
    engine = make_engine(provider)
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new(max_events=4))) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        events_of(resp)
        late, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events?last_event_id={run_id}.1",
                                         headers=STREAM, stream=True, timeout=10))
        assert late[0].kind == "gap"
        gap = late[0].json()
        assert gap["after_seq"] == 1 and gap["next_seq"] > 2 and gap["status"]["state"] == "done"
        assert late[1].id == f"{run_id}.{gap['next_seq']}" and late[-2].kind == "done"


@tool(side_effects=True)
def delete_file(path: str) -> str:
    """Delete a file (a side effect: asked about first)."""
    return f"deleted {path}"


@pytest.mark.parametrize("approved", [True, False])
def test_a_held_call_is_approved_or_refused_over_the_wire(provider, logs, closing, approved):
    provider.add_turn(*s.reply("sure " + block("delete_file", {"path": "/tmp/x"}), pieces=1))
    provider.add_turn(*s.reply("done", pieces=1))
    engine = make_engine(provider, tools=[delete_file])
    closing(engine)
    with serving(make_wsgi_app(engine, runs=logs.new(), approvals=True)) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        got: List[Event] = []
        for event in iter_events(resp):
            got.append(event)
            if event.kind == "approval_request":
                request = event.json()
                assert request["call"]["name"] == "delete_file"
                assert json.loads(request["call"]["arguments"]) == {"path": "/tmp/x"}
                assert request["expires_in_s"] > 0
                url = f"{base}/v1/runs/{run_id}/approvals/{request['call']['id']}"
                answer = requests.post(url, json={"approved": approved, "reason": "why not"}, timeout=5)
                assert answer.status_code == 200 and answer.json()["approved"] is approved
                later = requests.post(url, json={"approved": not approved}, timeout=5).json()
                assert later["approved"] is approved  # the first answer wins
        results = [e.json() for e in got if e.kind == "tool_result"]
        assert len(results) == 1
        assert results[0]["ok"] is approved
        assert results[0]["skipped"] == (None if approved else "not_approved")
        assert got[-1].data == "[DONE]"


def iter_events(resp: requests.Response):
    """Events as they arrive (for tests that answer mid-stream)."""
    buffer = b""
    fields: Dict[str, str] = {}
    for piece in read1_pieces(resp):
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode("utf-8")
            if text == "":
                if "data" in fields:
                    yield Event(fields.get("id"), fields.get("event", "message"), fields["data"])
                fields = {}
            elif not text.startswith(":"):
                name, _, value = text.partition(": ")
                fields[name] = value


def test_approvals_and_approve_together_are_refused(provider, closing):
    from streamengine import ConfigError
    from streamengine.runs import MemoryRunLog

    engine = make_engine(provider)
    closing(engine)
    with pytest.raises(ConfigError, match="not both"):
        make_wsgi_app(engine, runs=MemoryRunLog(), approvals=True, approve=lambda call, environ: True)
    with pytest.raises(ConfigError, match="needs a run log"):
        make_wsgi_app(engine, approvals=True)


@pytest.mark.parametrize("on_disconnect", ["detach", "cancel"])
def test_a_reader_that_reads_nothing_loses_its_connection_and_the_run_detaches_or_ends(provider, on_disconnect):
    provider.add_turn(*[s.text("x" * 1023 + "\n")] * 8192)  # 8 MB: more than serve's buffers on the way hold
    engine = make_engine(provider, max_answer_chars=10 ** 9, max_run_output_chars=10 ** 9)
    log = MemoryRunLog(max_bytes=64 << 20, max_events=100_000)
    try:
        with served(engine, runs=log, on_disconnect=on_disconnect, stuck_reader_timeout_s=1.0) as url:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", int(url.rstrip("/").rsplit(":", 1)[1])))
            body = json.dumps(ASK).encode()
            sock.sendall(b"POST /v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            head = sock.recv(4096).decode("latin-1")
            run_id = head.split("X-Run-Id: ", 1)[1].split("\r\n", 1)[0]
            try:
                deadline = time.monotonic() + 30
                state = "running"
                while state == "running" and time.monotonic() < deadline:
                    time.sleep(0.05)
                    state = log.status(run_id, "anonymous").state
                status = log.status(run_id, "anonymous")
                if on_disconnect == "detach":  # the run went on without its client, into the log
                    assert state == "done" and len(json.loads(status.terminal.data)["answer"]) == 8192 * 1024
                else:
                    assert state == "cancelled"
                    assert json.loads(status.terminal.data)["cancel_reason"] == "stuck_reader"
                assert connection_ends(sock), "the stuck reader's connection stayed open"
            finally:
                sock.close()
    finally:
        engine.close()


def connection_ends(sock: socket.socket) -> bool:
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_detached_runs_count_in_the_stream_limits_and_have_their_own_per_client_cap(provider):
    for _ in range(3):
        slow_reply(provider, 400, 0.05)
    engine = make_engine(provider)
    log = MemoryRunLog()
    app = make_wsgi_app(engine, runs=log, on_disconnect="detach", max_streams=2, max_detached_per_client=1)
    try:
        with serving(app) as base:
            runs = []
            for _ in range(2):
                resp = start(base)
                runs.append(resp.headers["X-Run-Id"])
                events_of(resp, stop_after=2)
                resp.close()
                deadline = time.monotonic() + 10
                while app.active_streams and time.monotonic() < deadline:
                    time.sleep(0.02)
            # The first went on detached; the second was over this client's cap, so it was cancelled.
            assert log.status(runs[0], "anonymous").state == "running"
            deadline = time.monotonic() + 10
            while log.status(runs[1], "anonymous").state == "running" and time.monotonic() < deadline:
                time.sleep(0.02)
            second = log.status(runs[1], "anonymous")
            assert second.state == "cancelled" and json.loads(second.terminal.data)["cancel_reason"] == "disconnected"
            held = start(base)  # one open stream + one detached run: the server's two
            refused = requests.post(f"{base}/v1/chat/stream", json=ASK, timeout=10)
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            assert "without their client" in refused.json()["error"]
            held.close()
            requests.post(f"{base}/v1/runs/{runs[0]}/stop", timeout=5)
            deadline = time.monotonic() + 10
            while log.status(runs[0], "anonymous").state == "running" and time.monotonic() < deadline:
                time.sleep(0.02)
            assert json.loads(log.status(runs[0], "anonymous").terminal.data)["cancel_reason"] == "stopped"
    finally:
        engine.close()


class CountingLog(MemoryRunLog):
    """A memory log that keeps each append's event names (how the producer batched them) and counts stop polls."""

    def __init__(self, **limits) -> None:
        super().__init__(**limits)
        self.appends: List[List[str]] = []
        self.stop_polls = 0

    def append_and_poll(self, lease, events):
        self.appends.append([name for name, _ in events])
        return super().append_and_poll(lease, events)

    def stop_requested(self, lease):
        self.stop_polls += 1
        return super().stop_requested(lease)


def test_a_longer_append_window_joins_a_chats_paced_tokens_into_fewer_appends(provider):
    provider.add_turn(*[step for i in range(30) for step in (s.text(f"t{i} "), s.delay(0.03))])
    provider.add_turn(*[step for i in range(30) for step in (s.text(f"t{i} "), s.delay(0.03))])
    engine = make_engine(provider)
    counts = {}
    try:
        for window in (0.02, 0.1):
            log = CountingLog()
            with serving(make_wsgi_app(engine, runs=log, append_window_s=window)) as base:
                events, _ = events_of(start(base))
            assert answer_tokens(events) == "".join(f"t{i} " for i in range(30))
            counts[window] = sum(1 for names in log.appends if "token" in names)
        assert counts[0.02] >= 25  # 30 ms apart: past a 20 ms window, nearly every token is its own append
        assert counts[0.1] <= 15, counts  # a 100 ms window joins about three of them
        with pytest.raises(ConfigError, match="append_window_s"):
            make_wsgi_app(engine, runs=MemoryRunLog(), append_window_s=0)
    finally:
        engine.close()


def test_a_producer_that_appends_learns_of_a_stop_from_its_appends_and_polls_only_when_quiet(provider):
    provider.add_turn(*[step for i in range(40) for step in (s.text(f"t{i} "), s.delay(0.03))], s.delay(1.0),
                      *[step for i in range(200) for step in (s.text("x "), s.delay(0.03))])
    engine = make_engine(provider)
    log = CountingLog()
    try:
        with serving(make_wsgi_app(engine, runs=log)) as base:
            resp = start(base)
            run_id = resp.headers["X-Run-Id"]
            events, polls_at = [], {}
            for event in iter_events(resp):
                events.append(event)
                tokens = sum(1 for e in events if e.kind == "message" and e.data != "[DONE]")
                polls_at.setdefault(tokens, log.stop_polls)
                if tokens == 41 and "quiet" not in polls_at:
                    polls_at["quiet"] = log.stop_polls
                    requests.post(f"{base}/v1/runs/{run_id}/stop", timeout=5)
        assert polls_at[40] == polls_at[1]  # 1.2 s of tokens 30 ms apart: each append read the flag
        assert polls_at["quiet"] - polls_at[40] >= 2  # the second of quiet: polled every 0.25 s
        done = json.loads(log.status(run_id, "anonymous").terminal.data)
        assert done["cancel_reason"] == "stopped"
        assert answer_tokens(events).count("x ") < 30  # stopped by the next append's flag, not at the end
    finally:
        engine.close()


def test_tokens_close_together_share_an_append_and_the_first_after_a_pause_goes_alone(provider):
    steps = [step for i in range(60) for step in (s.text(f"t{i} "), s.delay(0.003))]
    provider.add_turn(*steps, s.delay(0.3), s.text("after the pause"))
    engine = make_engine(provider)
    log = CountingLog()
    try:
        with serving(make_wsgi_app(engine, runs=log)) as base:
            events, _ = events_of(start(base))
        assert answer_tokens(events) == "".join(f"t{i} " for i in range(60)) + "after the pause"
        token_appends = [names for names in log.appends if "token" in names]
        assert sum(len(names) for names in token_appends) == 61
        assert len(token_appends) < 61 / 2, log.appends  # coalesced: far fewer appends than tokens
        assert log.appends[-1] == ["token"]  # the token after the pause went out alone, at once
    finally:
        engine.close()


def test_every_run_route_passes_the_host_site_and_authorize_checks(provider):
    provider.add_turn(*s.reply("hi", pieces=1))
    engine = make_engine(provider)
    allowed = {"yes": True}
    app = make_wsgi_app(engine, runs=MemoryRunLog(), authorize=lambda environ: allowed["yes"], approvals=True)
    try:
        with serving(app) as base:
            resp = start(base)
            run_id = resp.headers["X-Run-Id"]
            events_of(resp)
            routes = [("GET", f"/v1/runs/{run_id}", None), ("GET", f"/v1/runs/{run_id}/events", None),
                      ("POST", f"/v1/runs/{run_id}/stop", None),
                      ("POST", f"/v1/runs/{run_id}/approvals/call_1", {"approved": True})]
            for method, path, body in routes:
                got = requests.request(method, base + path, json=body, headers={**STREAM, "Host": "evil.example"},
                                       timeout=5)
                assert got.status_code in (400, 403) and got.json()["field"] == "Host", (path, got.text)
                got = requests.request(method, base + path, json=body, timeout=5,
                                       headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
                assert got.status_code == 403, (path, got.text)  # a status poll too: it may take a lost run over
            allowed["yes"] = False
            for method, path, body in routes:
                got = requests.request(method, base + path, json=body, headers=STREAM, timeout=5)
                assert got.status_code == 401, (path, got.text)
    finally:
        engine.close()


def test_an_unanswered_approval_request_is_refused_at_its_timeout_and_owners_are_checked(provider):
    provider.add_turn(*s.reply("sure " + block("delete_file", {"path": "/tmp/y"}), pieces=1))
    provider.add_turn(*s.reply("not done", pieces=1))
    engine = make_engine(provider, tools=[delete_file], approval_timeout=0.5)
    app = make_wsgi_app(engine, runs=MemoryRunLog(), approvals=True,
                        owner=lambda environ: environ.get("HTTP_X_USER", ""))
    try:
        with serving(app) as base:
            resp = start(base, headers={"X-User": "alice"})
            run_id = resp.headers["X-Run-Id"]
            got = []
            for event in iter_events(resp):
                got.append(event)
                if event.kind == "approval_request":
                    assert event.json()["expires_in_s"] == 0.5
                    call_id = event.json()["call"]["id"]
                    other = requests.post(f"{base}/v1/runs/{run_id}/approvals/{call_id}", json={"approved": True},
                                          headers={"X-User": "mallory"}, timeout=5)
                    assert other.status_code == 404  # not hers: the same 404 as an unknown run
            results = [e.json() for e in got if e.kind == "tool_result"]
            assert len(results) == 1 and results[0]["skipped"] == "not_approved"
    finally:
        engine.close()


def test_a_finished_run_is_gone_after_its_retention(provider):
    provider.add_turn(*s.reply("short-lived", pieces=1))
    engine = make_engine(provider)
    try:
        with serving(make_wsgi_app(engine, runs=MemoryRunLog(), retain_s=0.3)) as base:
            resp = start(base)
            run_id = resp.headers["X-Run-Id"]
            events_of(resp)
            assert requests.get(f"{base}/v1/runs/{run_id}", timeout=5).status_code == 200
            deadline = time.monotonic() + 5
            while requests.get(f"{base}/v1/runs/{run_id}", timeout=5).status_code == 200:
                assert time.monotonic() < deadline, "the run outlived its retention"
                time.sleep(0.05)
            assert requests.get(f"{base}/v1/runs/{run_id}/events", headers=STREAM, timeout=5).status_code == 404
    finally:
        engine.close()


def test_memory_stays_flat_over_a_100000_token_run(provider, closing):
    """The log keeps no more of a long run than its caps; what grows is only the answer the engine keeps.

    Between the 10,000th frame and the 99,000th, what streamengine's code
    allocated and still holds grows by less than 2 MB: the 89,000 frames in
    between (about 100 bytes each with their records) would be several times
    that if the log kept them past ``max_events``/``max_bytes``.  (The
    server's output buffer is waitress's, bounded by its own settings.)
    """
    import tracemalloc

    provider.add_turn(*[s.text("w ") for _ in range(100_000)])
    engine = make_engine(provider, idle_timeout=60.0, completion_timeout=120.0)  # tracemalloc slows the run
    closing(engine)
    log = MemoryRunLog(max_events=2_000, max_bytes=256 << 10)
    with serving(make_wsgi_app(engine, runs=log)) as base:
        resp = start(base)
        run_id = resp.headers["X-Run-Id"]
        seq, grown, ids = 0, None, re.compile(rb"id: [\w-]+\.(\d+)\n")
        for piece in read1_pieces(resp):  # a frame's id says how far the run went (a reader past the cap skips)
            before = seq
            seq = max([seq, *map(int, ids.findall(piece))])
            if before < 10_000 <= seq:
                tracemalloc.start()
            elif before < 99_000 <= seq and grown is None:
                ours = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/streamengine/*")])
                grown = sum(stat.size for stat in ours.statistics("filename"))
                tracemalloc.stop()
        assert seq > 100_000 and grown is not None, piece[-300:]  # the end of the stream says why
        assert grown < 2_000_000, f"{grown:,} bytes still held after 90,000 more tokens"
        late, _ = events_of(requests.get(f"{base}/v1/runs/{run_id}/events?last_event_id={run_id}.1",
                                         headers=STREAM, stream=True, timeout=30))
        assert late[0].kind == "gap" and len(late) <= 2_000 + 2  # the cap's frames, the gap, [DONE]
