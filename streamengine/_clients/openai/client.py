"""The OpenAI-compatible chat-completions client (OpenAI, Azure, vLLM, llama.cpp, Ollama, LM Studio...).

The transport (cancellable connection, bounded reads, SSE framing, error
translation, redaction) is ``transport.py``'s, shared with every provider.
What is sent lives in ``openai_request``, how answers are parsed in
``openai_parse``, how failures are worded in ``openai_errors``.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

import requests

from ..._errors import ConfigError, LlmError
from ..._messages import CompletionOptions, MessageLike, Response, ToolSpec
from ..http.credentials import check_headers
from ..http.extras import RequestExtras, sdk_settings
from ..http.transport import HttpProviderClient, encode_body
from .errors import connection_error_message, http_error, raise_in_band_error
from .parse import StreamParser, response_from_json, vectors_from_json
from .request import chat_body, check_query, env_api_key, env_base_url, request_headers


class OpenAICompatibleClient(RequestExtras, HttpProviderClient):
    """Chat completions (streamed or not) and embeddings over one ``requests.Session``.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1``; requests go
    to ``{base_url}/chat/completions`` and ``{base_url}/embeddings``.  A
    ``session`` you pass is used as is, except that a cancellable adapter is
    mounted for ``base_url`` (needed to abort a request before its headers);
    it is not closed by :meth:`close`.

    The API key is sent as ``Authorization: Bearer KEY``, or bare in the header
    named by ``api_key_header`` (Azure's ``api-key``).  It is never logged or
    shown in errors: surrounding whitespace (a key read from a file ends with
    a newline) is stripped, a key that cannot be a header value is refused
    without being shown, and the key -- and the values of credential-like
    ``headers`` -- are replaced by ``***`` in every message built from what
    the provider sent back.

    ``query`` (or a query string in ``base_url``) is sent with every request:
    Azure's ``api-version``.  ``stream_options=False`` stops asking for the
    usage frame (``stream_options``), for servers that refuse the field.

    As with the openai SDK: without ``base_url`` it is ``STREAMENGINE_BASE_URL``,
    else ``OPENAI_BASE_URL``, else OpenAI's (and the key
    ``STREAMENGINE_API_KEY``/``OPENAI_API_KEY``); ``default_headers=``,
    ``timeout=`` and ``max_retries=`` are taken, and ``extra_body``,
    ``extra_headers`` and ``extra_query`` in the options go where the SDK puts
    them (see :mod:`..http.extras`).
    """

    chat_path = "/chat/completions"
    example_base_url = "http://127.0.0.1:8000/v1"
    api_root_hint = "is base_url an OpenAI-compatible API root (ending in /v1)?"
    log_name = "streamengine._clients.openai.client.OpenAICompatibleClient"
    parser_class = StreamParser

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        session: Optional[requests.Session] = None,
        headers: Optional[Mapping[str, str]] = None,
        connect_timeout: Optional[float] = None,
        query: Optional[Mapping[str, str]] = None,
        api_key_header: str = "Authorization",
        stream_options: bool = True,
        default_headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
    ) -> None:
        headers, connect, self.max_retries = sdk_settings(headers, default_headers, connect_timeout, timeout,
                                                          max_retries)
        if base_url is None:
            base_url, api_key = env_base_url(), api_key if api_key is not None else env_api_key()
        super().__init__(base_url, api_key, key_source="STREAMENGINE_API_KEY or OPENAI_API_KEY", session=session,
                         headers=headers, connect_timeout=connect)
        self._query.update(check_query(query))
        check_headers({api_key_header: "x"} if isinstance(api_key_header, str) else {None: "x"})  # type: ignore[dict-item]
        self._api_key_header = api_key_header
        self.stream_options = bool(stream_options)

    @classmethod
    def from_env(cls, **kwargs: Any) -> OpenAICompatibleClient:
        """Build from the environment, the openai SDK's variables included.

        Base URL: ``STREAMENGINE_BASE_URL``, else ``OPENAI_BASE_URL``, else
        OpenAI's.  Key: ``STREAMENGINE_API_KEY``, else ``OPENAI_API_KEY``.
        """
        base_url, api_key = env_base_url(), env_api_key()
        return cls(base_url, api_key, **kwargs)

    def embed(
        self, texts: Sequence[str], model: str, *, cancel: Optional[threading.Event] = None,
    ) -> List[List[float]]:
        """Embed ``texts`` in one request; vectors come back in input order."""
        if isinstance(texts, (str, bytes)):
            raise ConfigError(
                "embed() takes a list of texts, e.g. embed(['some text'], model), not one string")
        texts = list(texts)
        if not texts:
            return []
        payload = self._post_json("/embeddings", encode_body({"model": model, "input": texts}), cancel)
        return vectors_from_json(payload, len(texts))

    # -- the wire format ---------------------------------------------------------------

    def _chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                   options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return chat_body(messages, tools, options, stream=stream, stream_options=stream and self.stream_options)

    def _request_headers(self, stream: bool) -> Dict[str, str]:
        return request_headers(stream, self._headers, self._api_key, self._api_key_header)

    def _response_of(self, payload: Any) -> Response:
        return response_from_json(payload, self._redact)

    def _status_error(self, resp: requests.Response, url: str, text: str, stream: bool) -> LlmError:
        return http_error(resp.status_code, resp.reason or "", url, text, resp.headers, base_url=self.base_url,
                          sent_stream_options=stream and self.stream_options)

    def _no_answer(self, exc: BaseException, url: str) -> str:
        return connection_error_message(exc, url, self.base_url, self.connect_timeout)

    def _raise_in_band_error(self, payload: Any, url: str) -> None:
        raise_in_band_error(payload, url, self._redact)
