"""Who may start a run: Host check, authorize hook, stream caps (under a real waitress), GET runs."""
from __future__ import annotations

import json
import threading
from typing import List

import pytest
import requests
from wsgi_support import Silent, Unused, call, environ_for, get_run, make_engine, read1_pieces, serving, sse, tokens_of

from streamengine import ConfigError
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s
from streamengine.wsgi import make_wsgi_app

pytestmark = pytest.mark.usefixtures("no_thread_leak")

ASK = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


def post(app, **extra):
    return call(app, environ_for("POST", "/v1/chat/stream", ASK, **extra))


# --- Host (DNS rebinding) ------------------------------------------------------------------------

@pytest.mark.parametrize("host,allowed", [
    ("127.0.0.1:8000", True), ("localhost", True), ("LOCALHOST:80", True), ("[::1]:8000", True),
    ("testserver:80", True),  # SERVER_NAME: the name the server was bound to (wsgiref's default here)
    ("evil.example", False), ("evil.example:8000", False), ("127.0.0.1.evil.example", False), ("", False),
    # userinfo is not part of a Host header, and a port is digits only
    ("127.0.0.1:80@evil.example", False), ("user@localhost", False), ("localhost:abc", False),
    ("localhost:", False), ("[::1]:x", False), ("[::1", False), ("localhost:\u0661", False),
])
def test_default_hosts_are_loopback_and_the_servers_own_name(host, allowed):
    engine = Silent()
    status, _, data = post(make_wsgi_app(engine), HTTP_HOST=host, SERVER_NAME="testserver")
    if allowed:
        assert status == "200 OK" and engine.runs == 1
    else:
        error = json.loads(data)
        assert status == "400 Bad Request" and error["field"] == "Host" and "allowed_hosts" in error["error"]
        assert engine.runs == 0


def test_allowed_hosts_replace_the_defaults_and_health_is_exempt():
    app = make_wsgi_app(Silent(), allowed_hosts=["chat.example.com"])
    assert post(app, HTTP_HOST="chat.example.com:443")[0] == "200 OK"
    assert post(app, HTTP_HOST="localhost")[0] == "400 Bad Request"
    assert call(app, environ_for("GET", "/", HTTP_HOST="evil.example"))[0] == "400 Bad Request"
    assert call(app, environ_for("GET", "/healthz", HTTP_HOST="10.1.2.3"))[0] == "200 OK"
    assert post(make_wsgi_app(Silent(), allowed_hosts=["*"]), HTTP_HOST="anything.example")[0] == "200 OK"
    for bad in ("chat.example.com", ["http://chat.example.com"], ["a/b"], [""]):
        with pytest.raises(ConfigError, match="allowed_hosts"):
            make_wsgi_app(Unused(), allowed_hosts=bad)


@pytest.mark.parametrize("host", ["attacker.example", "127.0.0.1:80@evil.example", "localhost:abc"])
def test_a_rebound_name_is_refused_by_a_real_server(host):
    with FakeProvider() as fp, make_engine(fp) as engine, serving(make_wsgi_app(engine)) as url:
        resp = requests.post(f"{url}/v1/chat/stream", data=ASK, timeout=10,
                             headers={"Host": host, "Content-Type": "application/json"})
        assert resp.status_code == 400 and resp.json()["field"] == "Host"
        assert fp.request_count == 0


# --- authorize ------------------------------------------------------------------------------------

def test_authorize_hook_401_403_500_and_pass():
    def authorize(environ):
        cookie = environ.get("HTTP_COOKIE", "")
        if "session=banned" in cookie:
            raise PermissionError("this account is suspended")
        if "session=broken" in cookie:
            raise RuntimeError("session store at redis://10.0.0.9 is down")
        return "session=ok" in cookie

    engine = Silent()
    app = make_wsgi_app(engine, authorize=authorize)
    status, _, data = post(app)
    assert status == "401 Unauthorized" and "sign in" in json.loads(data)["error"]
    status, _, data = post(app, HTTP_COOKIE="session=banned")
    assert status == "403 Forbidden" and "suspended" in json.loads(data)["error"]
    status, _, data = post(app, HTTP_COOKIE="session=broken")
    assert status == "500 Internal Server Error" and "10.0.0.9" not in data.decode()
    assert "request id" in json.loads(data)["error"]
    assert call(app, get_run("q=x"))[0] == "401 Unauthorized"
    assert engine.runs == 0
    assert post(app, HTTP_COOKIE="session=ok")[0] == "200 OK" and engine.runs == 1
    assert call(app, environ_for("GET", "/healthz"))[0] == "200 OK"  # health and page stay public


# --- stream caps, under waitress ---------------------------------------------------------------------

def open_stream(url: str, client: str = "") -> requests.Response:
    headers = {"X-Client": client} if client else {}
    resp = requests.post(f"{url}/v1/chat/stream", json={"messages": [{"role": "user", "content": "hi"}]},
                         stream=True, timeout=10, headers=headers)
    return resp


def held_turns(fp: FakeProvider, count: int, release: threading.Event, text: str) -> None:
    """``count`` model answers that wait for ``release``: their streams stay open until then."""
    for _ in range(count):
        fp.add_turn(s.wait(release, timeout=10), s.text(text))


def test_streams_over_the_cap_get_429_and_health_still_answers():
    """threads=4, max_streams=3: three held streams leave a thread for /healthz; a fourth stream is a 429."""
    release = threading.Event()
    with FakeProvider() as fp:
        held_turns(fp, 3, release, "late")
        with make_engine(fp) as engine:
            app = make_wsgi_app(engine, max_streams=3, max_streams_per_client=3, retry_after_s=7)
            with serving(app, threads=4) as url:
                held: List[requests.Response] = []
                try:
                    for _ in range(3):
                        resp = open_stream(url)
                        assert resp.status_code == 200 and next(read1_pieces(resp)) == b": ok\n\n"
                        held.append(resp)
                    assert fp.wait_for_requests(3, timeout=5) and app.active_streams == 3
                    health = requests.get(f"{url}/healthz", timeout=5)  # no thread free would hang here
                    assert health.status_code == 200
                    refused = open_stream(url)
                    assert refused.status_code == 429 and refused.headers["Retry-After"] == "7"
                    assert "limit of 3 concurrent streams" in refused.json()["error"]
                finally:
                    release.set()
                    bodies = [sse(r) for r in held]
                    for r in held:
                        r.close()
                assert [tokens_of(b) for b in bodies] == [["late"]] * 3
                assert requests.get(f"{url}/healthz", timeout=5).status_code == 200
                with open_stream(url) as again:  # slots are given back (no turn left: an error run)
                    assert again.status_code == 200 and "error" in [k for k, _ in sse(again)]
    assert fp.request_count == 4


def test_one_client_cannot_take_every_stream():
    release = threading.Event()
    with FakeProvider() as fp:
        held_turns(fp, 3, release, "ok")
        with make_engine(fp) as engine:
            app = make_wsgi_app(engine, max_streams=5, max_streams_per_client=2,
                                client_key=lambda environ: environ.get("HTTP_X_CLIENT", "anon"))
            with serving(app, threads=8) as url:
                held = [open_stream(url, "alice"), open_stream(url, "alice")]
                try:
                    refused = open_stream(url, "alice")
                    assert refused.status_code == 429 and "this client already has 2 open streams" in \
                        refused.json()["error"] and refused.headers["Retry-After"] == "5"
                    other = open_stream(url, "bob")
                    assert other.status_code == 200
                    held.append(other)
                finally:
                    release.set()
                    for r in held:
                        sse(r)
                        r.close()
    assert fp.request_count == 3


@pytest.mark.parametrize("kwargs", [{"max_streams": 0}, {"max_streams_per_client": -1}, {"retry_after_s": True},
                                    {"client_key": "REMOTE_ADDR"}, {"authorize": 1},
                                    {"stuck_reader_timeout_s": 0}, {"system_prompt": 5}])
def test_guard_settings_are_checked(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        make_wsgi_app(Unused(), **kwargs)


# --- GET runs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers,status", [
    ({"HTTP_ACCEPT": "text/event-stream"}, "200 OK"),                          # curl, a backend
    ({"HTTP_SEC_FETCH_SITE": "same-origin", "HTTP_SEC_FETCH_DEST": "empty",
      "HTTP_ACCEPT": "text/event-stream"}, "200 OK"),                          # the page's EventSource
    ({"HTTP_SEC_FETCH_SITE": "same-origin", "HTTP_SEC_FETCH_DEST": "image"}, "403 Forbidden"),  # <img> on the site
    ({"HTTP_SEC_FETCH_SITE": "cross-site", "HTTP_SEC_FETCH_DEST": "image"}, "403 Forbidden"),
    ({"HTTP_SEC_FETCH_SITE": "cross-site", "HTTP_SEC_FETCH_DEST": "empty",
      "HTTP_ORIGIN": "https://a.example"}, "403 Forbidden"),                   # even when allow_origin lists it
])
def test_get_runs_start_only_from_this_sites_scripts(headers, status):
    engine = Silent()
    app = make_wsgi_app(engine, allow_origin="*")
    assert call(app, environ_for("GET", "/v1/chat/stream", query="q=spend", **headers))[0] == status
    assert engine.runs == (1 if status == "200 OK" else 0)


def test_get_runs_can_be_turned_off():
    status, headers, data = call(make_wsgi_app(Unused(), get_runs=False),
                                 get_run("q=x"))
    assert status == "405 Method Not Allowed" and headers["Allow"] == "POST"
    assert "get_runs=True" in json.loads(data)["error"]
