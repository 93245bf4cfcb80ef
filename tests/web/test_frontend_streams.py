"""The frontends' streams at the byte level: how they end, what each AI SDK version may contain, the options.

What the real clients make of these streams is tests/web/test_frontends.py;
here are the cases a client cannot show: a run that raises or stops without
its ``done``, and the chunk types and keys each version is allowed.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import pytest
import requests
from conftest import wait_for
from wsgi_support import Silent, call, environ_for, make_engine, read1_pieces, serving

from streamengine import ConfigError, TokenEvent
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: Every chunk type and its keys that ai 5.0.0 knows: its schemas, like ai 6.0's up to ~6.0.230, are strict.
AI_5_CHUNKS = {
    "start": {"messageId", "messageMetadata"}, "start-step": set(), "finish-step": set(),
    "text-start": {"id", "providerMetadata"}, "text-delta": {"id", "delta", "providerMetadata"},
    "text-end": {"id", "providerMetadata"}, "reasoning-start": {"id", "providerMetadata"},
    "reasoning-delta": {"id", "delta", "providerMetadata"}, "reasoning-end": {"id", "providerMetadata"},
    "tool-input-start": {"toolCallId", "toolName", "providerExecuted", "dynamic"},
    "tool-input-available": {"toolCallId", "toolName", "input", "providerExecuted", "providerMetadata", "dynamic"},
    "tool-output-available": {"toolCallId", "output", "providerExecuted", "dynamic"},
    "tool-output-error": {"toolCallId", "errorText", "providerExecuted", "dynamic"},
    "error": {"errorText"}, "finish": {"messageMetadata"},
}
CHAT = {"id": "chat-1", "trigger": "submit-message",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}
AGUI = {"threadId": "t-1", "runId": "r-1", "messages": [{"id": "u1", "role": "user", "content": "hi"}]}


def post(app, path: str, payload: Dict[str, Any]) -> List[str]:
    """The ``data:`` values of the response to a POST of ``payload``."""
    status, _, body = call(app, environ_for("POST", path, json.dumps(payload).encode()))
    assert status.startswith("200"), body
    return [line[6:] for line in body.decode("ascii").split("\n") if line.startswith("data: ")]


def chunks(data: List[str]) -> List[Dict[str, Any]]:
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


class Raising:
    """An engine stand-in whose run shows a token, then raises."""

    def run(self, messages, cancel=None, *, heartbeat_s=None) -> Iterator[Any]:
        yield TokenEvent("half")
        raise RuntimeError("secret internals")


def test_a_run_that_raises_ends_with_an_error_chunk_then_done():
    sent = chunks(post(make_wsgi_app(Raising()), "/api/chat", CHAT))
    assert [c["type"] for c in sent] == ["start", "start-step", "text-start", "text-delta", "error"]
    assert "request id" in sent[-1]["errorText"] and "secret" not in sent[-1]["errorText"]


def test_a_run_that_stops_without_done_is_an_error_not_a_success():
    sent = chunks(post(make_wsgi_app(Silent()), "/api/chat", CHAT))
    assert [c["type"] for c in sent] == ["start", "error"]
    assert "ended without finishing" in sent[-1]["errorText"]


def test_agui_ends_with_exactly_one_terminal_event_and_no_done():
    for engine, last in ((Raising(), "RUN_ERROR"), (Silent(), "RUN_ERROR")):
        data = post(make_wsgi_app(engine), "/agui", AGUI)
        events = [json.loads(d) for d in data]  # no [DONE]: the AG-UI client would fail on it
        types = [e["type"] for e in events]
        assert types[0] == "RUN_STARTED" and types[-1] == last
        assert sum(t in ("RUN_ERROR", "RUN_FINISHED") for t in types) == 1


@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def rich_run(fp: FakeProvider) -> None:
    """A tool, a call with unreadable arguments, a refusal (the reasoning delta shows once the engine emits it)."""
    fp.add_turn(s.reasoning("thinking"), s.text("Let me check. "),
                s.tool_call(0, id="call_1", name="lookup", arguments='{"city": "Oslo"}'),
                s.tool_call(1, id="call_2", name="lookup", arguments='{"city": '), s.finish("tool_calls"))
    fp.add_turn(s.raw(b'data: {"choices":[{"index":0,"delta":{"refusal":"no."}}]}\n\n'), s.finish("stop"), s.done())


def test_version_5_writes_only_the_chunks_and_keys_every_ai_5_client_knows():
    with FakeProvider() as fp:
        rich_run(fp)
        with make_engine(fp, [lookup]) as engine:
            sent = chunks(post(make_wsgi_app(engine), "/api/chat", CHAT))
    unknown = [c for c in sent if not c["type"].startswith("data-")
               and (c["type"] not in AI_5_CHUNKS or set(c) - {"type"} - AI_5_CHUNKS[c["type"]])]
    assert unknown == []
    # The unreadable call: its raw text is the input shown, and its card ends in an error.
    assert {"type": "tool-input-available", "toolCallId": "call_2", "toolName": "lookup",
            "input": '{"city": '} in sent
    assert any(c["type"] == "tool-output-error" and c["toolCallId"] == "call_2" for c in sent)
    assert sent[-1]["messageMetadata"]["finishReason"] == "content-filter"


def test_version_6_reports_unreadable_input_as_an_input_error():
    with FakeProvider() as fp:
        rich_run(fp)
        with make_engine(fp, [lookup]) as engine:
            sent = chunks(post(make_wsgi_app(engine, ai_sdk_version=6), "/api/chat", CHAT))
    [error] = [c for c in sent if c["type"] == "tool-input-error"]
    assert error["toolCallId"] == "call_2" and error["input"] == '{"city": ' and "request id" in error["errorText"]
    assert not any(c["type"].startswith("tool-output") and c["toolCallId"] == "call_2" for c in sent)


@pytest.mark.parametrize("version", [0, 4, 8, "5", True, None])
def test_an_unknown_ai_sdk_version_is_refused_naming_the_known_ones(version):
    with pytest.raises(ConfigError, match="ai_sdk_version must be one of 5, 6, 7"):
        make_wsgi_app(Silent(), ai_sdk_version=version)


def test_approvals_need_a_run_log_whatever_the_ai_version():
    # approvals=True is answered through the run log (runs=): without one there is nothing to wait in
    with pytest.raises(ConfigError, match="needs a run log"):
        make_wsgi_app(Silent(), approvals=True, ai_sdk_version=6)


def test_the_frontend_routes_take_the_same_checks_as_the_stream():
    app = make_wsgi_app(Silent(), authorize=lambda environ: environ.get("HTTP_AUTHORIZATION") == "Bearer ok")
    for path, payload in (("/api/chat", CHAT), ("/agui", AGUI)):
        body = json.dumps(payload).encode()
        status, _, refused = call(app, environ_for("POST", path, body))
        assert status.startswith("401") and b"not authorized" in refused
        status, _, _ = call(app, environ_for("POST", path, body, HTTP_HOST="evil.example"))
        assert status.startswith("400")
        status, _, _ = call(app, environ_for("POST", path, body, HTTP_SEC_FETCH_SITE="cross-site",
                                             HTTP_ORIGIN="https://evil.example", HTTP_AUTHORIZATION="Bearer ok"))
        assert status.startswith("403")
        status, _, _ = call(app, environ_for("POST", path, body, content_type="text/plain",
                                             HTTP_AUTHORIZATION="Bearer ok"))
        assert status.startswith("400")


@pytest.mark.parametrize(("path", "payload", "first"), [("/api/chat", CHAT, b'"text-delta"'),
                                                         ("/agui", AGUI, b'"TEXT_MESSAGE_CONTENT"')])
def test_a_client_gone_mid_stream_cancels_the_run_and_frees_its_slot(path, payload, first):
    """The frontends' routes are the same response machinery: a closed tab stops the provider call."""
    with FakeProvider() as fp:
        fp.add_turn(s.text("Working on it "), s.stall())
        with make_engine(fp, idle_timeout=30.0, completion_timeout=60.0) as engine:
            app = make_wsgi_app(engine, heartbeat_s=0.1)
            with serving(app, channel_request_lookahead=1) as url:
                response = requests.post(url + path, json=payload, stream=True, timeout=10)
                seen = b""
                for piece in read1_pieces(response):
                    seen += piece
                    if first in seen:
                        break
                assert app.active_streams == 1
                response.close()  # the tab is closed
                assert wait_for(lambda: app.active_streams == 0), "the stream's slot was never released"
                assert fp.wait_for_client_disconnects(1), "the provider call stayed"


@pytest.mark.parametrize(("path", "payload"), [("/api/chat", CHAT), ("/agui", AGUI)])
def test_a_quiet_stream_gets_pings(path, payload):
    """(tests/web/test_frontends.py shows the real clients read past them.)"""
    with FakeProvider() as fp:
        fp.add_turn(s.delay(0.4), s.text("late"))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine, heartbeat_s=0.1)) as url:
            text = requests.post(url + path, json=payload, timeout=10).text
    assert ": ping\n\n" in text and '"late"' in text


def test_resume_is_a_204_after_the_same_checks():
    app = make_wsgi_app(Silent(), authorize=lambda environ: environ.get("HTTP_AUTHORIZATION") == "Bearer ok")
    status, _, _ = call(app, environ_for("GET", "/api/chat/chat-1/stream", HTTP_AUTHORIZATION="Bearer ok"))
    assert status.startswith("204")
    status, _, _ = call(app, environ_for("GET", "/api/chat/chat-1/stream"))
    assert status.startswith("401")
    status, _, _ = call(app, environ_for("GET", "/api/chat/chat-1/stream", HTTP_HOST="evil.example",
                                         HTTP_AUTHORIZATION="Bearer ok"))
    assert status.startswith("400")
    for path in ("/api/chat//stream", "/api/chat/stream", "/api/chat/x/other"):
        status, _, _ = call(app, environ_for("GET", path, HTTP_AUTHORIZATION="Bearer ok"))
        assert status.startswith("404"), path
