"""The real ``useChat`` hook in headless Chromium, against the app mounted beside a Flask app.

A small React page (tests/web/frontend/usechat-page.jsx) is bundled by
esbuild at test time into a temporary directory (never committed), served by
a Flask route, and the app is mounted under ``/chat`` of the same origin, as
docs/frontends.md tells a team to do.  The test types into the page and
waits on the DOM that React renders from the streamed parts.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from node_support import FRONTEND, NODE_TIMEOUT_S, require_node
from test_browser import Browser, browser, chromium, chromium_process  # noqa: F401 (fixtures)
from wsgi_support import make_engine, serving

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app, mount

pytestmark = pytest.mark.usefixtures("no_thread_leak")

PAGE = ('<!doctype html><meta charset="utf-8"><title>useChat</title><div id="root"></div>'
        '<script>window.CHAT_API = "/chat/api/chat";</script><script src="/app.js"></script>')


@pytest.fixture(scope="module")
def bundle() -> Iterator[Path]:
    """The page's script, bundled from usechat-page.jsx with the real react, react-dom and @ai-sdk/react."""
    require_node()
    with tempfile.TemporaryDirectory(prefix="se-usechat-") as out:
        target = Path(out) / "app.js"
        done = subprocess.run(
            [str(FRONTEND / "node_modules" / ".bin" / "esbuild"), "usechat-page.jsx", "--bundle",
             "--minify", "--jsx=automatic", "--define:process.env.NODE_ENV=\"production\"", f"--outfile={target}",
             "--log-level=warning"],
            cwd=FRONTEND, capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False)
        assert done.returncode == 0, f"esbuild failed:\n{done.stderr[-3000:]}"
        yield target


def flask_site(script: Path):
    """The team's own Flask app: it serves the page and its script; the chat app is mounted beside it."""
    flask = pytest.importorskip("flask")
    site = flask.Flask(__name__)
    site.add_url_rule("/", "page", lambda: flask.Response(PAGE, mimetype="text/html"))
    site.add_url_rule("/app.js", "script", lambda: flask.Response(script.read_bytes(),
                                                                   mimetype="text/javascript"))
    return site


@tool
def lookup(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def ask(browser: Browser, text: str) -> None:
    """Type ``text`` into the prompt box as a person does, and press Send."""
    browser.wait_for("document.getElementById('send') && !document.getElementById('send').disabled")
    browser.js("document.getElementById('prompt').focus()")
    browser.command("Input.insertText", text=text)
    browser.wait_for(f"document.getElementById('prompt').value === {json.dumps(text)}")
    browser.js("document.getElementById('send').click()")


def test_use_chat_renders_streamed_text_and_a_tool_card_in_chromium(browser, bundle):
    with FakeProvider() as fp:
        fp.add_turn(s.text("Let me check. "), s.tool_call(0, id="call_1", name="lookup", arguments='{"city": "Oslo"}'),
                    s.finish("tool_calls"))
        fp.add_turn(s.text("It is "), s.text("sunny."))
        fp.add_turn(s.http_error(400, {"error": {"message": "upstream secret sk-123"}}))
        site = flask_site(bundle)
        with make_engine(fp, [lookup], max_retries=0) as engine, \
                serving(mount(site.wsgi_app, "/chat", make_wsgi_app(engine, ai_sdk_version=7))) as url:
            browser.open_plain(url + "/")
            ask(browser, "weather in Oslo?")
            browser.wait_for("document.getElementById('status').textContent === 'ready' && "
                             "document.querySelectorAll('li.assistant .text').length === 2")
            shown = browser.js("Array.from(document.querySelectorAll('li.assistant .text')).map(e => e.textContent)")
            card = browser.js("[document.querySelector('.tool').textContent, "
                              "document.querySelector('.tool').getAttribute('data-state')]")
            ask(browser, "and tomorrow?")
            browser.wait_for("document.getElementById('status').textContent === 'error'")
            error = browser.js("document.getElementById('error').textContent")
            user_turns = browser.js("Array.from(document.querySelectorAll('li.user')).map(e => e.textContent)")
    assert shown == ["Let me check.", "It is sunny."]
    assert card == ["lookup: sunny in Oslo", "output-available"]
    assert "request id" in error and "sk-123" not in error
    assert user_turns == ["weather in Oslo?", "and tomorrow?"]
