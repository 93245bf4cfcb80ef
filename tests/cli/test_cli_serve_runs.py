"""``streamengine serve --runs URL --detach-grace S``: runs in a log, resumed after a restart, ended on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from streamengine import ConfigError
from streamengine.runs import MemoryRunLog, SqliteRunLog, open_run_log
from streamengine.testing import FakeProvider, RunClient
from streamengine.testing import steps as s

ROOT = Path(__file__).resolve().parents[2]


def start_serve(fp: FakeProvider, *args: str) -> tuple:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    serve = subprocess.Popen([sys.executable, "-m", "streamengine", "serve", "--port", "0", "-m", "m",
                              "--base-url", fp.base_url, *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    first = serve.stdout.readline()
    if "serving on" not in first:  # it did not start: end it before reading what it said (read would block)
        serve.kill()
        _, err = serve.communicate(timeout=30)
        raise AssertionError(first + err)
    return serve, first.split("serving on ")[1].split()[0].rstrip("/")


def test_sigterm_ends_a_running_run_with_worker_shutdown_and_the_log_keeps_it(tmp_path):
    url = f"sqlite:///{tmp_path}/runs.sqlite"  # four slashes: an absolute path
    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(400) for step in (s.text(f"w{i} "), s.delay(0.05))])
        serve, base = start_serve(fp, "--runs", url, "--detach-grace", "30")
        try:
            client = RunClient(base)
            events = client.start([{"role": "user", "content": "count"}])
            assert next(e for e in events if e.event == "message")
            serve.send_signal(signal.SIGTERM)
            began = time.monotonic()
            rest = list(events)
            assert time.monotonic() - began < 8
            assert rest[-1].event == "error" and rest[-1].json()["code"] == "worker_shutdown"
            out, err = serve.communicate(timeout=30)
            assert serve.returncode == 0 and "stopped" in out, err
            # The log outlives the server: a new one serves the finished run from it.
            serve, base = start_serve(fp, "--runs", url)
            status = RunClient(base).status(client.run_id)
            assert status["state"] == "failed" and status["terminal"]["data"]["code"] == "worker_shutdown"
        finally:
            if serve.poll() is None:
                serve.send_signal(signal.SIGTERM)
                serve.communicate(timeout=30)


@pytest.mark.parametrize("flags, ending", [((), "done"), (("--no-take-over",), "error")])
def test_a_run_of_a_killed_serve_is_taken_over_by_another_sharing_its_log_unless_told_not_to(tmp_path, flags,
                                                                                            ending):
    url = f"sqlite:///{tmp_path}/runs.sqlite"
    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(400) for step in (s.text(f"w{i} "), s.delay(0.05))])
        fp.add_turn(s.text("Again, briefly."), s.finish())
        first, base = start_serve(fp, "--runs", url, *flags)
        second, other = start_serve(fp, "--runs", url, *flags)
        try:
            client = RunClient(base)
            events = client.start([{"role": "user", "content": "count"}])
            assert next(e for e in events if e.event == "message")
            first.kill()  # kill -9: no shutdown, its lease runs out
            first.communicate(timeout=30)
            rest = list(RunClient(other, timeout_s=30).follow(client.run_id, client.last_event_id))
        finally:
            for serve in (first, second):
                if serve.poll() is None:
                    serve.send_signal(signal.SIGTERM)
                    serve.communicate(timeout=30)
    assert rest[-1].event == ending
    if ending == "done":
        assert [e.json()["round"] for e in rest if e.event == "reset"] == [1]
        assert rest[-1].json()["answer"] == "Again, briefly."
    else:
        assert rest[-1].json()["code"] == "producer_lost" and fp.request_count == 1


def test_open_run_log_reads_each_url_form(tmp_path):
    assert isinstance(open_run_log("memory:"), MemoryRunLog)
    log = open_run_log(f"sqlite:///{tmp_path}/a.sqlite")
    assert isinstance(log, SqliteRunLog) and log.path == f"{tmp_path}/a.sqlite"
    log.close()
    for bad in ("", "ftp://host/x", "sqlite://"):
        with pytest.raises(ConfigError, match="run log URL"):
            open_run_log(bad)


TOOLS = '''
from streamengine.tools import tool


@tool(side_effects=True)
def delete_file(path: str) -> str:
    """Delete a file (a side effect: the client is asked)."""
    return f"deleted {path}"
'''


def stopped(serve: subprocess.Popen) -> str:
    serve.send_signal(signal.SIGTERM)
    _, err = serve.communicate(timeout=30)
    return err


@pytest.mark.parametrize("approved", [True, False])
def test_approve_ask_lets_the_client_approve_or_deny_a_held_call(tmp_path, approved):
    tools = tmp_path / "writes.py"
    tools.write_text(TOOLS)
    with FakeProvider() as fp:
        fp.add_turn(s.text("Deleting. "),
                    s.tool_call(0, id="call_1", name="delete_file", arguments='{"path": "/tmp/x"}'),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("Done."))
        serve, base = start_serve(fp, "--runs", "memory:", "--approve", "ask", "--tools", str(tools))
        try:
            client = RunClient(base)
            events = client.start([{"role": "user", "content": "delete /tmp/x"}])
            asked = next(e for e in events if e.event == "approval_request").json()
            assert asked["call"]["name"] == "delete_file" and asked["expires_in_s"] > 0
            assert client.answer(asked["call"]["id"], approved, "not today") is approved
            result = next(e for e in events if e.event == "tool_result").json()
            assert result["ok"] is approved and (result["text"] == "deleted /tmp/x") is approved
            assert result["skipped"] == (None if approved else "not_approved")
            assert [e.event for e in events][-1] == "done"
        finally:
            err = stopped(serve)
        assert "wait for the client's Approve or Deny" in err and "delete_file" in err


def test_parts_lets_a_request_bring_the_kinds_it_names():
    from parts_support import PNG_URL

    ask = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What bird?"},
                                                      {"type": "image_url", "image_url": {"url": PNG_URL}}]}]}
    with FakeProvider() as fp:
        fp.add_turn(s.text("A heron."))
        for flags, status in ((["--parts", "image"], 200), ([], 400)):
            serve, base = start_serve(fp, *flags)
            try:
                resp = requests.post(f"{base}/v1/chat/stream", json=ask, timeout=10)
                assert resp.status_code == status, resp.text
            finally:
                stopped(serve)
        assert [r.parts for r in fp.requests] == [[{"type": "image_url", "image_url": {"url": PNG_URL}}]]
        assert "PartsPolicy(allow=('image',))" in resp.json()["error"]
