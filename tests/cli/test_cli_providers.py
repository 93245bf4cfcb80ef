"""The README's provider recipes, run as written against a FakeProvider set up like each server.

Each recipe's console block is read from README.rst: ``export`` lines become
the environment, ``streamengine ...`` lines run through ``main()``, and every
URL in them is pointed at the FakeProvider (same path, same query).  The
test then checks what that server would check: the path, the key header, the
model name, ``stream_options``.
"""
from __future__ import annotations

import io
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List

import pytest
from readme_recipes import PROVIDERS, recipes, root_of, run_recipe

from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")









@pytest.fixture
def fp(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with FakeProvider() as provider:
        provider.add_turn(s.text("Hello there."))
        yield provider




def only_request(provider: FakeProvider):
    (request,) = provider.requests
    return request


def test_openai(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("OpenAI")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-..."
    assert request.json["model"] == "gpt-4o-mini" and request.json["stream_options"] == {"include_usage": True}


def test_azure_v1(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("Azure OpenAI")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.path == "/openai/v1/chat/completions"
    assert request.headers["api-key"] == "azure-key" and "Authorization" not in request.headers
    assert request.json["model"] == "my-deployment"


def test_azure_deployment_api(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("Azure OpenAI")[1], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.path == "/openai/deployments/my-deployment/chat/completions?api-version=2024-06-01"
    assert request.headers["api-key"] == "azure-key"
    assert "stream_options" not in request.json


def test_ollama(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("Ollama")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.path == "/v1/chat/completions" and request.json["model"] == "llama3.2"
    assert "Authorization" not in request.headers  # no key configured, none sent


class _OllamaRoot(BaseHTTPRequestHandler):
    """Ollama's answer to a path outside /v1: a plain-text 404."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"404 page not found"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_ollama_without_v1_is_told_the_url(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OllamaRoot)
    thread = threading.Thread(target=server.serve_forever, name="ollama-root")
    thread.start()
    try:
        root = f"http://127.0.0.1:{server.server_address[1]}"
        recipe = recipes("Ollama")[0].replace("/v1", "")
        rc, out, err = run_recipe(recipe, root, monkeypatch, capsys)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert rc == 1 and out == ""
    assert err.startswith("streamengine: error: provider answered HTTP 404")
    assert f"did you mean {root}/v1?" in err and len(err.splitlines()) == 1


def test_llama_cpp(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("llama.cpp")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer my-llama-key" and request.json["model"] == "local"


def test_vllm(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("vLLM")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    request = only_request(fp)
    assert request.headers["Authorization"] == "Bearer my-vllm-key"
    assert request.json["model"] == "Qwen/Qwen2.5-7B-Instruct"


def test_lm_studio(fp, monkeypatch, capsys):
    rc, out, err = run_recipe(recipes("LM Studio")[0], root_of(fp), monkeypatch, capsys)
    assert (rc, out) == (0, "Hello there.\n"), err
    assert only_request(fp).json["model"] == "qwen2.5-7b-instruct"


def test_a_server_refusing_stream_options_points_at_the_flag(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    def strict(payload: Dict) -> List:
        if "stream_options" in payload:
            return [s.http_error(400, {"error": {"message": "Unrecognized request argument supplied: stream_options"}})]
        return [s.text("fine")]

    with FakeProvider() as provider:
        provider.respond_with(strict)
        recipe = recipes("LM Studio")[0]
        rc, out, err = run_recipe(recipe, root_of(provider), monkeypatch, capsys)
        assert rc == 1 and "--no-stream-options" in err and len(err.splitlines()) == 1
        rc, out, err = run_recipe(recipe.rstrip() + " --no-stream-options", root_of(provider), monkeypatch, capsys)
        assert (rc, out) == (0, "fine\n"), err


def test_every_provider_in_the_list_has_a_recipe():
    titles = re.findall(r"^\*\*([^*]+)\*\* \u2014", PROVIDERS, re.M)
    # Each of these has a test above (Anthropic: tests/cli/test_cli_chat.py, the client is another module's).
    assert titles == ["OpenAI", "Azure OpenAI", "Ollama", "llama.cpp", "vLLM", "LM Studio", "Anthropic"]
