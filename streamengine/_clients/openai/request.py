"""What the OpenAI-compatible client sends: the JSON body, the headers, the query.

Everything here is checked when the client is built or the call is made, so a
bad option is a ConfigError naming it; the key and extra headers are checked
in ``credentials.py``, for every provider alike.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence

from ..._errors import ConfigError
from ..._messages import CompletionOptions, MessageLike, ToolSpec, as_messages
from ..http.transport import content_headers

#: The one default provider URL (the CLI and ``from_env`` use it too).
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def env_base_url(environ: Optional[Mapping[str, str]] = None) -> str:
    """``STREAMENGINE_BASE_URL``, else the openai SDK's ``OPENAI_BASE_URL``, else OpenAI's API."""
    env = os.environ if environ is None else environ
    return env.get("STREAMENGINE_BASE_URL") or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL


def env_api_key(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``STREAMENGINE_API_KEY``, else the openai SDK's ``OPENAI_API_KEY``."""
    env = os.environ if environ is None else environ
    return env.get("STREAMENGINE_API_KEY") or env.get("OPENAI_API_KEY") or None


def chat_body(messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
              options: Optional[CompletionOptions], *, stream: bool, stream_options: bool) -> Dict[str, Any]:
    """The chat-completions request; ``stream_options`` asks for the usage frame at the end.

    Servers that predate ``stream_options`` answer 400 to it (older Azure API
    versions, some proxies): ``stream_options=False`` leaves it out, and the
    run then simply reports no token usage.
    """
    body: Dict[str, Any] = {"messages": [m.to_openai() for m in as_messages(messages)]}
    if tools:
        body["tools"] = [t.to_openai() for t in tools]
    if stream:
        body["stream"] = True
        if stream_options:
            body["stream_options"] = {"include_usage": True}
    body.update((options or CompletionOptions()).to_body())
    return body


def request_headers(stream: bool, extra: Mapping[str, str], api_key: Optional[str],
                    api_key_header: str) -> Dict[str, str]:
    """Content negotiation, the caller's headers, then the key (``Bearer`` for ``Authorization``)."""
    headers = content_headers(stream)
    headers.update(extra)
    if api_key:
        if api_key_header.lower() == "authorization":
            headers["Authorization"] = f"Bearer {api_key}"
        else:  # Azure's ``api-key``, a gateway's ``x-api-key``: the bare key
            headers[api_key_header] = api_key
    return headers


def check_query(query: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Query parameters sent with every request (Azure's ``api-version``), as strings."""
    checked: Dict[str, str] = {}
    for name, value in (query or {}).items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ConfigError(f"query parameters must be text names and values, got {name!r}={value!r} "
                              f"(e.g. query={{'api-version': '2024-10-21'}})")
        checked[name] = value
    return checked
