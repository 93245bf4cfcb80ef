"""Credentials in a provider's URL and key never show; text that merely resembles a short key is left alone.

Over real HTTP on 127.0.0.1: a base_url with ``user:PASSWORD@`` and a
``?key=`` query value, against a refused port (LlmConnectionError) and a
FakeProvider answering an error status with a body that echoes them
(LlmHttpError).  The message, ``str``, ``repr``, ``args``, the error body and
every log line must be free of both; the request still authenticates.
"""
from __future__ import annotations

import base64
import socket
import traceback
from typing import Any, Iterator, List

import pytest

from streamengine import (
    AnthropicClient,
    CompletionOptions,
    LlmConnectionError,
    LlmHttpError,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    enable_logging,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

MESSAGES = [{"role": "user", "content": "hi"}]
PASSWORD = "PassWord-4711"
QUERY_SECRET = "QueryKey-0815"
REAL_KEY = "sk-live-0123456789abcdef"
CLIENTS = {"openai": OpenAICompatibleClient, "anthropic": AnthropicClient, "responses": OpenAIResponsesClient}


@pytest.fixture
def log_lines() -> Iterator[List[str]]:
    """Every line streamengine logs during the test, at TRACE level."""
    from loguru import logger

    lines: List[str] = []
    handler = enable_logging(level="TRACE", sink=lines.append)
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def with_credentials(base_url: str) -> str:
    """``base_url`` with ``user:PASSWORD@`` before the host and ``?key=QUERY_SECRET`` after the path."""
    scheme, rest = base_url.split("://", 1)
    return f"{scheme}://user:{PASSWORD}@{rest}?key={QUERY_SECRET}"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def everything_shown(error: BaseException, client: Any, lines: List[str]) -> str:
    """All the text a user, a log or a browser could see of the error and the client (its printed
    traceback too, with the exceptions it was raised from)."""
    printed = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return "\n".join([str(error), repr(error), repr(error.args), getattr(error, "body", ""), repr(client),
                      printed, *lines])


def fail(client: Any) -> BaseException:
    with pytest.raises((LlmConnectionError, LlmHttpError)) as caught:
        list(client.stream(MESSAGES, options=CompletionOptions(model="m")))
    return caught.value


@pytest.mark.parametrize("wire", sorted(CLIENTS))
def test_a_refused_connection_never_shows_the_password_or_a_query_value(wire, log_lines):
    base_url = with_credentials(f"http://127.0.0.1:{closed_port()}" + ("" if wire == "anthropic" else "/v1"))
    with CLIENTS[wire](base_url, connect_timeout=2.0) as client:
        error = fail(client)
    assert isinstance(error, LlmConnectionError)
    shown = everything_shown(error, client, log_lines)
    assert PASSWORD not in shown and QUERY_SECRET not in shown
    assert "127.0.0.1" in str(error)  # it still says where it tried
    assert log_lines, "the client logged nothing at TRACE level"


@pytest.mark.parametrize("wire", sorted(CLIENTS))
@pytest.mark.parametrize("status", [401, 500])
def test_an_error_answer_echoing_the_credentials_never_shows_them(wire, status, log_lines):
    echo = (f"bad credentials user:{PASSWORD} for http://user:{PASSWORD}@127.0.0.1/v1/chat?key={QUERY_SECRET} "
            f"(password {PASSWORD})")
    with FakeProvider(wire=wire) as fp, CLIENTS[wire](with_credentials(fp.base_url)) as client:
        fp.add_turn(s.http_error(status, {"error": {"type": "authentication_error", "message": echo}}))
        error = fail(client)
        request = fp.requests[0]
    assert isinstance(error, LlmHttpError) and error.status_code == status
    shown = everything_shown(error, client, log_lines)
    assert PASSWORD not in shown and QUERY_SECRET not in shown
    assert "bad credentials" in str(error)  # the provider's words are kept, only the secrets masked
    # The userinfo still authenticates (Basic auth), and the query still goes with the request.
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert f"key={QUERY_SECRET}" in request.path
    assert "user:" not in client.base_url and PASSWORD not in repr(client)


@pytest.mark.parametrize("key, body_text", [
    ("ollama", "model 'llama3.2' not found, try pulling it first: ollama pull llama3.2"),
    ("x", "model x-large does not exist"),
])
def test_a_placeholder_key_does_not_mangle_the_providers_words(key, body_text):
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key=key) as client:
        fp.add_turn(s.http_error(404, {"error": {"message": body_text}}))
        error = fail(client)
    assert body_text in str(error) and body_text in error.body


def test_a_key_long_enough_to_be_a_secret_is_still_masked(log_lines):
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, api_key=REAL_KEY) as client:
        fp.add_turn(s.http_error(401, {"error": {"message": f"Incorrect API key provided: {REAL_KEY}"}}))
        error = fail(client)
        assert fp.requests[0].headers["Authorization"] == f"Bearer {REAL_KEY}"
    assert REAL_KEY not in everything_shown(error, client, log_lines)
    assert "Incorrect API key provided: ***" in str(error)


def test_a_credential_in_a_calls_extra_query_is_masked_like_the_clients_own(log_lines):
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.http_error(401, {"error": {"message": f"token {QUERY_SECRET} expired"}}))
        with pytest.raises(LlmHttpError) as caught:
            list(client.stream(MESSAGES, options=CompletionOptions(extra={"extra_query": {"api_token": QUERY_SECRET}})))
        assert f"api_token={QUERY_SECRET}" in fp.requests[0].path
    assert QUERY_SECRET not in everything_shown(caught.value, client, log_lines)
