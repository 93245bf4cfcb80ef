"""One client over several providers, chosen per call by a prefix of the model name.

Failover tries model names in order and knows nothing of providers; so a
list that mixes providers needs a client that picks the provider from the
name::

    client = RoutedClient({"anthropic": AnthropicClient(), "openai": OpenAICompatibleClient(url)},
                          default="openai")
    EngineConfig(models=["anthropic:claude-sonnet-4-5", "openai:gpt-4o-mini", "llama3"])

Two wires of one vendor are two routes: ``{"responses": OpenAIResponsesClient(url),
"openai": OpenAICompatibleClient(url)}`` with ``models=["responses:gpt-5-mini",
"openai:gpt-4o-mini"]`` fails over from the Responses API to Chat Completions.

``"anthropic:claude-sonnet-4-5"`` goes to the ``anthropic`` client as model
``claude-sonnet-4-5``; a name without a known prefix goes, unchanged, to
the default client (so ``"llama3:8b"``, an Ollama tag, is not mistaken for
a route).  Each call is a plain call of the chosen client: its timeouts,
cancel and error types are that client's, so failover classifies them the
same whatever the provider.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from .._errors import ConfigError
from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec
from .base import LlmClient, StreamingLlmClient


class RoutedClient(StreamingLlmClient):
    """Routes ``"<route>:<model>"`` to the client registered under ``<route>``.

    Every client must be able to stream (the call strategy picks streaming
    for this client once, for all routes).  :meth:`close` closes them all.
    """

    def __init__(self, clients: Mapping[str, LlmClient], default: Optional[str] = None) -> None:
        if not isinstance(clients, Mapping) or not clients:
            raise ConfigError("RoutedClient needs a mapping of route names to clients, e.g. "
                              "{'anthropic': AnthropicClient(), 'openai': OpenAICompatibleClient(url)}")
        for name, client in clients.items():
            if not isinstance(name, str) or not name or ":" in name or name != name.strip():
                raise ConfigError(f"route names are non-empty words without ':' or spaces, got {name!r}")
            if not isinstance(client, StreamingLlmClient):
                raise ConfigError(f"the client for route {name!r} must be a StreamingLlmClient (e.g. "
                                  f"OpenAICompatibleClient, OpenAIResponsesClient or AnthropicClient), "
                                  f"got {type(client).__name__}")
        if default is not None and default not in clients:
            raise ConfigError(f"default route {default!r} is not one of the routes {sorted(clients)}")
        self.clients: Dict[str, StreamingLlmClient] = dict(clients)  # type: ignore[arg-type]
        self.default = default

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.clients!r}, default={self.default!r})"

    def route(self, model: Optional[str]) -> Tuple[StreamingLlmClient, Optional[str]]:
        """The client for ``model`` and the model name it is to be given."""
        prefix, sep, rest = (model or "").partition(":")
        if sep and prefix in self.clients:
            if not rest.strip():
                raise ConfigError(f"model {model!r} names route {prefix!r} but no model; "
                                  f"write e.g. '{prefix}:<model name>'")
            return self.clients[prefix], rest
        if self.default is None:
            raise ConfigError(
                f"model {model!r} has no route prefix ({', '.join(p + ':' for p in sorted(self.clients))}) "
                f"and RoutedClient has no default; prefix the model name or pass default=...")
        return self.clients[self.default], model

    def _routed(self, options: Optional[CompletionOptions]) -> Tuple[StreamingLlmClient, CompletionOptions]:
        options = options or CompletionOptions()
        client, model = self.route(options.model)
        return client, options if model == options.model or model is None else options.with_model(model)

    def stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
               options: Optional[CompletionOptions] = None,
               cancel: Optional[threading.Event] = None) -> Iterator[Chunk]:
        client, routed = self._routed(options)
        return client.stream(messages, tools, routed, cancel)

    def open_stream(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None,
                    cancel: Optional[threading.Event] = None) -> Iterator[Any]:
        client, routed = self._routed(options)
        return client.open_stream(messages, tools, routed, cancel)

    def complete(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None,
                 cancel: Optional[threading.Event] = None) -> Response:
        client, routed = self._routed(options)
        return client.complete(messages, tools, routed, cancel)

    def check_parts(self, messages: Sequence[MessageLike], model: Optional[str] = None) -> None:
        """The parts checked by the client ``model`` is routed to, against its own wire."""
        client, routed = self.route(model)
        client.check_parts(messages, routed)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
