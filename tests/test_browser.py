"""The page in a real browser: headless Chromium driven over the DevTools protocol (a pipe).

What a browser really does is asserted in a browser: hostile text stays text,
an error shows once, a ``reset`` clears its round, a tool chip turns green,
tool markup stays off screen, Markdown is rendered without HTML parsing, a
follow-up carries the earlier turns, and another site's ``<img>`` cannot
start a run.  The page runs under its own Content-Security-Policy, which
would also block a broken inline script.

Chromium is looked up on PATH; when it is missing the test installs it only
if running as root with ``STREAMENGINE_INSTALL_BROWSER=1`` (CI), and skips
otherwise.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterator, Optional
from urllib.parse import quote

import pytest

from streamengine.testing import FakeProvider, steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

from test_wsgi import HOSTILE, LONE_SURROGATE, LONE_SURROGATE_FRAME, block, make_engine, serving

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
    path = find_chromium()
    if path is None and os.environ.get("STREAMENGINE_INSTALL_BROWSER") == "1" and hasattr(os, "geteuid") \
            and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=600, check=False)
        path = find_chromium()
    if path is None:
        pytest.skip("chromium not installed: apt-get install chromium")
    return path


@pytest.fixture
def browser(chromium) -> Iterator["Browser"]:
    b = Browser(chromium)
    try:
        yield b
    finally:
        b.close()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

    No websocket library needed: Chromium reads NUL-terminated JSON commands
    on fd 3 and writes replies and events on fd 4.  Tests wait for page state
    (``wait_for(js)``), never for a fixed time, so a slow machine only makes
    them slower.
    """

    def __init__(self, path: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="se-chromium-")
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
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=child_fds, close_fds=False)  # close_fds would also close fds 3 and 4
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._session = ""

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
                    raise AssertionError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})

    def _read(self) -> Dict[str, Any]:
        deadline = time.monotonic() + BROWSER_TIMEOUT_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_chrome], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError("chromium did not answer within the deadline")
            data = os.read(self._from_chrome, 1 << 20)
            if not data:
                raise AssertionError(f"chromium exited: {self._proc.stderr.read().decode('utf-8', 'replace')[-2000:]}")
            self._buffer += data
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        target = self.command("Target.createTarget", session=False, url="about:blank")["targetId"]
        self._session = self.command("Target.attachToTarget", session=False, targetId=target,
                                     flatten=True)["sessionId"]
        self.command("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy (a failure guard, not a speed assertion)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
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
            self._proc.stderr.close()
            self._profile.cleanup()


def logged(browser: "Browser") -> Dict[str, Any]:
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
