"""SSE injection, checked by a real browser: headless Chromium reads the stream through EventSource.

The page served at ``/`` has a test hook: ``?autorun=PROMPT`` starts a stream on
load and, when ``[DONE]`` arrives, writes the token texts it received (JSON,
non-ASCII escaped) into ``<pre id="log">`` and the event types into
``<pre id="events">``.  Chromium's ``--dump-dom`` prints the DOM after the
stream, so the test sees exactly what the browser dispatched — through the
page's Content-Security-Policy, which would also block a broken inline script.

Chromium is looked up on PATH; when it is missing the test installs it only
if running as root with ``STREAMENGINE_INSTALL_BROWSER=1`` (CI), and skips
otherwise.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import List, Optional
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


def dump_dom(chromium: str, url: str) -> str:
    """The page's DOM after its scripts ran (the stream closes on [DONE], then the budget ends)."""
    with tempfile.TemporaryDirectory(prefix="se-chromium-") as profile:
        proc = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-quic", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-extensions",
             f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=BROWSER_TIMEOUT_S, check=False)
    dom = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 or "<html" not in dom:
        pytest.fail(f"chromium exited {proc.returncode}; stderr tail:\n"
                    f"{proc.stderr.decode('utf-8', 'replace')[-2000:]}")
    return dom


def pre(dom: str, element_id: str) -> re.Match:
    match = re.search(rf'<pre id="{element_id}"([^>]*)>(.*?)</pre>', dom, re.S)
    assert match, f"no <pre id={element_id!r}> in the DOM:\n{dom[-3000:]}"
    return match


def test_hostile_text_reaches_the_browser_as_identical_token_events(chromium):
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
            dom = dump_dom(chromium, f"{url}/?autorun={quote('weather in Oslo?')}")
            requests_seen = fp.requests
    log = pre(dom, "log")
    assert 'data-state="done"' in log.group(1), log.group(1)
    tokens: List[str] = json.loads(html.unescape(log.group(2)))
    assert tokens == HOSTILE + [call, MARKUP, LONE_SURROGATE, "done."]
    kinds = json.loads(html.unescape(pre(dom, "events").group(2)))
    assert kinds == (["round"] + ["token"] * (len(HOSTILE) + 1) + ["tool_start", "tool_result", "round"]
                     + ["token"] * 3 + ["done", "[DONE]"])
    assert "<title>streamengine</title>" in dom  # the model's markup stayed text
    assert requests_seen[0].json["messages"][-1] == {"role": "user", "content": "weather in Oslo?"}
    assert len(requests_seen) == 2  # the EventSource was closed on [DONE]: no reconnect replayed the question
