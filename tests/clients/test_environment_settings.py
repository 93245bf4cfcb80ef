"""The environment's proxies, NO_PROXY and ~/.netrc reach a request as requests would send them, read once.

A client that made its own session reads them at its first request to a URL
(as httpx and the openai SDK read them when the client is made), not on
every request; a session the caller passes keeps requests' own habit.  A
FakeProvider plays the proxy: requests sends it the absolute URL.
"""
from __future__ import annotations

import socket

import pytest
import requests

from streamengine import CompletionOptions, LlmConnectionError, OpenAICompatibleClient
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

MESSAGES = [{"role": "user", "content": "hi"}]
UPSTREAM = "http://upstream.invalid:9/v1"  # never resolved: only a proxy can answer for it


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
                 "NO_PROXY", "no_proxy", "OPENAI_API_KEY", "OPENAI_BASE_URL", "REQUESTS_CA_BUNDLE",
                 "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer(client: OpenAICompatibleClient) -> str:
    return "".join(c.content or "" for c in client.stream(MESSAGES, options=CompletionOptions(model="m")))


def test_http_proxy_from_the_environment_carries_the_request(monkeypatch):
    with FakeProvider() as proxy:
        proxy.add_turn(s.text("through the proxy"))
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.rsplit("/v1", 1)[0])
        with OpenAICompatibleClient(UPSTREAM) as client:
            assert answer(client) == "through the proxy"
        assert proxy.requests[0].path.startswith("http://upstream.invalid:9/v1/chat/completions")


def test_no_proxy_sends_the_request_directly(monkeypatch):
    with FakeProvider() as provider:
        provider.add_turn(s.text("direct"))
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with OpenAICompatibleClient(provider.base_url) as client:
            assert answer(client) == "direct"
        assert provider.requests[0].path == "/v1/chat/completions"


def test_netrc_credentials_are_sent_when_no_key_is_given(monkeypatch, tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login alice password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    with FakeProvider() as provider:
        provider.add_turn(s.text("hello"))
        with OpenAICompatibleClient(provider.base_url) as client:
            assert answer(client) == "hello"
        assert provider.requests[0].headers["Authorization"] == requests.auth._basic_auth_str("alice", "s3cret")


def test_the_environment_is_read_once_per_client_and_a_new_client_sees_a_change(monkeypatch):
    with FakeProvider() as provider:
        provider.add_turn(s.text("first"))
        provider.add_turn(s.text("second"))
        with OpenAICompatibleClient(provider.base_url) as client:
            assert answer(client) == "first"
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")  # set after the first request
            assert answer(client) == "second"  # still direct: read at the first request
        with OpenAICompatibleClient(provider.base_url) as fresh, pytest.raises(LlmConnectionError):
            answer(fresh)  # a new client reads the proxy, which refuses the connection


def test_a_session_the_caller_passes_reads_the_environment_per_request(monkeypatch):
    with FakeProvider() as provider:
        provider.add_turn(s.text("first"))
        session = requests.Session()
        with OpenAICompatibleClient(provider.base_url, session=session) as client:
            assert answer(client) == "first"
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
            with pytest.raises(LlmConnectionError):
                answer(client)  # requests' own habit, untouched: the session trusts the environment
        assert session.trust_env is True
        session.close()
