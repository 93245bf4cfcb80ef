"""``streamengine.testing.RunClient``: it follows a served run to its terminal frame across dropped connections."""
from __future__ import annotations

import pytest
from wsgi_support import CutAfter, block, make_engine, serving

from streamengine.runs import SqliteRunLog
from streamengine.testing import RunClient, RunClientError
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")


@pytest.fixture
def engine(provider):
    engine = make_engine(provider)
    yield engine
    engine.close()


def test_run_client_reconnects_with_last_event_id_until_the_terminal_frame(provider, engine, tmp_path):
    words = [f"w{i} " for i in range(25)]
    provider.add_turn(*[step for word in words for step in (s.text(word), s.delay(0.1))])
    log = SqliteRunLog(str(tmp_path / "runs.sqlite"))
    cut = CutAfter(make_wsgi_app(engine, runs=log, on_disconnect="detach"), writes=4)
    with serving(cut) as base, RunClient(base) as client:
        events = list(client.start([{"role": "user", "content": "count"}]))
        assert cut.cuts >= 2 and client.reconnects >= 2
        assert "".join(e.json() for e in events if e.event == "message") == "".join(words)
        seqs = [int(e.id.rpartition(".")[2]) for e in events]
        assert seqs == list(range(1, len(events) + 1))  # every frame once, in order
        assert events[-1].event == "done" and events[-1].terminal
        assert client.status()["answer"] == "".join(words)
        assert list(client.follow(client.run_id, events[-1].id)) == []  # 204: it has the terminal
        assert provider.request_count == 1
    log.close()


def test_run_client_stops_and_answers_approvals(provider, tmp_path):
    @tool(side_effects=True)
    def send_mail(to: str) -> str:
        """Send a mail."""
        return f"sent to {to}"

    provider.add_turn(*s.reply("ok " + block("send_mail", {"to": "bob"}), pieces=1))
    provider.add_turn(*s.reply("mail sent", pieces=1))
    engine = make_engine(provider, tools=[send_mail])
    log = SqliteRunLog(str(tmp_path / "runs.sqlite"))
    try:
        with serving(make_wsgi_app(engine, runs=log, approvals=True)) as base, RunClient(base) as client:
            seen = []
            for event in client.start([{"role": "user", "content": "mail bob"}]):
                seen.append(event.event)
                if event.event == "approval_request":
                    assert client.answer(event.json()["call"]["id"], True, "fine") is True
            assert seen.count("tool_result") == 1 and seen[-1] == "done"
            assert client.status()["answer"] == "mail sent"
            with pytest.raises(RunClientError, match="HTTP 404"):
                client.stop("no-such-run-id")
    finally:
        engine.close()
        log.close()


def test_run_client_says_when_the_server_does_not_serve_runs(provider, engine):
    provider.add_turn(*s.reply("hi", pieces=1))
    with serving(make_wsgi_app(engine)) as base, RunClient(base) as client, \
            pytest.raises(RunClientError, match="runs="):
        client.start([{"role": "user", "content": "hi"}])


def test_run_client_gives_up_after_its_reconnects_naming_the_last_cause():
    import socket

    import requests

    with socket.socket() as probe:  # a port nobody listens on: every reconnect is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = RunClient(f"http://127.0.0.1:{port}", max_reconnects=2)
    client.retry_ms = 10
    with pytest.raises(RunClientError, match="3 reconnects in a row brought nothing") as caught:
        list(client.follow("r" * 22, "r" * 22 + ".3"))
    assert isinstance(caught.value.__cause__, requests.ConnectionError)
    assert "Connection refused" in str(caught.value) or "Max retries" in str(caught.value)
