"""The OpenAI Responses API client (``POST {base_url}/responses``), streamed or not.

Everything but the wire format is :class:`OpenAICompatibleClient`'s, inherited
rather than copied: the constructor's options (``headers``, ``query``,
``api_key_header``, ``connect_timeout``, a ``session``), ``from_env``,
credentials and redaction, the transport (cancel shuts the socket down even
before the headers, bounded reads, SSE framing), HTTP error wording and
``retry-after``, connection-error messages and embeddings.  What differs is
here and beside it: the request (``request.py``), the answer and its errors
(``answer.py``), the stream events (``stream.py``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ..._messages import CompletionOptions, MessageLike, Response, ToolSpec
from ..openai.client import OpenAICompatibleClient
from .answer import response_from_json
from .request import responses_body
from .stream import ResponsesStreamParser


class OpenAIResponsesClient(OpenAICompatibleClient):
    """OpenAI's Responses API (and the servers that speak it: vLLM, Ollama, llama.cpp, LM Studio, OpenRouter, Azure).

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8000/v1`` (without
    one: ``STREAMENGINE_BASE_URL``, ``OPENAI_BASE_URL`` or OpenAI's); requests
    go to ``{base_url}/responses``.  The options are
    :class:`OpenAICompatibleClient`'s (``extra_body``/``extra_headers``/
    ``extra_query``, ``timeout=``, ``max_retries=`` included); ``stream_options`` is accepted for the
    same signature and ignored: this API always reports usage with
    ``response.completed`` and refuses ``stream_options.include_usage``.

    Conversations are sent whole (stateless, like Chat Completions): the
    engine's messages become ``instructions`` and ``input`` items, tool calls
    ``function_call`` items and tool results ``function_call_output`` items.
    Pass ``CompletionOptions(extra={"store": False})`` to keep OpenAI from
    storing the responses.
    """

    chat_path = "/responses"
    api_root_hint = "is base_url an API root that serves the Responses API (ending in /v1)?"
    log_name = "streamengine._clients.responses.client.OpenAIResponsesClient"
    parser_class = ResponsesStreamParser

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(base_url, api_key, **kwargs)
        self.stream_options = False  # nothing to turn off here: no hint about it in error messages

    def _chat_body(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                   options: Optional[CompletionOptions], stream: bool) -> Dict[str, Any]:
        return responses_body(messages, tools, options, stream=stream)

    def _response_of(self, payload: Any) -> Response:
        return response_from_json(payload, self.base_url + self.chat_path, self._redact)
