"""A click never starts a run: not on a same-origin link the model wrote into an answer, not in an old browser.

A link such as ``/?autorun=spend`` in an answer is same-origin, so
``Sec-Fetch-Site`` alone lets it autorun; the browser marks the click with
``Sec-Fetch-User: ?1``, which a script's navigation never carries.  A browser
too old to send ``Sec-Fetch-*`` is told apart by ``Accept``: only EventSource
(or a client of your own) asks a GET run for ``text/event-stream``.
Over real HTTP on 127.0.0.1, with the headers Chromium sends.
"""
from __future__ import annotations

import pytest
import requests
from test_browser import browser, chromium, chromium_process  # noqa: F401 - fixtures
from test_links import PAGE_SCRIPT, SAME_ORIGIN_NAVIGATION, spend  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: A same-origin link clicked by a person (one the model wrote into an answer, say).
CLICKED_SAME_ORIGIN_LINK = dict(SAME_ORIGIN_NAVIGATION, **{"Sec-Fetch-User": "?1"})
#: What a browser without Sec-Fetch-* asks for with <img src=...> and <script src=...> tags.
OLD_BROWSER_TAGS = [{"Accept": "image/avif,image/webp,image/apng,*/*;q=0.8"}, {"Accept": "*/*"}]


def test_a_clicked_same_origin_autorun_link_only_fills_the_box(spend):
    url, fp, calls = spend
    clicked = requests.get(f"{url}/", params={"autorun": "spend it"}, headers=CLICKED_SAME_ORIGIN_LINK, timeout=10)
    assert clicked.status_code == 200 and '<meta name="autorun" content="off">' in clicked.text
    scripted = requests.get(f"{url}/", params={"autorun": "spend it"}, headers=SAME_ORIGIN_NAVIGATION, timeout=10)
    assert '<meta name="autorun" content="on">' in scripted.text  # the site's own script may still autorun
    assert fp.request_count == 0 and calls == []


def test_a_get_run_marked_as_a_click_is_refused_and_says_what_to_do(spend):
    url, fp, calls = spend
    resp = requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"},
                        headers=dict(PAGE_SCRIPT, **{"Sec-Fetch-User": "?1"}), timeout=10)
    assert resp.status_code == 403 and resp.json()["field"] == "Sec-Fetch-User"
    assert "open the page at / and ask there" in resp.json()["error"]
    assert fp.request_count == 0 and calls == []


@pytest.mark.parametrize("headers", OLD_BROWSER_TAGS)
def test_an_old_browsers_tag_cannot_start_a_get_run(spend, headers):
    url, fp, calls = spend
    resp = requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"}, headers=headers, timeout=10)
    assert resp.status_code == 403 and resp.json()["field"] == "Accept"
    assert "Accept: text/event-stream" in resp.json()["error"]
    assert fp.request_count == 0 and calls == []


def test_in_chromium_a_person_clicking_a_same_origin_autorun_link_starts_no_run(browser):
    """A real click (Input.dispatchMouseEvent, so the browser sends Sec-Fetch-User: ?1) on a link in the page."""
    from wsgi_support import make_engine, serving

    from streamengine.testing import FakeProvider
    from streamengine.testing import steps as s
    from streamengine.wsgi import make_wsgi_app

    with FakeProvider() as fp:
        fp.add_turn(s.text("spent"))
        with make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
            browser.open_plain(f"{url}/healthz?final=1")
            box = browser.wait_for(  # on the page open_plain goes to last, once loaded
                "location.search === '?final=1' && document.readyState === 'complete' && (function () {"
                " var a = document.getElementById('go') || document.body.appendChild(document.createElement('a'));"
                " a.id = 'go'; a.href = '/?autorun=spend'; a.textContent = 'spend'; a.style.fontSize = '40px';"
                " var r = a.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; }())")
            for kind in ("mousePressed", "mouseReleased"):
                browser.command("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
            browser.wait_for("(document.getElementById('prompt') || {}).value === 'spend'")
            status = browser.js("document.getElementById('status').textContent")
            assert fp.request_count == 0
    assert "press Send" in status
