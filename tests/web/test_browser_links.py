"""In a real Chromium: a link opened from outside the browser (typed, a bookmark, a mail app) starts no run.

The browser sends ``Sec-Fetch-Site: none`` for such a navigation, which the
tests here make with ``Page.navigate`` (the address bar's way): ``?autorun=``
only fills the prompt box, and the stream URL itself answers 403.
"""
from __future__ import annotations

import pytest
from test_browser import browser, chromium, chromium_process  # noqa: F401 - fixtures
from wsgi_support import make_engine, serving

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")


def test_a_link_opened_from_outside_the_browser_only_fills_the_box_and_starts_no_run(browser):
    with FakeProvider() as fp:
        fp.add_turn(s.text("spent"))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open_plain(f"{url}/healthz")
            browser.command("Page.navigate", url=f"{url}/?autorun=spend")  # as if typed or opened from a mail app
            browser.wait_for("(document.getElementById('prompt') || {}).value === 'spend'")
            status = browser.js("document.getElementById('status').textContent")
            browser.command("Page.navigate", url=f"{url}/v1/chat/stream?q=spend")
            refusal = browser.wait_for("document.body && document.body.innerText.includes('refused') "
                                       "&& document.body.innerText")
            assert fp.request_count == 0
    assert "press Send" in status
    assert "outside this site's page" in refusal
