"""The web layer's typed contracts hold: what a type checker is told matches what runs, and user code type-checks."""
import inspect
import json
import os
import pathlib
import subprocess
import sys

import pytest
from wsgi_support import call, environ_for

from streamengine import DoneEvent, EngineResult, StreamingEngine, TokenEvent
from streamengine.web import AppOptions, RunOptions, StreamApp, make_wsgi_app, serve


def test_app_options_name_every_option_of_the_app_but_approve():
    """``serve(engine, **options)`` is checked against AppOptions: it must list StreamApp's options exactly."""
    parameters = inspect.signature(StreamApp.__init__).parameters
    options = {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY} - {"approve"}
    assert set(AppOptions.__annotations__) == options
    assert AppOptions.__total__ is False
    assert all(parameters[name].default is not inspect.Parameter.empty for name in options)  # all optional


def test_serve_takes_approve_itself_and_passes_the_rest_on():
    parameters = inspect.signature(serve).parameters
    assert "approve" in parameters
    assert parameters["app_options"].kind is inspect.Parameter.VAR_KEYWORD


def test_run_options_are_what_a_streaming_engine_run_takes():
    """The app passes RunOptions as keywords to run(): each one a parameter of it."""
    assert set(RunOptions.__annotations__) <= set(inspect.signature(StreamingEngine.run).parameters)


def test_an_engine_of_your_own_with_run_only_streams_and_gets_the_scope_it_asks_for():
    """EngineLike needs run(messages, cancel, *, heartbeat_s) only; a scope= app adds conversation_id=."""
    seen = []

    class Echo:
        def run(self, messages, cancel, *, heartbeat_s=None, conversation_id=None):
            seen.append(conversation_id)
            yield TokenEvent(messages[-1].content)
            yield DoneEvent(EngineResult(answer=messages[-1].content))

    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    status, _, data = call(make_wsgi_app(Echo(), scope=lambda environ: "tenant:a"),
                           environ_for("POST", "/v1/chat/stream", body))
    assert status.startswith("200") and b'data: "hi"' in data and seen == ["tenant:a"]


USER_CODE = '''\
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from flask import Flask

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, ToolCall, enable_logging
from streamengine.mcp import McpServer, McpTool
from streamengine.rag import OpenAIEmbedder, SqliteRagStore
from streamengine.testing import FakeProvider, Step, steps as s
from streamengine.web import make_wsgi_app, mount, serve

enable_logging("INFO", sink=lambda message: print(message.record["message"]))


def tenant(environ: Dict[str, Any]) -> Optional[str]:
    user = environ.get("REMOTE_USER")
    return user if isinstance(user, str) else None


def approve(call: ToolCall, environ: Dict[str, Any]) -> bool:
    return call.name == "send_mail" and environ.get("REMOTE_USER") == "admin"


def time_tools() -> List[McpTool]:
    with McpServer.stdio("mcp-server-time", "--local-timezone", "UTC", env={"TZ": "UTC"}) as server:
        return server.tools(prefix="time_", eager={"get_current_time"}, timeout=5.0)


def turn() -> List[Step]:
    return [*s.reply("Hello there", pieces=3), s.finish("stop")]


embedder = OpenAIEmbedder(OpenAICompatibleClient("http://127.0.0.1:9/v1", "k"), "text-embedding-3-small")
with FakeProvider(wire="anthropic", framing="length") as fp, SqliteRagStore(Path("rag.db"), embedder) as store:
    fp.add_turn(turn(), s.usage(3, 4))
    fp.respond_with(lambda request: [s.text(str(request.get("model")))])
    engine = StreamingEngine(OpenAICompatibleClient(fp.base_url, "k"), [], EngineConfig(models=["m"]))
    app = make_wsgi_app(engine, scope=tenant, approve=approve, authorize=lambda environ: True)
    flask_app = Flask(__name__)
    flask_app.wsgi_app = mount(flask_app.wsgi_app, "/chat", app)  # type: ignore[method-assign]  # Flask's way
    hits: int = store.count()
    serve(engine, port=0, max_streams=4, heartbeat_s=None, allow_origin=["https://app.example"])
    serve(engine, max_stream=4)  # MISTAKE: a misspelt option
    FakeProvider(wire="gemini")  # MISTAKE: no such wire
'''


@pytest.mark.timeout(300)
def test_user_code_type_checks_and_a_misspelt_option_does_not(tmp_path):
    """mypy --strict on code that serves an engine: clean but for the two mistakes it is meant to catch."""
    pytest.importorskip("mypy", reason="mypy 2 runs on Python 3.10+ only (the check extra installs it there)")
    (tmp_path / "user.py").write_text(USER_CODE, encoding="utf-8")
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports", "silent", "--cache-dir",
         str(tmp_path / ".mypy_cache"), "--no-error-summary", "--show-error-codes", "user.py"],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(root)}, capture_output=True, text=True, timeout=240,
        check=False)
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    mistakes = [str(n) for n, line in enumerate(USER_CODE.splitlines(), 1) if "# MISTAKE" in line]
    assert [line.split(":")[1] for line in errors] == mistakes, done.stdout + done.stderr
    assert '"max_stream"' in errors[0] and "gemini" in errors[1] and "Literal['openai'" in errors[1]
