"""Nothing internal reaches a browser by default: short public messages + a request id, details in the log."""
from __future__ import annotations

import json
from typing import List

import pytest
import requests
from loguru import logger
from wsgi_support import STREAM_ACCEPT, block, kinds, make_engine, serving, sse, tokens_of

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

SECRET = "upstream said: key sk-live-123 at http://10.0.0.7:8080/internal"


@pytest.fixture
def log_lines():
    lines: List[str] = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="DEBUG",
                         filter=lambda r: r["name"].startswith("streamengine"))
    logger.enable("streamengine")
    try:
        yield lines
    finally:
        logger.remove(handler)
        logger.disable("streamengine")


def failing_run(expose: bool):
    """A model call that fails with a detailed provider error before any token; the stream's events."""
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": SECRET}}))
        with make_engine(fp, max_retries=0) as engine, \
                serving(make_wsgi_app(engine, expose_errors=expose)) as url, \
                requests.post(f"{url}/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                              stream=True, timeout=10) as resp:
            return resp.headers["X-Request-Id"], sse(resp)


def test_a_provider_error_reaches_the_browser_as_a_public_message_and_the_log_in_full(log_lines):
    request_id, events = failing_run(expose=False)
    wire = json.dumps(events)
    assert "sk-live-123" not in wire and "10.0.0.7" not in wire
    error = json.loads(next(d for k, d in events if k == "error"))
    assert error["request_id"] == request_id and request_id in error["message"]
    assert error["message"].startswith("the answer failed")
    warning = tokens_of(events)
    assert len(warning) == 1 and warning[0].startswith("\u26a0\ufe0f LLM error: the model request failed")
    assert request_id in warning[0]
    done = json.loads(next(d for k, d in events if k == "done"))
    assert done["answer"] == warning[0]  # the answer repeats the public text, not the detail
    assert [line.split(": ")[1] for line in done["telemetry"]["failed_attempts"]] == ["LlmHttpError"]
    assert kinds(events)[-1] == "[DONE]"
    logged = [line for line in log_lines if request_id in line]
    assert logged and any("sk-live-123" in line for line in logged), log_lines


def test_expose_errors_sends_the_details_for_development():
    request_id, events = failing_run(expose=True)
    error = json.loads(next(d for k, d in events if k == "error"))
    assert "sk-live-123" in error["message"] and request_id in error["message"]
    assert "sk-live-123" in tokens_of(events)[0]


def test_a_tool_error_shows_which_tool_failed_but_not_why(log_lines):
    @tool
    def lookup(city: str) -> str:
        """Fails with internals in its message."""
        raise RuntimeError(f"db password=hunter2 while looking up {city}")

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("lookup", {"city": "Oslo"})))
        fp.add_turn(s.text("sorry"))
        with make_engine(fp, [lookup]) as engine, serving(make_wsgi_app(engine)) as url, \
                requests.get(f"{url}/v1/chat/stream", params={"q": "x"}, headers=STREAM_ACCEPT,
                             stream=True, timeout=10) as resp:
            request_id = resp.headers["X-Request-Id"]
            events = sse(resp)
    result = json.loads(next(d for k, d in events if k == "tool_result"))
    assert result["ok"] is False and "hunter2" not in result["error"]
    assert result["error"].startswith("the tool failed: lookup") and request_id in result["error"]
    assert any("hunter2" in line and request_id in line for line in log_lines)
    assert tokens_of(events)[-1] == "sorry"
