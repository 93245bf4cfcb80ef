"""``streamengine models``: the provider's model ids, as ``llm models`` lists them, over real HTTP."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from cli_support import clean_env, run  # noqa: F401  (fixture)

from streamengine import AnthropicClient, LlmProtocolError, OpenAICompatibleClient
from streamengine.testing import FakeProvider

KEY = "sk-models-test-0123456789abcdef"


class _Answers(BaseHTTPRequestHandler):
    """A server whose every GET gets the class's ``status`` and ``body``: no models route, or a broken one."""

    status = 404
    body: object = {"error": {"message": "Not Found"}}
    seen: ClassVar[list] = []

    def do_GET(self):
        type(self).seen.append(self.path)
        data = json.dumps(self.body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    servers = []

    def start(status, body):
        handler = type("Handler", (_Answers,), {"status": status, "body": body, "seen": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1", handler

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_models_lists_the_servers_ids_one_per_line_with_the_key_sent(capsys):
    with FakeProvider(models=["llama3:8b", "qwen3:32b"]) as fp:
        rc, out, err = run(capsys, "models", "--base-url", fp.base_url, "--key", KEY)
        assert (rc, out, err) == (0, "llama3:8b\nqwen3:32b\n", "")
        (request,) = fp.requests
        assert request.method == "GET" and request.path.endswith("/v1/models")
        assert request.headers["Authorization"] == f"Bearer {KEY}"


def test_models_json_is_one_object_per_model(capsys):
    with FakeProvider(models=["a", "b"]) as fp:
        rc, out, _ = run(capsys, "models", "--json", "--base-url", fp.base_url)
    assert rc == 0 and [json.loads(line) for line in out.splitlines()] == [{"id": "a"}, {"id": "b"}]


def test_anthropic_models_are_read_page_by_page(capsys):
    names = [f"claude-{n}" for n in range(5)]
    with FakeProvider(wire="anthropic", models=names, models_per_page=2) as fp:
        rc, out, _ = run(capsys, "models", "--provider", "anthropic", "--base-url", fp.base_url, "--key", KEY)
        assert (rc, out.split()) == (0, names)
        paths = [r.path for r in fp.requests]
        headers = fp.requests[0].headers
    assert len(paths) == 3 and all(p.startswith("/v1/models?limit=") for p in paths)
    assert "after_id=claude-1" in paths[1] and "after_id=claude-3" in paths[2]
    assert headers["x-api-key"] == KEY and headers["anthropic-version"]


def test_a_server_with_no_models_says_so_and_what_to_do(capsys):
    with FakeProvider(models=[]) as fp:
        rc, out, err = run(capsys, "models", "--base-url", fp.base_url)
    assert (rc, out) == (1, "")
    assert "lists no models" in err and "-m" in err


def test_a_server_without_a_models_route_says_to_name_the_model(capsys, answering):
    base_url, _ = answering(404, {"error": {"message": f"no such route; your key was {KEY}"}})
    rc, out, err = run(capsys, "models", "--base-url", base_url, "--key", KEY, "-v")
    assert (rc, out) == (1, "")
    assert "does not list its models" in err and "name the model it serves with -m" in err
    assert KEY not in err  # the cause chain (-v) shows the body, masked


def test_a_silent_server_is_given_up_after_the_timeout(capsys):
    with socket.socket() as listener:  # accepts (the kernel does) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        rc, out, err = run(capsys, "models", "--base-url", f"http://127.0.0.1:{port}/v1", "--timeout", "0.3")
    assert (rc, out) == (1, "") and "0.3s" in err


def test_a_page_that_is_not_a_model_list_is_a_protocol_error(answering):
    base_url, _ = answering(200, {"models": ["a"]})
    with OpenAICompatibleClient(base_url) as client, pytest.raises(LlmProtocolError, match="list of models"):
        client.list_models()


def test_a_server_that_always_has_more_is_read_a_bounded_number_of_pages(answering):
    base_url, handler = answering(200, {"data": [{"id": "same"}], "has_more": True})
    with AnthropicClient(base_url=base_url, api_key=KEY) as client:
        ids = client.list_models()
    assert ids == ["same"] * len(handler.seen) and 1 < len(handler.seen) <= 20
