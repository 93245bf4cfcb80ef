"""The built-in page in headless Chromium, on a run whose gunicorn worker is killed (kill -9) mid-answer.

Two real gunicorn workers share a SQLite run log behind the round-robin proxy
of test_runs_gunicorn.  The page asks; round 1 looks something up, round 2
starts a slow side-effect tool and the test kills the worker running it.  The
page's stream breaks; it reconnects by itself (``Last-Event-ID``) until it
reaches the other worker, which takes the run over from its round-2
checkpoint.  The page must end as an uninterrupted run would read: round 2's
first text taken back by ``reset``, the answer once, no card left spinning,
the killed call's card saying it was interrupted, the run finished.
Reloaded right after the kill instead, the page reattaches from
sessionStorage and replays the run from its first frame, the takeover's
frames among them, to the same end.
"""
from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from run_log_kinds import LogMaker
from test_browser import FINISHED, Browser, PageChanged, browser, chromium, chromium_process, logged  # noqa: F401 (fixtures)
from test_runs_gunicorn import LEASE_S, two_workers
from test_takeover_gunicorn import tool_turn

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytest.importorskip("gunicorn", reason="gunicorn is in the test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.usefixtures("no_thread_leak")

# test_takeover_gunicorn's app, but the side-effect tool notes the pid of the worker running it: the one to kill.
APP = textwrap.dedent("""
    import json, os, time
    from run_log_kinds import open_log
    from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine, tool
    from streamengine.wsgi import make_wsgi_app

    @tool
    def lookup(q: str) -> str:
        "Looks up."
        return q + " is 42"

    @tool(side_effects=True)
    def send(to: str) -> str:
        "Sends, slowly: the test kills its worker meanwhile."
        with open(os.environ["SE_SENT"], "a") as sent:
            sent.write(to + " " + str(os.getpid()) + "\\n")
        time.sleep(20)
        return "sent to " + to

    app = make_wsgi_app(StreamingEngine(OpenAICompatibleClient(os.environ["SE_PROVIDER"]), [lookup, send],
                                        EngineConfig(models=["m"], tool_mode="native", idle_timeout=30,
                                                     completion_timeout=120)),
                        runs=open_log(json.loads(os.environ["SE_LOG"])), heartbeat_s=0.2,
                        lease_s=float(os.environ["SE_LEASE"]), detach_grace_s=30, approve=lambda call, environ: True)
""")

ANSWER = "x is 42; the message may have gone to bob."
# The page's status line says the run is done (null while a reload has no document yet).
DONE = "(document.getElementById('status') || {textContent: ''}).textContent.indexOf('done') === 0"
PAGE_STATE = """(function () {
    function texts(selector) {
        return Array.from(document.querySelectorAll(selector)).map(function (e) { return e.textContent; });
    }
    return {
        sections: Array.from(document.querySelectorAll('#conversation section')).map(function (section) {
            return { text: section.querySelector('.text').textContent,
                     chips: Array.from(section.querySelectorAll('.tool')).map(function (chip) {
                         return { call: chip.getAttribute('data-call'), cls: chip.className, text: chip.textContent };
                     }) };
        }),
        conversation: document.getElementById('conversation').textContent,
        errors: texts('.error'), notices: texts('.notice'),
        status: document.getElementById('status').textContent,
        stopDisabled: document.getElementById('stop').disabled,
        sendDisabled: document.getElementById('send').disabled,
        kept: sessionStorage.getItem('streamengine.run')
    };
}())"""


def killed_pid(sent: Path, timeout_s: float = 30.0) -> int:
    """The pid the side-effect tool wrote: the worker producing the run, now inside round 2's tool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = sent.read_text().splitlines() if sent.exists() else []
        if lines:
            return int(lines[0].split()[1])
        time.sleep(0.02)
    raise AssertionError(f"the send tool did not start within {timeout_s}s")


def page_after_takeover(browser: Browser, base: str, sent: Path, reload: bool) -> Dict[str, Any]:
    """Ask on the page, kill the producing worker while round 2's tool runs (then reload, or not); the page's end."""
    if reload:  # asked by hand: a reload must reattach, not ask again (autorun would)
        browser.open_plain(f"{base}/")
        browser.wait_for("document.getElementById('prompt') !== null")
        browser.js("document.getElementById('prompt').value = 'tell bob'; "
                   "document.getElementById('ask').requestSubmit()")
    else:
        browser.open(f"{base}/?autorun=tell%20bob")
    pid = killed_pid(sent)
    browser.wait_for("document.querySelector('.tool.running[data-call=\"c2\"]') !== null")  # the card spins
    browser.wait_for("document.getElementById('conversation').textContent.indexOf('Sending.') >= 0")  # rendered
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    if reload:  # reattached from sessionStorage: the run's frames from its first, the takeover's among them
        try:
            browser.js("location.reload()")
        except PageChanged:
            pass
    # Reconnecting (retry 1 s, maybe via the dead worker first), lease out, taken over, rounds 2 and 3 asked.
    browser.wait_for(DONE, timeout=LEASE_S + 40)
    print(f"\npage ({'reloaded' if reload else 'reconnected'}): done {time.monotonic() - killed:.2f}s after kill -9")
    state: Dict[str, Any] = browser.js(PAGE_STATE)
    if not reload:
        assert browser.wait_for(FINISHED) == "done"
        state.update(logged(browser))
    return state


@pytest.mark.parametrize("reload", [False, True], ids=["reconnected", "reloaded"])
def test_the_page_shows_a_run_taken_over_after_kill_9_as_one_answer(browser, tmp_path, monkeypatch, reload):
    sent = tmp_path / "sent.txt"
    monkeypatch.setenv("SE_SENT", str(sent))
    spec = LogMaker("sqlite", tmp_path).spec  # a file both workers open
    with FakeProvider() as fp:
        tool_turn(fp, "Looking it up. ", "c1", "lookup", {"q": "x"})
        tool_turn(fp, "Sending. ", "c2", "send", {"to": "bob"})
        tool_turn(fp, "Sending again. ", "c7", "send", {"to": "bob"})  # round 2 asked again by the taker
        fp.add_turn(s.text("x is 42; "), s.delay(0.05), s.text("the message may have gone to bob."), s.finish())
        with two_workers(tmp_path, fp, spec, APP) as base:
            page = page_after_takeover(browser, base, sent, reload)
    assert len(sent.read_text().splitlines()) == 1  # ran once, by the killed worker; not again
    # Round 2's first text is taken back; each round shows its text once, the answer once.
    assert [section["text"].strip() for section in page["sections"]] == ["Looking it up.", "Sending again.", ANSWER]
    assert page["conversation"].count(ANSWER) == 1 and "Sending. " not in page["conversation"]
    chips = [chip for section in page["sections"] for chip in section["chips"]]
    assert not [chip for chip in chips if "running" in chip["cls"]], chips  # nothing left spinning
    assert [chip["cls"] for chip in chips] == ["tool ok", "tool skipped", "tool skipped"], chips
    assert chips[1]["call"] == "c2" and "interrupted" in chips[1]["text"]  # the killed worker's call
    assert "interrupted" in chips[2]["text"] and "send" in chips[2]["text"]  # its repeat, not run again
    assert page["errors"] == [] and page["notices"] == []
    assert page["status"].startswith("done") and "3 rounds" in page["status"], page["status"]
    assert page["stopDisabled"] and not page["sendDisabled"] and page["kept"] is None
    assert [m["role"] for m in fp.requests[3].json["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]
    if not reload:  # the page's own record of the run (?autorun&debug=1): one reset, one done, every token
        events: List[str] = page["events"]
        assert events.count("reset") == 1 and events.count("done") == 1 and events[-2:] == ["done", "[DONE]"]
        assert page["tokens"] == ["Looking it up. ", "Sending. ", "Sending again. ", "x is 42; ",
                                  "the message may have gone to bob."]
