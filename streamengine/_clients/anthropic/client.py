"""The Anthropic Messages API client (``POST {base_url}/v1/messages``), streamed or not.

The same guarantees as :class:`OpenAICompatibleClient`, from the same
transport (``transport.py``): the socket is shut down on cancel even before
the response headers, the body is read with ``read1`` through the SSE
framer, and every HTTP, urllib3 or parse error leaves as a streamengine
error, chained.  A stream is complete only at ``message_stop`` or a stop
reason.  HTTP errors are the same :class:`LlmHttpError` (``retry-after``
parsed alike), so failover treats both providers alike; an ``error`` event
inside a 200 stream is classified as its HTTP status would be
(``anthropic_format.error_from_payload``).

The wire format lives in ``anthropic_format.py`` (requests, answers,
errors) and ``anthropic_stream.py`` (stream events -> chunks).
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence

import requests

from ... import _validation as validation
from ..._errors import ConfigError, LlmError
from ..._messages import CompletionOptions, MessageLike, Response, ToolSpec
from ..http.extras import RequestExtras, sdk_settings
from ..http.transport import HttpProviderClient, content_headers
from .format import chat_body, error_from_payload, http_error, response_from_json
from .stream import AnthropicStreamParser

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"
#: Sent as ``max_tokens`` when the call's options give none (the API requires one).
DEFAULT_MAX_TOKENS = 4096


class AnthropicClient(RequestExtras, HttpProviderClient):
    """Claude through the Messages API, over one ``requests.Session``.

    ``base_url`` is the API root without ``/v1`` (``https://api.anthropic.com``,
    or a proxy's root); ``api_key`` defaults to ``ANTHROPIC_API_KEY`` and goes
    out as ``x-api-key``, never shown in errors or logs.  ``default_max_tokens``
    is sent when ``CompletionOptions.max_tokens`` is not set.  A ``session``
    you pass is used as is (a cancellable adapter is mounted for ``base_url``)
    and not closed by :meth:`close`.  The anthropic SDK's ``default_headers=``,
    ``timeout=`` and ``max_retries=`` and the options' ``extra_body``,
    ``extra_headers`` and ``extra_query`` are understood (:mod:`..http.extras`).
    """

    chat_path = "/v1/messages"
    example_base_url = DEFAULT_BASE_URL
    api_root_hint = "is base_url the Anthropic API root (https://api.anthropic.com)?"
    log_name = "streamengine._clients.anthropic.client.AnthropicClient"
    parser_class = AnthropicStreamParser

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: Optional[str] = None,
        *,
        anthropic_version: str = DEFAULT_VERSION,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: Optional[float] = None,
        default_headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> None:
        headers, connect, self.max_retries = sdk_settings(headers, default_headers, connect_timeout, timeout,
                                                          max_retries)
        validation.count(default_max_tokens, "default_max_tokens", minimum=1)
        if not isinstance(anthropic_version, str) or not re.fullmatch(r"[0-9A-Za-z.-]+", anthropic_version):
            raise ConfigError(f"anthropic_version must look like {DEFAULT_VERSION!r}, got {anthropic_version!r}")
        self.anthropic_version = anthropic_version
        self.default_max_tokens = default_max_tokens
        super().__init__(base_url, api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY"),
                         key_source="ANTHROPIC_API_KEY", session=session, headers=headers,
                         connect_timeout=connect)

    # -- the wire format ---------------------------------------------------------------

    def _api_root(self, base_url: str) -> str:
        # An OpenAI habit; the chat path adds /v1 itself.
        return base_url[:-3] if base_url.endswith("/v1") else base_url

    def _chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                   options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return chat_body(messages, tools, options, self.default_max_tokens, stream=stream)

    def _request_headers(self, stream: bool) -> Dict[str, str]:
        headers = content_headers(stream)
        headers["anthropic-version"] = self.anthropic_version
        headers.update(self._headers)
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _response_of(self, payload: Any) -> Response:
        return response_from_json(payload, self._redact)

    def _status_error(self, resp: requests.Response, url: str, text: str, stream: bool) -> LlmError:
        return http_error(resp.status_code, resp.reason or "", url, text, resp.headers)

    def _raise_in_band_error(self, payload: Any, url: str) -> None:
        if isinstance(payload, dict) and payload.get("type") == "error":
            raise error_from_payload(payload, f"{url} answered with an error", self._redact)
