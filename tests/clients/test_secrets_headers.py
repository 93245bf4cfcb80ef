"""A credential header's token never shows, whatever shape the header has and however the token is quoted back.

Over real HTTP on 127.0.0.1: a FakeProvider answers 401 with a body that
quotes the bare token (no ``Bearer``), as providers do.  The error, its
body, its printed traceback and every log line must be free of it; the
auth scheme stays readable.
"""
from __future__ import annotations

import traceback
from typing import Iterator, List

import pytest

from streamengine import CompletionOptions, LlmHttpError, OpenAICompatibleClient, enable_logging
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

TOKEN = "sk-hdr-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def log_lines() -> Iterator[List[str]]:
    from loguru import logger

    lines: List[str] = []
    handler = enable_logging(level="TRACE", sink=lines.append)
    yield lines
    logger.remove(handler)
    logger.disable("streamengine")


def shown(error: BaseException, lines: List[str]) -> str:
    printed = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return "\n".join([str(error), repr(error), getattr(error, "body", ""), printed, *lines])


@pytest.mark.parametrize("header, value", [
    ("Authorization", f"Bearer {TOKEN}"),
    ("X-Api-Token", f"Token {TOKEN}"),
    ("Authorization", f"Negotiate {TOKEN}"),
])
def test_a_bearer_token_in_a_clients_header_is_masked_when_the_provider_quotes_it_bare(header, value, log_lines):
    echo = f"invalid token {TOKEN}; it was sent as '{value}' (token={TOKEN}x)"
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url, headers={header: value}) as client:
        fp.add_turn(s.http_error(401, {"error": {"message": echo}}))
        with pytest.raises(LlmHttpError) as caught:
            client.complete(MESSAGES)
        assert fp.requests[0].headers[header] == value  # the header was really sent
    text = shown(caught.value, log_lines)
    assert TOKEN not in text
    scheme = value.split()[0]
    assert f"invalid token ***; it was sent as '{scheme} ***'" in str(caught.value)  # the scheme stays readable


def test_a_bearer_token_in_a_calls_extra_headers_is_masked_when_quoted_bare(log_lines):
    with FakeProvider() as fp, OpenAICompatibleClient(fp.base_url) as client:
        fp.add_turn(s.http_error(401, {"error": {"message": f"token {TOKEN} revoked"}}))
        options = CompletionOptions(extra={"extra_headers": {"Authorization": f"Bearer {TOKEN}"}})
        with pytest.raises(LlmHttpError) as caught:
            client.complete(MESSAGES, options=options)
    assert TOKEN not in shown(caught.value, log_lines)
    assert "token *** revoked" in str(caught.value)


def test_only_a_leading_scheme_is_kept_of_a_credential_value():
    from streamengine._clients.http.options import credential_parts

    assert credential_parts(f"Bearer {TOKEN}") == [TOKEN]
    assert credential_parts(TOKEN) == [TOKEN]
    assert credential_parts("Negotiatexyz") == ["Negotiatexyz"]  # one word: the value itself is the secret
    assert credential_parts(f'Digest username="u", response="{TOKEN}"') == ['username="u"', f'response="{TOKEN}"']
