"""``useChat`` over the run logs (``make_wsgi_app(runs=...)``): resume on any worker, approvals (issue 39).

A ``POST /api/chat`` run is a run in the log (its frames are the engine's
events, encoded as the UI message stream as they are read), so
``GET /api/chat/<chatId>/stream`` replays the chat's active run from its start
and follows it live, from any app sharing the log.  The real ``AbstractChat``
(tests/web/frontend/chat.mjs) does the resuming.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

import pytest
import requests
from node_support import require_node, run_node
from run_log_kinds import logs  # noqa: F401 - a fixture
from wsgi_support import make_engine, serving

from streamengine.runs import MemoryRunLog
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

WORDS = 12


@pytest.fixture(scope="module")
def node() -> str:
    return require_node()


def user_message(text: str, message_id: str = "u1") -> Dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def chat_body(chat_id: str, text: str = "hi") -> Dict[str, Any]:
    """What ``useChat``'s ``sendMessage`` posts."""
    return {"id": chat_id, "messages": [user_message(text)], "trigger": "submit-message"}


def slow_answer(fp: FakeProvider, every_s: float = 0.1) -> str:
    """An answer of WORDS words, one every ``every_s``; its text."""
    steps = []
    for index in range(WORDS):
        steps += [s.text(f"w{index} "), s.delay(every_s)]
    fp.add_turn(*steps)
    return " ".join(f"w{index}" for index in range(WORDS))


def chunks_until(resp: requests.Response, wanted: str) -> List[Dict[str, Any]]:
    """The UI message stream's chunks up to the first of type ``wanted`` (the response is left open)."""
    seen: List[Dict[str, Any]] = []
    for line in resp.iter_lines():
        if not line.startswith(b"data: {"):
            continue
        seen.append(json.loads(line[6:]))
        if seen[-1]["type"] == wanted:
            return seen
    raise AssertionError(f"the stream ended before a {wanted} chunk: {seen}")


def start_and_drop(url: str, chat_id: str, **headers: str) -> Tuple[str, List[Dict[str, Any]]]:
    """``useChat``'s POST, cut off after its first text delta (a reload, a dropped connection)."""
    resp = requests.post(url + "/api/chat", json=chat_body(chat_id), stream=True, timeout=20, headers=headers)
    try:
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-vercel-ai-ui-message-stream"] == "v1" and resp.headers["X-Run-Id"]
        seen = chunks_until(resp, "text-delta")
    finally:
        resp.close()
    return seen[0]["messageId"], seen


def resume(node: str, url: str, client: str, chat_id: str, history: Optional[List[Dict[str, Any]]] = None
           ) -> Dict[str, Any]:
    """A page reloaded on ``chat_id``: ``useChat({id, messages, resume: true})`` mounting."""
    return run_node(node, "chat.mjs", client, url + "/api/chat", f"--id={chat_id}",
                    "--history=" + json.dumps(history or [user_message("hi")]), "--resume")


def answer_text(result: Dict[str, Any]) -> str:
    message = result["messages"][-1]
    assert message["role"] == "assistant", result
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text").strip()


# --- resume ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["ai5-0", "ai7"])
def test_a_reloaded_page_replays_the_chats_active_run_then_follows_it_live(node, logs, client):
    """The POST's connection drops mid-answer; the run goes on in the log and the resume gets all of it."""
    with FakeProvider() as fp:
        full = slow_answer(fp)
        with make_engine(fp) as engine, \
                serving(make_wsgi_app(engine, runs=logs.new(), on_disconnect="detach",
                                      ai_sdk_version=7 if client == "ai7" else 5)) as url:
            message_id, seen = start_and_drop(url, "chat-1")
            result = resume(node, url, client, "chat-1")
        assert len(fp.requests) == 1  # replayed from the log, not asked again
    assert [chunk["type"] for chunk in seen[:2]] == ["start", "start-step"]
    assert result["status"] == "ready" and result["error"] is None, result
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    assert result["messages"][-1]["id"] == message_id  # the same message, from its start
    assert answer_text(result) == full
    assert result["messages"][-1]["metadata"]["finishReason"] == "stop"


def test_the_resume_reaches_the_run_from_another_app_sharing_the_log(node, logs):
    """Two apps (two workers) on one log: the run started on one is resumed on the other."""
    with FakeProvider() as fp:
        full = slow_answer(fp)
        first = logs.new()
        second = first if isinstance(first, MemoryRunLog) else logs.new()
        with make_engine(fp) as engine, \
                serving(make_wsgi_app(engine, runs=first, on_disconnect="detach", ai_sdk_version=6)) as one, \
                serving(make_wsgi_app(engine, runs=second, on_disconnect="detach", ai_sdk_version=6)) as two:
            message_id, _ = start_and_drop(one, "chat-2")
            result = resume(node, two, "ai6", "chat-2")
    assert result["status"] == "ready" and answer_text(result) == full
    assert result["messages"][-1]["id"] == message_id


def test_a_chat_without_an_active_run_is_204_and_the_chat_goes_on(node):
    """A finished run, an unknown chat and another owner's chat all answer 204: nothing to rejoin."""
    with FakeProvider() as fp:
        fp.add_turn(s.text("First."))
        slow_answer(fp)
        with make_engine(fp) as engine, \
                serving(make_wsgi_app(engine, runs=MemoryRunLog(), on_disconnect="detach", ai_sdk_version=7,
                                      owner=lambda environ: environ.get("HTTP_X_USER") or "nobody")) as url:
            done = run_node(node, "chat.mjs", "ai7", url + "/api/chat", "--id=chat-3", "hi")
            assert done["status"] == "ready"
            finished = requests.get(url + "/api/chat/chat-3/stream", timeout=10)  # its owner: "nobody"
            unknown = requests.get(url + "/api/chat/no-such-chat/stream", headers={"X-User": "ann"}, timeout=10)
            start_and_drop(url, "chat-4", **{"X-User": "ann"})
            other = requests.get(url + "/api/chat/chat-4/stream", headers={"X-User": "bob"}, timeout=10)
            mine = requests.get(url + "/api/chat/chat-4/stream", headers={"X-User": "ann"}, timeout=10)
    assert (finished.status_code, unknown.status_code, other.status_code) == (204, 204, 204)
    assert finished.content == unknown.content == other.content == b""
    assert mine.status_code == 200 and mine.text.rstrip().endswith("data: [DONE]")
    assert '"type":"finish"' in mine.text


def test_a_chat_post_with_runs_needs_the_chats_id():
    with FakeProvider() as fp, make_engine(fp) as engine, \
            serving(make_wsgi_app(engine, runs=MemoryRunLog())) as url:
        resp = requests.post(url + "/api/chat", json={"messages": [user_message("hi")]}, timeout=10)
        assert fp.requests == []
    assert resp.status_code == 400 and resp.json()["field"] == "id"
