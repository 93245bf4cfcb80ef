"""Client options for the servers people run: stream_options, query, key header, /v1 hints, env vars.

Real loopback HTTP through FakeProvider; a tiny stdlib server stands in for
a server that serves its API only under a path FakeProvider does not know.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streamengine import ConfigError, LlmHttpError, OpenAICompatibleClient
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MESSAGES = [{"role": "user", "content": "hi"}]


def collect(client, **kwargs):
    return "".join(c.content or "" for c in client.stream(MESSAGES, **kwargs))


def test_stream_options_are_sent_by_default_and_can_be_turned_off():
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"))
        fp.add_turn(s.text("b"))
        with OpenAICompatibleClient(fp.base_url) as on, \
                OpenAICompatibleClient(fp.base_url, stream_options=False) as off:
            assert collect(on) == "a" and collect(off) == "b"
    assert fp.requests[0].json["stream_options"] == {"include_usage": True}
    assert "stream_options" not in fp.requests[1].json and fp.requests[1].json["stream"] is True


def test_a_server_that_refuses_stream_options_is_told_about_the_switch():
    def strict(payload):
        if "stream_options" in payload:
            return [s.http_error(400, {"error": {"message": "Unrecognized request argument supplied: stream_options"}})]
        return [s.text("fine")]

    with FakeProvider() as fp:
        fp.respond_with(strict)
        with OpenAICompatibleClient(fp.base_url) as client, pytest.raises(LlmHttpError) as caught:
            collect(client)
        with OpenAICompatibleClient(fp.base_url, stream_options=False) as client:
            assert collect(client) == "fine"
    message = str(caught.value)
    assert "Unrecognized request argument supplied: stream_options" in message
    assert "stream_options=False" in message and "--no-stream-options" in message


def test_query_parameters_and_a_query_in_base_url_go_with_every_request():
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"))
        fp.add_turn(s.text("b"))
        with OpenAICompatibleClient(fp.base_url + "?api-version=2024-10-21") as client:
            collect(client)
        with OpenAICompatibleClient(fp.base_url, query={"api-version": "preview"}) as client:
            collect(client)
    assert fp.requests[0].path == "/v1/chat/completions?api-version=2024-10-21"
    assert fp.requests[1].path == "/v1/chat/completions?api-version=preview"


def test_the_key_goes_bare_in_the_header_named_by_api_key_header():
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"))
        with OpenAICompatibleClient(fp.base_url, api_key="azure-key", api_key_header="api-key") as client:
            collect(client)
            assert "azure-key" not in repr(client)
    headers = fp.requests[0].headers
    assert headers["api-key"] == "azure-key" and "Authorization" not in headers


@pytest.mark.parametrize("kwargs, needle", [
    ({"api_key_header": "bad header"}, "not a valid HTTP header name"),
    ({"query": {"api-version": 3}}, "query parameters must be text"),
])
def test_bad_options_are_config_errors(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        OpenAICompatibleClient("http://127.0.0.1:9/v1", **kwargs)


class _RootOnly(BaseHTTPRequestHandler):
    """A server whose API lives under /v1 only (Ollama, vLLM): anything else is 404."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": "404 page not found"}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def root_only_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RootOnly)
    thread = threading.Thread(target=server.serve_forever, name="root-only-server")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_404_on_a_base_url_without_v1_suggests_the_v1_url(root_only_server):
    with OpenAICompatibleClient(root_only_server) as client, pytest.raises(LlmHttpError) as caught:
        collect(client)
    assert caught.value.status_code == 404
    assert f"did you mean {root_only_server}/v1?" in str(caught.value)


def test_a_404_on_a_v1_url_does_not_suggest_another_v1(root_only_server):
    with OpenAICompatibleClient(root_only_server + "/v1") as client, pytest.raises(LlmHttpError) as caught:
        collect(client)
    assert "did you mean" not in str(caught.value) and "check base_url and the model name" in str(caught.value)


def test_from_env_reads_the_openai_sdk_variables(monkeypatch):
    for name in ("STREAMENGINE_BASE_URL", "STREAMENGINE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with OpenAICompatibleClient.from_env() as client:
        assert client.base_url == "https://api.openai.com/v1"  # the SDK's default too
    with FakeProvider() as fp:
        fp.add_turn(s.text("a"))
        monkeypatch.setenv("OPENAI_BASE_URL", fp.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-sdk")
        with OpenAICompatibleClient.from_env() as client:
            assert collect(client) == "a"
        monkeypatch.setenv("STREAMENGINE_BASE_URL", "http://127.0.0.1:9/v1")
        with OpenAICompatibleClient.from_env() as client:
            assert client.base_url == "http://127.0.0.1:9/v1"  # ours wins over the SDK's
    assert fp.requests[0].headers["Authorization"] == "Bearer sk-sdk"
