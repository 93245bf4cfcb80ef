"""The page in a real browser: headless Chromium driven over the DevTools protocol (a pipe).

What a browser really does is asserted in a browser: hostile text stays text,
an error shows once, a ``reset`` clears its round, a tool chip turns green,
tool markup stays off screen, Markdown is rendered without HTML parsing, a
follow-up carries the earlier turns, and another site's ``<img>`` cannot
start a run.  The page runs under its own Content-Security-Policy, which
would also block a broken inline script.

Chromium is looked up on PATH: scripts/test installs it where missing (root
and apt-get); without it the tests skip, and fail under ``CI=true``.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional
from urllib.parse import quote

import pytest
from conftest import wait_for
from wsgi_support import HOSTILE, LONE_SURROGATE, LONE_SURROGATE_FRAME, CutAfter, block, make_engine, serving

from streamengine.runs import SqliteRunLog
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER_TIMEOUT_S = 90
MARKUP = "</pre><script>document.title='pwned'</script><img src=x onerror=alert(1)>"
FINISHED = "(document.getElementById('log') || document.createElement('pre')).getAttribute('data-state')"


def find_chromium() -> Optional[str]:
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    """Chromium from PATH; scripts/test installs it where missing (scripts/_chromium.sh)."""
    path = find_chromium()
    if path is None:
        message = ("chromium not installed: run the tests through scripts/test (as root with apt-get it "
                   "installs Debian's chromium) or apt-get install chromium")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the browser tests must run in CI)", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def chromium_process(chromium) -> Iterator[List[Browser]]:
    """One Chromium for the module (its start-up is most of a short test); a holder, so a dead one is replaced.

    Under pytest-xdist the module runs on one worker (tests/conftest.py), so this starts once.
    """
    holder: List[Browser] = []
    yield holder
    for b in holder:
        b.close()


@pytest.fixture
def browser(chromium, chromium_process) -> Iterator[Browser]:
    """The module's Chromium in a fresh browser context: no cookies, storage, cache or page of another test."""
    if chromium_process and not chromium_process[0].alive():
        chromium_process.pop().close()
    if not chromium_process:
        chromium_process.append(Browser(chromium))
    b = chromium_process[0]
    b.new_context()
    try:
        yield b
    finally:
        b.end_context()


class PageChanged(AssertionError):
    """An evaluation the page's navigation cut short (its old document is gone): not an answer."""


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

    No websocket library needed: Chromium reads NUL-terminated JSON commands
    on fd 3 and writes replies and events on fd 4.  Tests wait for page state
    (``wait_for(js)``), never for a fixed time, so a slow machine only makes
    them slower.
    """

    def __init__(self, path: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="se-chromium-")
        # stderr goes to a file: a pipe nobody reads would fill over a module's tests and stall Chromium.
        # It lives as long as the browser: close() closes it.
        self._stderr = open(os.path.join(self._profile.name, "stderr.log"), "w+b")  # noqa: SIM115
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # in the child between fork and exec: the pipes go to fds 3 and 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self._proc = subprocess.Popen(
            [path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            # subprocess cannot put a pipe at a chosen fd number; child_fds only calls fcntl and dup2, which
            # take no locks, so the fork-with-threads hazard PLW1509 warns of does not apply.
            preexec_fn=child_fds,  # noqa: PLW1509
            close_fds=False)  # close_fds would also close fds 3 and 4
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._session = ""
        self._context = ""

    def alive(self) -> bool:
        return self._proc.poll() is None

    def new_context(self) -> None:
        """Pages opened from now on are in a new, empty browser context (like a fresh incognito window)."""
        self._context = self.command("Target.createBrowserContext", session=False)["browserContextId"]
        self._session = ""

    def end_context(self) -> None:
        """Close the context's pages and drop everything it stored."""
        context, self._context, self._session = self._context, "", ""
        if context and self.alive():
            self.command("Target.disposeBrowserContext", session=False, browserContextId=context)

    def command(self, method: str, session: bool = True, **params: Any) -> Dict[str, Any]:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session and self._session:
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    error = reply["error"].get("message", "")
                    kind = PageChanged if "navigated" in error or "Cannot find context" in error else AssertionError
                    raise kind(f"{method} failed: {reply['error']}")
                return reply.get("result", {})

    def _read(self) -> Dict[str, Any]:
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError("chromium did not answer within the deadline")
            data = os.read(self._from_chrome, 1 << 20)
            if not data:
                raise AssertionError(f"chromium exited: {self._stderr_tail()}")
            self._buffer += data
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")[-2000:]

    def open(self, url: str) -> None:
        """Open ``url``; a run asked for with ``?autorun`` also gets ``debug=1`` (its tokens and events dumped)."""
        self.open_plain(url + "&debug=1" if "autorun=" in url and "debug=" not in url else url)

    def open_plain(self, url: str) -> None:
        """Open ``url`` the way a link on its own site does: ``?autorun`` asks only for a same-origin request.

        A page of the same origin is opened first and its script goes to
        ``url``, so the browser sends ``Sec-Fetch-Site: same-origin``; a URL
        typed in (``Page.navigate``) would be ``none``, like a link opened from a mail app.
        """
        context = {"browserContextId": self._context} if self._context else {}
        target = self.command("Target.createTarget", session=False, url="about:blank", **context)["targetId"]
        self._session = self.command("Target.attachToTarget", session=False, targetId=target,
                                     flatten=True)["sessionId"]
        origin = "/".join(url.split("/", 3)[:3])
        self.command("Page.navigate", url=origin + "/healthz")
        self.wait_for(f"location.origin === {json.dumps(origin)} && document.readyState === 'complete'")
        try:
            self.js(f"location.href = {json.dumps(url)}")
        except PageChanged:  # the navigation began before the evaluation answered
            pass

    def js(self, expression: str) -> Any:
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy (a failure guard, not a speed assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except PageChanged:  # asked while the page navigated: ask the next page
                value = None
            if value or time.monotonic() > deadline:
                assert value, f"{expression!r} never became true; page:\n{self.js('document.body.innerText')[-2000:]}"
                return value
            time.sleep(0.05)

    def close(self) -> None:
        try:
            os.write(self._to_chrome, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
            self._proc.wait(15)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait(5)
        finally:
            os.close(self._to_chrome)
            os.close(self._from_chrome)
            self._stderr.close()
            self._profile.cleanup()


def logged(browser: Browser) -> Dict[str, Any]:
    """What the page's test hook recorded for its last run: state, token texts, event types."""
    state = browser.wait_for(FINISHED)
    return {"state": state, "tokens": json.loads(browser.js("document.getElementById('log').textContent")),
            "events": json.loads(browser.js("document.getElementById('events').textContent"))}


# --- hostile text ----------------------------------------------------------------------------------

def test_hostile_text_reaches_the_browser_as_identical_token_events(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    call = block("lookup", {"city": "Oslo"})
    with FakeProvider() as fp:
        fp.add_turn(*[s.text(t) for t in HOSTILE], s.text(call))
        # The lone surrogate comes last: echoed back in a continuation it would hit the client bug
        # shown by test_wsgi.test_a_lone_surrogate_from_the_model_survives_the_next_round.
        fp.add_turn(s.text(MARKUP), LONE_SURROGATE_FRAME, s.text("done."))
        with make_engine(fp, [lookup]) as engine, \
                serving(make_wsgi_app(engine, heartbeat_s=0.2), channel_request_lookahead=1) as url:
            browser.open(f"{url}/?autorun={quote('weather in Oslo?')}")
            log = logged(browser)
            requests_seen = fp.requests
    assert log["state"] == "done"
    assert log["tokens"] == HOSTILE + [call, MARKUP, LONE_SURROGATE, "done."]
    assert log["events"] == (["round"] + ["token"] * (len(HOSTILE) + 1) + ["tool_start", "tool_result", "round"]
                             + ["token"] * 3 + ["done", "[DONE]"])
    assert browser.js("document.title") == "streamengine"  # the model's markup stayed text
    assert browser.js("document.querySelectorAll('#conversation script, #conversation img').length") == 0
    assert MARKUP in browser.js("document.getElementById('conversation').textContent")
    assert requests_seen[0].json["messages"][-1] == {"role": "user", "content": "weather in Oslo?"}
    assert len(requests_seen) == 2  # one run, two rounds: nothing was replayed


# --- errors, reset, chips, Markdown, conversation ------------------------------------------------------

def test_a_model_error_is_shown_once_and_no_first_token_time_is_claimed(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.http_error(400, {"error": {"message": "secret upstream detail sk-123"}}))
        with make_engine(fp, max_retries=0) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=hi")
            log = logged(browser)
    assert log["state"] == "failed" and "error" in log["events"]
    assert browser.js("document.querySelectorAll('.error').length") == 1
    notice = browser.js("document.querySelector('.error').textContent")
    assert "request id" in notice and "sk-123" not in notice
    assert browser.js("Array.from(document.querySelectorAll('.text')).map(e => e.textContent).join('')") == ""
    status = browser.js("document.getElementById('status').textContent")
    assert status.startswith("failed") and "first token" not in status, status
    assert browser.js("document.getElementById('status').getAttribute('data-state')") == "error"


def test_a_reset_clears_its_rounds_text(browser):
    with FakeProvider() as fp:
        fp.respond_with(lambda request: [s.text("draft "), s.text("WRONG"), s.delay(0.05), s.drop()]
                        if request["model"] == "flaky" else [s.text("right"), s.text(" answer")])
        with make_engine(fp, models=["flaky", "steady"], max_retries=0, failover_after_tokens=True) as engine, \
                serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=hi")
            log = logged(browser)
    assert log["state"] == "done"
    assert log["events"] == ["round", "token", "token", "reset", "token", "token", "done", "[DONE]"]
    assert browser.js("document.querySelector('.text').textContent") == "right answer"


def test_a_problem_the_run_went_on_past_is_a_notice_not_a_failure(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    with FakeProvider() as fp:
        # The answer ends normally but inside a tool block the model never closed.
        fp.add_turn(s.text("Let me see "), s.text('<tool name="lookup">{"city": "Oslo"'))
        with make_engine(fp, [lookup], max_retries=0) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=hi")
            log = logged(browser)
    assert log["state"] == "done" and "error" in log["events"]
    assert browser.js("document.querySelectorAll('.error').length") == 0
    notices = browser.js("Array.from(document.querySelectorAll('.notice')).map(e => e.textContent)")
    assert len(notices) == 1 and "request id" in notices[0]


def test_tool_chips_turn_green_markup_stays_off_screen_and_markdown_is_built_as_nodes(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    call = block("lookup", {"city": "Oslo"})
    answer = ("Result:\n\n- *sunny*\n- `20C` and **dry**\n\n```\ncode <b>x</b>\n```\n"
              "See [docs](https://example.com/a) or [bad](javascript:alert(1)) <i>raw</i>")
    with FakeProvider() as fp:
        fp.add_turn(s.text("Let me check **Oslo**.\n\n"), s.text(call[:9]), s.text(call[9:]), s.text("\n"))
        fp.add_turn(s.text(answer))
        with make_engine(fp, [lookup]) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=weather")
            log = logged(browser)
    assert log["state"] == "done" and call in "".join(log["tokens"])  # programs still get the block
    chip = "document.querySelector('.tool')"
    assert browser.js(f"{chip}.className") == "tool ok"
    assert browser.js(f"getComputedStyle({chip}).backgroundColor") == "rgb(220, 252, 231)"  # green
    assert browser.js(f"{chip}.textContent").startswith("\u2713 lookup")
    shown = browser.js("document.getElementById('conversation').innerText")
    assert "<tool" not in shown and "Oslo\"}" not in shown and "</tool>" not in shown
    first = browser.js("document.querySelector('.text').textContent")
    assert first == "Let me check Oslo."
    q = "document.querySelectorAll('section')[1].querySelector('.text')"
    assert browser.js(f"{q}.querySelector('strong').textContent") == "dry"
    assert browser.js(f"Array.from({q}.querySelectorAll('ul > li')).map(e => e.textContent)") == \
        ["sunny", "20C and dry"]
    assert browser.js(f"{q}.querySelector('li em').textContent") == "sunny"
    assert browser.js(f"{q}.querySelector('li code').textContent") == "20C"
    assert browser.js(f"{q}.querySelector('pre code').textContent") == "code <b>x</b>"
    links = browser.js(f"Array.from({q}.querySelectorAll('a')).map(a => [a.textContent, a.href])")
    assert links == [["docs", "https://example.com/a"]]
    assert "[bad](javascript:alert(1)) <i>raw</i>" in browser.js(f"{q}.textContent")
    assert browser.js("document.querySelectorAll('#conversation b, #conversation i, #conversation script')"
                      ".length") == 0


def test_a_follow_up_question_carries_the_earlier_turns(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Paris."))
        fp.add_turn(s.text("About 2 million."))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun={quote('Capital of France?')}&then={quote('Population?')}")
            browser.wait_for("(document.getElementById('log') || document.createElement('pre'))"
                             ".getAttribute('data-turns') === '2'")
            sent = [r.json["messages"] for r in fp.requests]
    assert sent == [
        [{"role": "user", "content": "Capital of France?"}],
        [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."},
         {"role": "user", "content": "Population?"}],
    ]
    assert browser.js("document.querySelectorAll('.turn').length") == 2


# --- other sites ------------------------------------------------------------------------------------

def test_another_sites_img_cannot_start_a_run_even_with_allow_origin_star(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("spent"))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine, allow_origin="*")) as target:
            evil_page = (f'<!doctype html><title>evil</title><img src="{target}/v1/chat/stream?q=spend" '
                         "onerror=\"document.title='img-failed'\" onload=\"document.title='img-loaded'\">")

            def evil(environ, start_response):
                start_response("200 OK", [("Content-Type", "text/html")])
                return [evil_page.encode()]

            with serving(evil) as attacker:
                # localhost vs 127.0.0.1: a different site, as an attacker's domain would be
                browser.open(attacker.replace("127.0.0.1", "localhost") + "/")
                assert browser.wait_for("document.title.startsWith('img-') && document.title") == "img-failed"
            assert fp.request_count == 0


def test_the_stop_button_closes_the_stream_and_the_run_is_cancelled(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Thinking very hard "), s.stall())
        with make_engine(fp, idle_timeout=30.0, completion_timeout=60.0) as engine:
            app = make_wsgi_app(engine, heartbeat_s=0.2)
            with serving(app, channel_request_lookahead=1) as url:
                browser.open(f"{url}/?autorun=hi")
                browser.wait_for("(document.querySelector('.text') || {}).textContent === 'Thinking very hard '")
                assert app.active_streams == 1
                browser.js("document.getElementById('stop').click()")
                assert browser.js("document.getElementById('status').textContent").startswith("stopped")
                conn = f"FakeProvider-{fp.port}-conn"
                assert wait_for(lambda: not [t for t in threading.enumerate() if t.name == conn], timeout=10)
                assert wait_for(lambda: app.active_streams == 0)


# --- the first hour: what a newcomer saw on the page --------------------------------------------------

def test_without_debug_the_page_dumps_no_tokens_or_events(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello there."))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open_plain(f"{url}/?autorun=hi")
            browser.wait_for(FINISHED)
    assert browser.js("document.getElementById('log').hidden && document.getElementById('events').hidden")
    dumped = browser.js("document.getElementById('log').textContent + document.getElementById('events').textContent")
    assert dumped == ""
    assert "[" not in browser.js("document.getElementById('conversation').innerText")


def test_status_words_skipped_chips_tool_errors_and_markup_spacing(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        if city == "Atlantis":
            raise ValueError("no such city: Atlantis")
        return f"sunny in {city}"

    oslo, atlantis = block("lookup", {"city": "Oslo"}), block("lookup", {"city": "Atlantis"})
    with FakeProvider() as fp:
        fp.add_turn(s.text(f"It is sunny {oslo}. Twice {oslo} and  {atlantis} done."))
        fp.add_turn(s.text(f"Again {oslo}"))
        with make_engine(fp, [lookup], max_continuations=1) as engine, \
                serving(make_wsgi_app(engine, expose_errors=True)) as url:
            browser.open(f"{url}/?autorun=weather")
            log = logged(browser)
    assert log["state"] == "done"
    first = browser.js("document.querySelector('.text').textContent")
    assert first == "It is sunny. Twice and done.", first  # no double space, no space before the stop
    chips = browser.js("Array.from(document.querySelectorAll('section')[0].querySelectorAll('.tool'))"
                       ".map(c => [c.className, c.textContent])")
    assert [c[0] for c in chips] == ["tool ok", "tool skipped", "tool failed"], chips
    assert "skipped" in chips[1][1] and "no such city: Atlantis" in chips[2][1]
    status = browser.js("document.getElementById('status').textContent")
    assert "stopped after the last revision round" in status and "max_continuations_reached" not in status


def test_a_skipped_call_is_shown_as_skipped_not_failed_with_errors_hidden(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    @tool(side_effects=True)
    def send(to: str) -> str:
        """Sends."""
        return "sent"

    oslo = block("lookup", {"city": "Oslo"})
    with FakeProvider() as fp:
        fp.add_turn(s.text(f"Weather {oslo} again {oslo} and mail {block('send', {'to': 'x'})}."))
        fp.add_turn(s.text("Sunny."))
        with make_engine(fp, [lookup, send]) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=weather")
            log = logged(browser)
    assert log["state"] == "done"
    chips = browser.js("Array.from(document.querySelectorAll('section')[0].querySelectorAll('.tool'))"
                       ".map(c => [c.className, c.textContent])")
    assert [c[0] for c in chips] == ["tool ok", "tool skipped", "tool skipped"], chips
    assert "repeat" in chips[1][1] and "not approved" in chips[2][1], chips
    assert not [c for c in chips if "failed" in c[1] or "\u2717" in c[1]], chips


def test_a_cut_off_answer_and_a_refusal_are_told(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Hello"), s.finish("length"))
        fp.add_turn(s.raw(b'data: {"choices":[{"index":0,"delta":{"refusal":"I can\'t help with that."}}]}\n\n'),
                    s.finish("stop"), s.done())
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=hi")
            logged(browser)
            notices = browser.js("Array.from(document.querySelectorAll('.notice')).map(e => e.textContent)")
            status = browser.js("document.getElementById('status').textContent")
            browser.open(f"{url}/?autorun=pick+a+lock")
            log = logged(browser)
    assert notices == ["The answer was cut off at the token limit."] and status.startswith("cut off")
    assert "refusal" in log["events"]
    assert browser.js("document.querySelector('.refusal').textContent") == "The model refused: I can't help with that."
    assert browser.js("document.getElementById('status').textContent").startswith("refused")


def test_reasoning_shows_live_in_a_collapsed_block_above_the_answer(browser):
    thinking = threading.Event()
    with FakeProvider() as fp:
        fp.add_turn(s.reasoning("Let me think "), s.reasoning(MARKUP), s.wait(thinking, timeout=30),
                    s.text("It is "), s.text("sunny."))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=weather")
            # Live: the block shows the thinking while the answer has not begun.
            live = browser.wait_for("(function () { var d = document.querySelector('details.reasoning');"
                                    " return d && !d.hidden && d.textContent.indexOf('</pre>') >= 0"
                                    " ? [d.open, d.querySelector('summary').textContent,"
                                    " document.getElementById('status').textContent] : null; })()")
            answer_while_thinking = browser.js("document.querySelector('.text').textContent")
            thinking.set()
            log = logged(browser)
    assert live == [False, "Thinking\u2026", "thinking\u2026"]
    assert answer_while_thinking == ""
    assert log["state"] == "done" and log["events"].count("reasoning") == 2
    assert log["tokens"] == ["It is ", "sunny."]  # reasoning is never a token
    above = "document.querySelector('details.reasoning').compareDocumentPosition(document.querySelector('.text'))"
    assert browser.js(f"{above} & Node.DOCUMENT_POSITION_FOLLOWING") != 0  # the block is above the answer
    assert browser.js("document.querySelector('details.reasoning summary').textContent") == "Reasoning"
    assert browser.js("document.querySelector('details.reasoning .thought').textContent") == "Let me think " + MARKUP
    assert browser.js("document.querySelector('details.reasoning').open") is False
    assert browser.js("document.querySelector('.text').textContent") == "It is sunny."
    assert browser.js("document.querySelectorAll('#conversation script, #conversation img').length") == 0


def test_each_round_keeps_its_own_reasoning_block(browser):
    @tool
    def lookup(city: str) -> str:
        """Weather for a city."""
        return f"sunny in {city}"

    with FakeProvider() as fp:
        fp.add_turn(s.reasoning("I need the weather."), s.text(block("lookup", {"city": "Oslo"})))
        fp.add_turn(s.reasoning("Now I know."), s.text("Sunny."))
        with make_engine(fp, [lookup]) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open(f"{url}/?autorun=weather")
            log = logged(browser)
    assert log["state"] == "done" and log["events"].count("reasoning") == 2
    blocks = browser.js("Array.from(document.querySelectorAll('details.reasoning')).map(d => [d.hidden, "
                        "d.querySelector('summary').textContent, d.querySelector('.thought').textContent])")
    assert blocks == [[False, "Reasoning", "I need the weather."], [False, "Reasoning", "Now I know."]]


@pytest.mark.parametrize("text", ["[" * 4_000_000, "<tool " * 800_000],
                         ids=["4M-open-brackets", "4MB-unclosed-tool-tags"])
def test_the_renderers_are_linear_in_their_input(browser, text):
    """Quadratic, these inputs would keep the page busy for minutes (480,000 "[" took 2.35 s); linear, moments.

    The page is asked once (a guard against a hang, not a speed assertion).
    """
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
        browser.open(f"{url}/?debug=1")
        browser.wait_for("typeof window.streamengineDebug === 'object'")
        browser.js(f"window.bigInput = {json.dumps(text[:16])}.repeat({len(text) // 16})")
        shown = browser.js("window.streamengineDebug.render(window.bigInput)")
        hidden = browser.js("window.streamengineDebug.visible(window.bigInput, true).length")
    if text.startswith("["):
        assert shown == len(text) and hidden == len(text)
    else:
        assert hidden == 0  # an unclosed block hides the rest


def test_autorun_needs_a_same_origin_request(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("spent"))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as target:
            link = f"{target}/?autorun=spend"
            evil_page = f'<!doctype html><title>evil</title><a id="go" href="{link}">go</a>'

            def evil(environ, start_response):
                start_response("200 OK", [("Content-Type", "text/html")])
                return [evil_page.encode()]

            with serving(evil) as attacker:
                browser.open(attacker.replace("127.0.0.1", "localhost") + "/")
                # The evil page answers /healthz too (open() goes there first): wait for "/" itself, loaded.
                browser.wait_for("location.pathname === '/' && document.readyState === 'complete' "
                                 "&& document.getElementById('go') !== null")
                browser.js("document.getElementById('go').click()")
                browser.wait_for("(document.getElementById('prompt') || {}).value === 'spend'")
                status = browser.js("document.getElementById('status').textContent")
            assert fp.request_count == 0
    assert "opened from a link" in status


# --- runs that outlive their connection (make_wsgi_app(runs=...), issue 38) ---------------------------

def counting(fp: FakeProvider, words: int, every_s: float) -> str:
    fp.add_turn(*[step for i in range(words) for step in (s.text(f"w{i} "), s.delay(every_s))])
    return "".join(f"w{i} " for i in range(words))


ANSWER_TEXT = "Array.from(document.querySelectorAll('.text')).map(function (e) { return e.textContent; }).join('')"


def test_a_plain_event_source_resumes_by_itself_after_the_server_drops_it(browser, tmp_path):
    with FakeProvider() as fp:
        answer = counting(fp, 40, 0.1)
        with make_engine(fp) as engine, SqliteRunLog(str(tmp_path / "runs.sqlite")) as log:
            cut = CutAfter(make_wsgi_app(engine, runs=log, on_disconnect="detach", heartbeat_s=0.2), writes=4)
            with serving(cut) as url:
                browser.open_plain(f"{url}/healthz")
                browser.wait_for("document.readyState === 'complete'")
                browser.js("""(function () {
                    window.got = []; window.opens = 0;
                    var es = new EventSource('/v1/chat/stream?q=count');
                    es.onopen = function () { window.opens += 1; };
                    es.onmessage = function (e) { if (e.data !== '[DONE]') { got.push([e.lastEventId, e.data]); } };
                    es.addEventListener('done', function (e) { got.push([e.lastEventId, 'done']); });
                    es.onerror = function () { if (es.readyState === 2) { window.closedByServer = true; } };
                }())""")
                browser.wait_for("window.closedByServer === true", timeout=30)
                got = browser.js("window.got")
                opens = browser.js("window.opens")
        tokens = "".join(json.loads(data) for _, data in got if data != "done")
        assert tokens == answer and got[-1][1] == "done"
        seqs = [int(event_id.rpartition(".")[2]) for event_id, _ in got]
        assert seqs == sorted(set(seqs))  # every frame once, in order (rounds are frames too, not shown here)
        assert cut.cuts >= 2 and opens >= 3
        assert fp.request_count == 1  # resumed each time, never asked again


def test_the_page_reconnects_after_a_drop_and_reattaches_after_a_reload(browser, tmp_path):
    with FakeProvider() as fp:
        answer = counting(fp, 40, 0.05)
        with make_engine(fp) as engine, SqliteRunLog(str(tmp_path / "runs.sqlite")) as log:
            cut = CutAfter(make_wsgi_app(engine, runs=log, on_disconnect="detach", heartbeat_s=0.2), writes=6)
            with serving(cut) as url:
                browser.open_plain(f"{url}/")
                browser.wait_for("document.getElementById('prompt') !== null")
                browser.js("document.getElementById('prompt').value = 'count'; "
                           "document.getElementById('ask').requestSubmit()")
                browser.wait_for(f"{ANSWER_TEXT}.indexOf('w8 ') >= 0")
                assert browser.js("JSON.parse(sessionStorage.getItem('streamengine.run')).question") == "count"
                try:
                    browser.js("location.reload()")
                except PageChanged:
                    pass
                browser.wait_for(f"{ANSWER_TEXT} === {json.dumps(answer.strip())} || {ANSWER_TEXT} === "
                                 f"{json.dumps(answer)}", timeout=30)
                browser.wait_for("document.getElementById('status').textContent.indexOf('done') === 0")
                assert browser.js("sessionStorage.getItem('streamengine.run')") is None
        assert cut.cuts >= 2 and fp.request_count == 1


def test_the_stop_button_stops_the_run_through_the_stop_route(browser, tmp_path):
    with FakeProvider() as fp:
        counting(fp, 400, 0.05)
        with make_engine(fp) as engine, SqliteRunLog(str(tmp_path / "runs.sqlite")) as log:
            app = make_wsgi_app(engine, runs=log, heartbeat_s=0.2)
            with serving(app) as url:
                browser.open(f"{url}/?autorun=count")
                browser.wait_for(f"{ANSWER_TEXT}.indexOf('w3 ') >= 0")
                run_id = browser.js("JSON.parse(sessionStorage.getItem('streamengine.run')).id")
                browser.js("document.getElementById('stop').click()")
                assert browser.wait_for(FINISHED) == "stopped"
                status = log.status(run_id, "anonymous")
                assert status.state == "cancelled"
                assert json.loads(status.terminal.data)["cancel_reason"] == "stopped"
                assert "stopped" in browser.js("document.getElementById('status').textContent")


@tool(side_effects=True)
def delete_file(path: str) -> str:
    """Delete a file (asked about first)."""
    return f"deleted {path}"


@pytest.mark.parametrize("choice", ["yes", "no"])
def test_approve_and_deny_buttons_answer_a_held_call(browser, tmp_path, choice):
    with FakeProvider() as fp:
        fp.add_turn(s.text("On it. " + block("delete_file", {"path": "/tmp/x"})))
        fp.add_turn(s.text("Handled."))
        log = SqliteRunLog(str(tmp_path / "runs.sqlite"))
        with make_engine(fp, tools=[delete_file]) as engine, log, \
                serving(make_wsgi_app(engine, runs=log, approvals=True)) as url:
            browser.open(f"{url}/?autorun=delete")
            browser.wait_for("document.querySelector('.tool.held button[data-approve]') !== null")
            assert "delete_file" in browser.js("document.querySelector('.tool.held').textContent")
            browser.js(f"document.querySelector('.tool.held button[data-approve=\"{choice}\"]').click()")
            assert browser.wait_for(FINISHED) == "done"
            chip = browser.js("document.querySelector('.tool').className")
            assert chip == ("tool ok" if choice == "yes" else "tool skipped")
            assert "approval_request" in logged(browser)["events"]


def test_a_reattach_past_the_logs_cap_says_part_of_the_answer_is_gone(browser, tmp_path):
    path = str(tmp_path / "runs.sqlite")
    with FakeProvider() as fp:
        answer = counting(fp, 30, 0.0)
        with make_engine(fp) as engine, SqliteRunLog(path, max_events=5) as log, \
                serving(make_wsgi_app(engine, runs=log)) as url:
            browser.open(f"{url}/?autorun=count")
            assert browser.wait_for(FINISHED) == "done"
            assert browser.js(ANSWER_TEXT) == answer  # the live stream had every token
            with sqlite3.connect(path) as db:  # the run's id, as the server keeps it
                run_id = db.execute("SELECT run_id FROM runs").fetchone()[0]
            # A reload in another tab of this run: only its last frames are kept.
            browser.open_plain(f"{url}/healthz")
            browser.wait_for("location.pathname === '/healthz'")
            saved = json.dumps({"id": run_id, "url": f"/v1/runs/{run_id}", "question": "count"})
            browser.js(f"sessionStorage.setItem('streamengine.run', {json.dumps(saved)})")
            try:
                browser.js("location.href = '/'")
            except PageChanged:
                pass
            browser.wait_for("document.querySelector('.notice') !== null")
            assert "no longer kept" in browser.js("document.querySelector('.notice').textContent")
            browser.wait_for("document.getElementById('status').textContent.indexOf('done') === 0")
