"""One way to build a provider client: the shared HTTP client holding the provider's wire.

Each public client is an ``HttpProviderClient`` (the transport: session,
credentials, cancel, bounded reads, per-call extras) given a ``Wire`` (what its
API's requests, answers and errors look like); a client adds only its
constructor and what its API offers besides chat (``embed``, ``from_env``),
never a transport hook, and no client derives from another.
"""
from __future__ import annotations

import pytest

from streamengine import AnthropicClient, OpenAICompatibleClient, OpenAIResponsesClient
from streamengine._clients.http.transport import HttpProviderClient, Wire

CLIENTS = [OpenAICompatibleClient, OpenAIResponsesClient, AnthropicClient]


@pytest.mark.parametrize("client_class", CLIENTS, ids=lambda c: c.__name__)
def test_a_client_is_the_shared_http_client_with_a_wire_and_overrides_none_of_it(client_class: type) -> None:
    assert client_class.__bases__ == (HttpProviderClient,)
    shared = {name for name, value in vars(HttpProviderClient).items() if callable(value)}
    assert shared & {name for name, value in vars(client_class).items() if callable(value)} == {"__init__"}
    with client_class("http://127.0.0.1:9/v1", api_key="sk-test") as client:
        assert isinstance(client.wire, Wire) and type(client.wire).__bases__ == (Wire,)


def test_each_client_keeps_its_settings_readable() -> None:
    with OpenAICompatibleClient("http://127.0.0.1:9/v1", stream_options=False) as chat, \
            OpenAIResponsesClient("http://127.0.0.1:9/v1") as responses, \
            AnthropicClient("http://127.0.0.1:9", api_key="k", anthropic_version="2024-01-01",
                            default_max_tokens=99, max_retries=1) as anthropic:
        assert chat.stream_options is False and responses.stream_options is False
        assert (anthropic.anthropic_version, anthropic.default_max_tokens, anthropic.max_retries) == (
            "2024-01-01", 99, 1)
