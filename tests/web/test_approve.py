"""``make_wsgi_app(engine, approve=...)``: the application's yes for each side-effect call of a served run.

``approve(call, environ) -> bool`` is asked on the thread driving the run
(the server's), for each side-effect call, with the request's environ, so
the application can decide per user; it reaches the engine per run as
``engine.run(..., approve=lambda call: approve(call, environ))``.
Without it the engine's own hook decides (and an engine without one refuses).
"""
from __future__ import annotations

import io
import json
import queue
import threading
from typing import Any, Callable, List, Optional

import pytest
import requests
from wsgi_support import block, call, environ_for, serving, sse

from streamengine import ConfigError, EngineConfig, OpenAICompatibleClient, Run, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.web import serve
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = json.dumps({"messages": [{"role": "user", "content": "delete the file"}]}).encode()


class Recorder:
    """An engine stand-in that keeps what each run was given."""

    def __init__(self) -> None:
        self.runs: List[dict] = []

    def run(self, messages, cancel=None, *, heartbeat_s=None, approve=None, **options):
        self.runs.append(dict(options, approve=approve))
        return iter(())


class RunOnly:
    """An engine of your own with ``run()`` only, which knows nothing of approval."""

    def run(self, messages, cancel=None, *, heartbeat_s=None):
        return iter(())


def test_the_apps_approve_reaches_the_run_with_the_requests_environ():
    engine, asked = Recorder(), []
    app = make_wsgi_app(engine, approve=lambda call, environ: asked.append((call, environ["HTTP_X_USER"])) or True)
    status, _, _ = call(app, environ_for("POST", "/v1/chat/stream", ASK, HTTP_X_USER="alice"))
    assert status == "200 OK" and len(engine.runs) == 1
    per_run = engine.runs[0]["approve"]
    assert per_run("the call") is True and asked == [("the call", "alice")]


def test_without_approve_the_engine_decides():
    engine = Recorder()
    call(make_wsgi_app(engine), environ_for("POST", "/v1/chat/stream", ASK))
    assert engine.runs == [{"approve": None}]  # not passed: the engine's own hook (or its refusal) holds


@pytest.mark.parametrize("approve", ["all", True, 1])
def test_approve_must_be_a_function(approve):
    with pytest.raises(ConfigError, match="approve"):
        make_wsgi_app(Recorder(), approve=approve)


def test_approve_needs_an_engine_whose_runs_take_it():
    """An engine that would ignore the hook (or fail on every run) is refused when the app is made."""
    with pytest.raises(ConfigError, match="approve"):
        make_wsgi_app(RunOnly(), approve=lambda call, environ: True)
    make_wsgi_app(RunOnly())  # without approve it serves as before


def test_serve_passes_approve_to_its_app():
    engine, asked, urls, stop = Recorder(), [], queue.Queue(), threading.Event()
    server = threading.Thread(target=serve, args=(engine,), name="test-serve", kwargs={
        "port": 0, "threads": 4, "out": io.StringIO(), "stop": stop, "ready": urls.put,
        "approve": lambda call, environ: asked.append((call, environ["HTTP_X_USER"])) is None})
    server.start()
    try:
        resp = requests.post(f"{urls.get(timeout=10)}v1/chat/stream", data=ASK, timeout=10,
                             headers={"Content-Type": "application/json", "X-User": "alice"})
        assert resp.status_code == 200
    finally:
        stop.set()
        server.join(15)
    assert engine.runs[0]["approve"]("the call") is True and asked == [("the call", "alice")]


# --- end to end, a real engine under waitress --------------------------------------------------------

def delete_tool(ran: List[str]) -> Any:
    @tool(side_effects=True)
    def delete(path: str) -> str:
        """Deletes a file."""
        ran.append(path)
        return f"deleted {path}"

    return delete


def turns(fp: FakeProvider) -> None:
    fp.add_turn(s.text("Deleting. " + block("delete", {"path": "notes.txt"})))
    fp.add_turn(s.text("Answered."))


def ask(url: str, user: str) -> List[Any]:
    with requests.post(f"{url}/v1/chat/stream", data=ASK, headers={"Content-Type": "application/json",
                                                                    "X-User": user}, stream=True, timeout=15) as resp:
        assert resp.status_code == 200
        return sse(resp)


def tool_results(events: List[Any]) -> List[dict]:
    return [json.loads(data) for kind, data in events if kind == "tool_result"]


def config() -> EngineConfig:
    return EngineConfig(models=["m"], idle_timeout=5.0, completion_timeout=10.0)


class PerRunApprove:
    """``run(approve=)`` as the approval contract specifies it, built from an engine-wide ``approve``.

    Until the engine takes ``approve=`` per run, each run here gets an engine of
    its own made with the run's hook (sharing the client), closed when the run ends.
    """

    def __init__(self, client: Any, tools: List[Any]) -> None:
        self.client, self.tools = client, tools

    def run(self, messages, cancel=None, *, heartbeat_s=None, approve=None):
        engine = StreamingEngine(self.client, self.tools, config(), approve=approve or (lambda call: False))

        def batches():
            try:
                yield from engine.run(messages, cancel, heartbeat_s=heartbeat_s).batches()
            finally:
                engine.close()
        return Run(batches())


def test_a_served_side_effect_call_runs_only_when_the_apps_approve_says_yes_for_that_request():
    ran: List[str] = []
    asked: List[tuple] = []

    def approve(call: Any, environ: dict) -> bool:
        asked.append((call.name, environ.get("HTTP_X_USER"), threading.current_thread().name))
        return environ.get("HTTP_X_USER") == "alice"

    with FakeProvider() as fp:
        turns(fp)
        turns(fp)
        engine = PerRunApprove(OpenAICompatibleClient(fp.base_url), [delete_tool(ran)])
        with serving(make_wsgi_app(engine, approve=approve, expose_errors=True)) as url:
            refused = tool_results(ask(url, "mallory"))
            approved = tool_results(ask(url, "alice"))
        engine.client.close()
    assert ran == ["notes.txt"]  # alice's run only
    assert [(name, user) for name, user, _ in asked] == [("delete", "mallory"), ("delete", "alice")]
    assert all(thread == "streamengine-approve" for _, _, thread in asked)  # asked off the run's thread
    assert refused[0]["ok"] is False and "not approved" in json.dumps(refused[0])
    assert approved[0]["ok"] is True


def served_engine_runs(approve: Optional[Callable[[Any, dict], bool]], user: str):
    """One run of a real StreamingEngine (no approve of its own) served with the app's ``approve``."""
    ran: List[str] = []
    with FakeProvider() as fp:
        turns(fp)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), [delete_tool(ran)], config()) as engine, \
                serving(make_wsgi_app(engine, approve=approve)) as url:
            return ran, tool_results(ask(url, user))


def test_approval_contract_end_to_end_with_the_real_engine():
    """The approval contract (issue 35) over HTTP with the real engine's ``run(approve=)``.

    Without the app's approve, the engine has none: the side-effect call is
    refused and its result says why, machine-readably (``skipped``); with it,
    the request's environ decides.
    """
    ran, results = served_engine_runs(None, "alice")
    assert ran == [] and results[0]["ok"] is False and results[0]["skipped"] == "not_approved"
    ran, results = served_engine_runs(lambda call, environ: environ["HTTP_X_USER"] == "alice", "mallory")
    assert ran == [] and results[0]["skipped"] == "not_approved"
    ran, results = served_engine_runs(lambda call, environ: environ["HTTP_X_USER"] == "alice", "alice")
    assert ran == ["notes.txt"] and results[0]["ok"] is True and results[0]["skipped"] is None
