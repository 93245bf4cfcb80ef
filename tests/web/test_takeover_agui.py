"""The real ``@ag-ui/client`` on an ``/agui`` run whose gunicorn worker is killed (kill -9) mid-answer.

AG-UI has no reconnect (``HttpAgent`` has no resume of a run, and the worker
that served the stream is gone, so nothing can send it a ``RUN_ERROR``): the
client's ``runAgent`` fails with its fetch's error, after the events it had,
with no terminal event.  The run itself is in the log: the client names it by
the response's ``X-Run-Id`` (``HttpAgent``'s ``fetch`` option) and reads the
rest from ``/v1/runs/<id>/events``, which reaches the other worker and makes it
take the run over, or polls ``/v1/runs/<id>`` for the answer, which does the
same (tests/web/frontend/agui-lost.mjs; docs/frontends.md).
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from node_support import FRONTEND, NODE_TIMEOUT_S, require_node
from run_log_kinds import LogMaker
from test_runs_gunicorn import two_workers
from test_takeover_gunicorn import tool_turn
from test_takeover_page import ANSWER, APP, killed_pid

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.usefixtures("no_thread_leak")


def agui_run_killed(node: str, base: str, sent: Path, *how: str) -> Dict[str, Any]:
    """``agui-lost.mjs`` asking through ``/agui``; its worker is killed once the client shows round 2's tool call."""
    messages = json.dumps([{"id": "u1", "role": "user", "content": "tell bob"}])
    lines: queue.Queue[Optional[str]] = queue.Queue()
    with subprocess.Popen([node, "agui-lost.mjs", base + "/agui", messages, *how], cwd=FRONTEND, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        reader = threading.Thread(target=lambda: [*map(lines.put, proc.stdout or ()), lines.put(None)],
                                  name="test-agui-stdout")
        reader.start()
        try:
            pid = killed_pid(sent)
            line = ""
            while not (line.startswith("event ") and json.loads(line[6:]) == {"type": "TOOL_CALL_END",
                                                                                   "toolCallId": "c2"}):
                line = lines.get(timeout=NODE_TIMEOUT_S) or ""
                assert line or proc.poll() is None, "node agui-lost.mjs ended before round 2's tool call"
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            proc.wait(NODE_TIMEOUT_S)
            print(f"\nagui: the client had the run's rest {time.monotonic() - killed:.2f}s after kill -9")
        finally:
            proc.kill()
            reader.join(10)
            err = proc.stderr.read() if proc.stderr else ""
    out = []
    while not lines.empty():
        out.append(lines.get() or "")
    assert proc.returncode == 0, f"node agui-lost.mjs failed ({proc.returncode}):\n{err[-3000:]}"
    results = [line for line in out if line.startswith("{")]
    assert results, f"node agui-lost.mjs printed no result:\n{out[-20:]}\n{err[-2000:]}"
    result: Dict[str, Any] = json.loads(results[-1])
    return result


def killed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *how: str) -> Dict[str, Any]:
    """The two-round run of the takeover tests, asked through /agui; its worker killed during round 2's tool."""
    node = require_node()
    sent = tmp_path / "sent.txt"
    monkeypatch.setenv("SE_SENT", str(sent))
    spec = LogMaker("sqlite", tmp_path).spec
    with FakeProvider() as fp:
        tool_turn(fp, "Looking it up. ", "c1", "lookup", {"q": "x"})
        tool_turn(fp, "Sending. ", "c2", "send", {"to": "bob"})
        tool_turn(fp, "Sending again. ", "c7", "send", {"to": "bob"})
        fp.add_turn(s.text("x is 42; "), s.delay(0.05), s.text("the message may have gone to bob."), s.finish())
        with two_workers(tmp_path, fp, spec, APP) as base:
            result = agui_run_killed(node, base, sent, *how)
    assert len(sent.read_text().splitlines()) == 1  # ran once, by the killed worker
    return result


def test_an_agui_run_whose_worker_dies_fails_in_the_client_and_its_rest_is_read_by_its_run_id(tmp_path,
                                                                                                monkeypatch):
    result = killed_run(tmp_path, monkeypatch)
    # The AG-UI run: what came before the kill, then the client's own error; no terminal event, no crash.
    kinds = [event["type"] for event in result["events"]]
    assert result["error"] == "terminated", result["error"]
    assert kinds[0] == "RUN_STARTED" and "RUN_FINISHED" not in kinds and "RUN_ERROR" not in kinds, kinds
    assert kinds[-1] == "TOOL_CALL_END" and result["events"][-1]["toolCallId"] == "c2"
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "assistant", "tool", "assistant",
                                                       "assistant"]
    assert set(result["unhandled"]) <= {"terminated"}  # @ag-ui/client's reader cancel, if anything
    # The rest, by the run's id: the killed call closed, round 2 taken back and asked again, the answer once.
    followed = result["followed"]
    assert result["runId"] and followed, result
    names = [frame["event"] for frame in followed]
    assert names.count("reset") == 1 and names[-1] == "done" and sum(n in ("done", "error") for n in names) == 1
    reset = names.index("reset")
    assert names.index("tool_approved") < reset  # logged before the killed call ran; AG-UI showed nothing of it
    assert not [e for e in result["events"] if e["type"] == "CUSTOM" and "approved" in e["name"]]
    assert followed[reset]["data"]["round"] == 2
    closed = [frame["data"] for frame in followed if frame["event"] == "tool_result" and frame["data"]["skipped"]]
    assert [(c["call_id"], c["skipped"]) for c in closed] == [("c2", "interrupted"), ("c7", "interrupted")]
    after = "".join(frame["data"] for frame in followed[reset:] if frame["event"] == "message")
    assert after == "Sending again. " + ANSWER
    assert followed[-1]["data"]["answer"] == ANSWER


def test_an_agui_client_polling_the_runs_status_gets_the_answer_of_the_run_taken_over(tmp_path, monkeypatch):
    result = killed_run(tmp_path, monkeypatch, "--poll")
    assert result["error"] == "terminated" and result["followed"] is None
    polled = result["polled"]  # a poll found the lease out and took the run over; a later one saw it done
    assert (polled["state"], polled["answer"]) == ("done", ANSWER), polled
