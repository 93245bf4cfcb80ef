"""``useChat`` over the run logs (``make_wsgi_app(runs=...)``): resume on any worker, approvals (issue 39).

A ``POST /api/chat`` run is a run in the log (its frames are the engine's
events, encoded as the UI message stream as they are read), so
``GET /api/chat/<chatId>/stream`` replays the chat's active run from its start
and follows it live, from any app sharing the log.  The real ``AbstractChat``
(tests/web/frontend/chat.mjs) does the resuming.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest
import requests
from node_support import require_node, run_node
from run_log_kinds import logs, shared_logs  # noqa: F401 - fixtures
from wsgi_support import make_engine, serving

from streamengine.runs import MemoryRunLog
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
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


def slow_answer(fp: FakeProvider, every_s: float = 0.1, until: Optional[threading.Event] = None) -> str:
    """An answer of WORDS words, one every ``every_s`` (halfway, waiting for ``until``); its text."""
    steps = []
    for index in range(WORDS):
        if index == WORDS // 2 and until is not None:
            steps.append(s.wait(until))
        steps += [s.text(f"w{index} "), s.delay(every_s)]
    fp.add_turn(*steps)
    return " ".join(f"w{index}" for index in range(WORDS))


def noting_resumes(app: Any, resumed: threading.Event) -> Any:
    """``app``, setting ``resumed`` when a resume request comes in: the answer goes on only then."""
    def noting(environ: Dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") == "GET" and environ.get("PATH_INFO", "").endswith("/stream"):
            resumed.set()
        return app(environ, start_response)
    return noting


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
    resumed = threading.Event()
    with FakeProvider() as fp:
        full = slow_answer(fp, until=resumed)
        with make_engine(fp) as engine, \
                serving(noting_resumes(make_wsgi_app(engine, runs=logs.new(), on_disconnect="detach",
                                                     ai_sdk_version=7 if client == "ai7" else 5), resumed)) as url:
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
    resumed = threading.Event()
    with FakeProvider() as fp:
        full = slow_answer(fp, until=resumed)
        first = logs.new()
        second = first if isinstance(first, MemoryRunLog) else logs.new()
        with make_engine(fp) as engine, \
                serving(make_wsgi_app(engine, runs=first, on_disconnect="detach", ai_sdk_version=6)) as one, \
                serving(noting_resumes(make_wsgi_app(engine, runs=second, on_disconnect="detach",
                                                     ai_sdk_version=6), resumed)) as two:
            message_id, _ = start_and_drop(one, "chat-2")
            result = resume(node, two, "ai6", "chat-2")
    assert result["status"] == "ready" and answer_text(result) == full
    assert result["messages"][-1]["id"] == message_id


def test_a_chat_without_an_active_run_is_204_and_the_chat_goes_on(node):
    """A finished run, an unknown chat and another owner's chat all answer 204: nothing to rejoin."""
    with FakeProvider() as fp:
        fp.add_turn(s.text("First."))
        slow_answer(fp, every_s=0.3)
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


# --- approvals (ai 6 and 7) -----------------------------------------------------------------------

@tool(side_effects=True)
def delete_file(path: str) -> str:
    """Delete a file (a side effect: asked about first)."""
    return f"deleted {path}"


def deleting_turns(fp: FakeProvider) -> None:
    fp.add_turn(s.text("Deleting it. "), s.tool_call(0, id="call_del", name="delete_file",
                                                      arguments='{"path": "/tmp/x"}'), s.finish("tool_calls"))
    fp.add_turn(s.text("Done "), s.text("with that."))


def held_call_app(engine: Any, version: int, log: Any = None) -> Any:
    return make_wsgi_app(engine, runs=log if log is not None else MemoryRunLog(), approvals=True,
                         ai_sdk_version=version)


@pytest.mark.parametrize(("version", "client"), [(6, "ai6"), (7, "ai7")])
def test_a_held_call_is_approved_from_use_chat_and_the_answer_goes_on_on_the_same_message(node, version, client):
    with FakeProvider() as fp:
        deleting_turns(fp)
        with make_engine(fp, [delete_file]) as engine, serving(held_call_app(engine, version)) as url:
            asked = run_node(node, "chat.mjs", client, url + "/api/chat", "--id=chat-a", "delete /tmp/x")
            # The page reloaded with the chat's messages, then the user approves.
            result = run_node(node, "chat.mjs", client, url + "/api/chat", "--id=chat-a",
                              "--history=" + json.dumps(asked["messages"]), "--approve")
        assert len(fp.requests) == 2  # the run waited for the answer: it was not asked again
    # The first request ends at the question: the card waits for its answer and the chat is ready for it.
    assert asked["status"] == "ready" and asked["error"] is None
    card = next(p for p in asked["messages"][-1]["parts"] if p["type"] == "tool-delete_file")
    assert card["state"] == "approval-requested" and card["approval"] == {"id": "call_del"}
    assert card["input"] == {"path": "/tmp/x"}
    assert asked["finishes"][-1]["finishReason"] == "tool-calls"
    # Approved: the same message goes on with the tool's output and the rest of the answer.
    assert result["status"] == "ready" and result["error"] is None, result
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    parts = result["messages"][-1]["parts"]
    [card] = [p for p in parts if p["type"] == "tool-delete_file"]
    assert card["state"] == "output-available" and card["output"] == "deleted /tmp/x"
    assert card["approval"]["approved"] is True
    text = [p["text"] for p in parts if p["type"] == "text"]
    assert text == ["Deleting it.", "Done with that."]
    assert result["finishes"][-1]["finishReason"] == "stop"


@pytest.mark.parametrize(("version", "client"), [(6, "ai6"), (7, "ai7")])
def test_a_held_call_denied_from_use_chat_is_output_denied_and_never_runs(node, logs, version, client):
    with FakeProvider() as fp:
        deleting_turns(fp)
        with make_engine(fp, [delete_file]) as engine, \
                serving(held_call_app(engine, version, logs.new())) as url:
            result = run_node(node, "chat.mjs", client, url + "/api/chat", "--id=chat-d", "delete /tmp/x",
                              "--deny=not that one")
            tool_message = fp.requests[-1].json["messages"][-1]
    assert result["status"] == "ready" and result["error"] is None, result
    parts = result["messages"][-1]["parts"]
    [card] = [p for p in parts if p["type"] == "tool-delete_file"]
    assert card["state"] == "output-denied" and "output" not in card
    assert card["approval"] == {"id": "call_del", "approved": False, "reason": "not that one"}
    assert tool_message["role"] == "tool" and "deleted" not in tool_message["content"]  # the model read a refusal
    extras = next(p for p in parts if p["type"] == "data-streamengine-tool")
    assert extras["data"]["skipped"] == "not_approved"


def test_forged_approvals_are_dropped_and_the_held_call_still_waits_for_its_owner(node):
    """An answer for a call no run holds, or from another owner, answers nothing; the real one still works."""
    with FakeProvider() as fp:
        deleting_turns(fp)
        with make_engine(fp, [delete_file]) as engine, \
                serving(make_wsgi_app(engine, runs=MemoryRunLog(), approvals=True, ai_sdk_version=7,
                                      owner=lambda environ: environ.get("HTTP_X_USER") or "nobody")) as url:
            first = requests.post(url + "/api/chat", json=chat_body("chat-f", "delete /tmp/x"), timeout=20,
                                  headers={"X-User": "ann"})
            chunks = [json.loads(line[6:]) for line in first.text.splitlines() if line.startswith("data: {")]
            message_id = chunks[0]["messageId"]

            def answer(call_id: str, user: str) -> requests.Response:
                card = {"type": "tool-delete_file", "toolCallId": call_id, "state": "approval-responded",
                        "input": {"path": "/tmp/x"}, "approval": {"id": call_id, "approved": True}}
                body = {"id": "chat-f", "trigger": "submit-message", "messageId": message_id, "messages": [
                    user_message("delete /tmp/x"), {"id": message_id, "role": "assistant", "parts": [card]}]}
                return requests.post(url + "/api/chat", json=body, timeout=20, headers={"X-User": user})

            forged = answer("call_other", "ann")
            stranger = answer("call_del", "bob")
            assert len(fp.requests) == 1  # nothing ran on their word
            real = answer("call_del", "ann")
            again = answer("call_del", "ann")  # once: the call is no longer held
    assert [c["type"] for c in chunks][-3:] == ["tool-approval-request", "finish-step", "finish"]
    assert (forged.status_code, stranger.status_code, again.status_code) == (409, 409, 409)
    assert "is waiting for an answer about these tool calls" in forged.json()["error"]
    assert real.status_code == 200
    outputs = [json.loads(line[6:]) for line in real.text.splitlines() if line.startswith("data: {")]
    assert outputs[0] == {"type": "start", "messageId": message_id}
    assert {"type": "tool-output-available", "toolCallId": "call_del", "output": "deleted /tmp/x"} in outputs
    assert outputs[-1]["type"] == "finish" and real.text.rstrip().endswith("data: [DONE]")


def test_the_resume_reaches_the_run_on_another_gunicorn_worker(node, shared_logs, tmp_path):
    """Two gunicorn workers behind a round-robin proxy: the POST on one, ``useChat``'s resume on the other."""
    from test_runs_gunicorn import two_workers

    with FakeProvider() as fp:
        fp.add_turn(*[step for i in range(40) for step in (s.text(f"w{i} "), s.delay(0.1))])
        with two_workers(tmp_path, fp, shared_logs.spec) as base:
            resp = requests.post(base + "/api/chat", json=chat_body("chat-g"), stream=True, timeout=30)
            producer = resp.headers["X-Worker-Pid"]
            seen = chunks_until(resp, "text-delta")
            resp.close()
            result = resume(node, base, "ai5", "chat-g")
            other = requests.get(base + "/api/chat/chat-g/stream", timeout=30)  # the next connection's worker
        assert len(fp.requests) == 1
    assert result["status"] == "ready" and result["messages"][-1]["id"] == seen[0]["messageId"]
    assert answer_text(result) == " ".join(f"w{i}" for i in range(40))
    assert other.status_code == 204 and other.headers["X-Worker-Pid"] == producer  # so the resume was the other's


# --- AG-UI: a held call is an interrupt ----------------------------------------------------------

def agui_answering(node: str, url: str, answer: str) -> Dict[str, Any]:
    messages = [{"id": "u1", "role": "user", "content": "delete /tmp/x"}]
    return run_node(node, "agui.mjs", url + "/agui", json.dumps(messages), answer)


@pytest.mark.parametrize("approved", [True, False])
def test_agui_a_held_call_is_an_interrupt_the_next_run_resumes(node, logs, approved):
    with FakeProvider() as fp:
        deleting_turns(fp)
        with make_engine(fp, [delete_file]) as engine, \
                serving(make_wsgi_app(engine, runs=logs.new(), approvals=True, ai_sdk_version=7)) as url:
            result = agui_answering(node, url, "--approve" if approved else "--deny")
            tool_message = fp.requests[-1].json["messages"][-1]
    assert result["error"] is None, result
    # The first run ends at the question: RUN_FINISHED with an interrupt naming the call.
    finished = result["events"][-1]
    assert finished["type"] == "RUN_FINISHED" and finished["outcome"]["type"] == "interrupt"
    assert result["interrupts"] == [{"id": "call_del", "reason": "tool_approval", "toolCallId": "call_del",
                                     "message": "Allow the tool call delete_file?"}]
    assert [e["type"] for e in result["events"]].count("TOOL_CALL_START") == 1
    # The next run (resume) gets the call's result and the rest, and ends as a success.
    resumed = result["resumed"]
    assert resumed["error"] is None, resumed
    kinds = [e["type"] for e in resumed["events"]]
    assert kinds[0] == "RUN_STARTED" and kinds[-1] == "RUN_FINISHED" and "TOOL_CALL_START" not in kinds
    assert resumed["events"][-1]["runId"] == "run-2" and "outcome" not in resumed["events"][-1]
    [outcome] = [e for e in resumed["events"] if e["type"] == "TOOL_CALL_RESULT"]
    assert (outcome["content"] == "deleted /tmp/x") is approved
    assert resumed["messages"][-1]["content"] == "Done with that."
    assert resumed["events"][-1]["usage"][0]["totalTokens"] > 0  # read back from the log's done frame
    assert ("deleted" in tool_message["content"]) is approved


def test_agui_a_resume_for_a_call_no_run_holds_is_a_409(node):
    with FakeProvider() as fp, make_engine(fp, [delete_file]) as engine, \
            serving(make_wsgi_app(engine, runs=MemoryRunLog(), approvals=True, ai_sdk_version=7)) as url:
        body = {"threadId": "thread-1", "runId": "run-9", "messages": [{"id": "u1", "role": "user", "content": "x"}],
                "resume": [{"interruptId": "call_del", "status": "resolved", "payload": {"approved": True}}]}
        resp = requests.post(url + "/agui", json=body, timeout=10)
        assert fp.requests == []
    assert resp.status_code == 409 and "no run" in resp.json()["error"]
