"""A link opened from outside the browser (a mail or chat app, a bookmark, a typed URL) never starts a run.

What a browser sends for such a link: ``Sec-Fetch-Site: none``,
``Sec-Fetch-Mode: navigate``, ``Sec-Fetch-Dest: document``.  Only the page's
own script (same-origin, ``Sec-Fetch-Dest: empty``, ``Accept: text/event-stream``)
may start a GET run, or have ``?autorun=`` ask on load; anything else only fills
the prompt box.  Clients that are not browsers send no ``Sec-Fetch-*`` headers
and keep working when they ask for ``text/event-stream``.
"""
from __future__ import annotations

import json

import pytest
import requests
from wsgi_support import STREAM_ACCEPT, Silent, block, call, environ_for, make_engine, serving, sse, tokens_of

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.tools import tool
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

#: What Chromium and Firefox send for a link clicked in another application (or typed, or a bookmark).
OPENED_LINK = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document",
               "Sec-Fetch-User": "?1", "Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
#: What the page's own script sends (fetch or EventSource).
PAGE_SCRIPT = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty",
               "Accept": "text/event-stream"}
#: A link on the site itself that a browser follows as a navigation.
SAME_ORIGIN_NAVIGATION = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate",
                          "Sec-Fetch-Dest": "document", "Accept": "text/html,*/*;q=0.8"}
#: A browser too old to send Sec-Fetch-* (Safari before 16.4) following a link: only its Accept says so.
OLD_BROWSER_LINK = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def as_environ(headers: dict) -> dict:
    return {"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()}


@pytest.fixture
def spend():
    """A served engine whose model calls ``spend`` at once; yields (url, FakeProvider, calls of spend)."""
    calls = []

    @tool
    def spend() -> str:
        """Spends money."""
        calls.append(1)
        return "spent"

    with FakeProvider() as fp:
        fp.add_turn(s.text(block("spend")))
        fp.add_turn(s.text("done"))
        with make_engine(fp, [spend]) as engine, serving(make_wsgi_app(engine)) as url:
            yield url, fp, calls


def test_a_link_opened_from_a_mail_app_does_not_run_the_tool(spend):
    url, fp, calls = spend
    resp = requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"}, headers=OPENED_LINK, timeout=10)
    assert resp.status_code == 403 and resp.json()["field"] == "Sec-Fetch-Site"
    assert "open the page" in resp.json()["error"]
    assert fp.request_count == 0 and calls == []


def test_a_same_origin_script_still_starts_a_get_run(spend):
    url, _fp, calls = spend
    with requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"}, headers=PAGE_SCRIPT, stream=True,
                      timeout=10) as resp:
        assert resp.status_code == 200
        events = sse(resp)
    assert tokens_of(events)[-1] == "done" and calls == [1]


def test_a_client_that_is_not_a_browser_starts_a_get_run_when_it_asks_for_a_stream(spend):
    url, _, calls = spend
    refused = requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"}, timeout=10)
    assert refused.status_code == 403 and refused.json()["field"] == "Accept"  # requests sends Accept: */*
    assert "send Accept: text/event-stream" in refused.json()["error"] and calls == []
    with requests.get(f"{url}/v1/chat/stream", params={"q": "spend it"}, headers=STREAM_ACCEPT, stream=True,
                      timeout=10) as resp:
        assert resp.status_code == 200  # no Sec-Fetch-*, like curl -H 'Accept: text/event-stream'
        sse(resp)
    assert calls == [1]


def test_an_opened_link_with_autorun_only_fills_the_box_over_http(spend):
    url, fp, _ = spend
    opened = requests.get(f"{url}/", params={"autorun": "spend it"}, headers=OPENED_LINK, timeout=10)
    assert opened.status_code == 200 and '<meta name="autorun" content="off">' in opened.text
    same_origin = requests.get(f"{url}/", params={"autorun": "spend it"}, headers=SAME_ORIGIN_NAVIGATION, timeout=10)
    assert '<meta name="autorun" content="on">' in same_origin.text
    assert fp.request_count == 0


@pytest.mark.parametrize("headers,status,field", [
    (OPENED_LINK, "403 Forbidden", "Sec-Fetch-Site"),
    (SAME_ORIGIN_NAVIGATION, "403 Forbidden", "Sec-Fetch-Dest"),   # a link on the site itself: not its script
    (dict(PAGE_SCRIPT, **{"Sec-Fetch-Mode": "navigate"}), "403 Forbidden", "Sec-Fetch-Mode"),
    (OLD_BROWSER_LINK, "403 Forbidden", "Accept"),
    (PAGE_SCRIPT, "200 OK", None),
    ({"Accept": "text/event-stream"}, "200 OK", None),                # curl, requests, a backend asking for it
    ({"Accept": "*/*"}, "403 Forbidden", "Accept"),                   # what a tag or a bare curl asks for
    ({}, "403 Forbidden", "Accept"),
])
def test_only_the_pages_own_script_or_a_non_browser_starts_a_get_run(headers, status, field):
    engine = Silent()
    got, _, data = call(make_wsgi_app(engine), environ_for("GET", "/v1/chat/stream", query="q=spend",
                                                           **as_environ(headers)))
    assert got == status and engine.runs == (1 if status == "200 OK" else 0)
    if field:
        assert json.loads(data)["field"] == field


@pytest.mark.parametrize("headers,autorun", [
    (OPENED_LINK, "off"),
    ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, "off"),
    ({"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, "off"),
    ({}, "off"),  # a browser that does not say where the request comes from
    (SAME_ORIGIN_NAVIGATION, "on"),
])
def test_autorun_is_on_only_for_a_same_origin_request(headers, autorun):
    _, _, page = call(make_wsgi_app(Silent()), environ_for("GET", "/", query="autorun=spend",
                                                           **as_environ(headers)))
    assert f'<meta name="autorun" content="{autorun}">'.encode() in page
