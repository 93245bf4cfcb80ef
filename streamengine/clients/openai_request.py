"""What the OpenAI-compatible client sends: the JSON body, the headers, the credentials.

Everything here is checked when the client is built or the call is made, so a
bad key, header or option is a ConfigError naming it -- never a failure deep
in ``requests`` whose message would quote the key.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..messages import CompletionOptions, MessageLike, ToolSpec, as_messages

__all__ = ["DEFAULT_BASE_URL", "SENSITIVE_HEADER", "chat_body", "env_api_key", "env_base_url", "check_api_key", "check_headers", "check_query",
           "encode_body", "request_headers", "secret_forms"]

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
    headers = {"Content-Type": "application/json",
               "Accept": "text/event-stream" if stream else "application/json"}
    if stream:
        # A compressed event stream is buffered by some proxies; ask for none.
        headers["Accept-Encoding"] = "identity"
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


def encode_body(body: Dict[str, Any]) -> bytes:
    """The request JSON, built before anything is sent so a bad option fails at the call.

    ASCII-escaped on purpose: a lone surrogate (a model can send one,
    JSON-escaped, and it comes back in the next round's messages) has no
    UTF-8 form, but ``\\udXXX`` is valid JSON text.
    """
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"the request cannot be sent as JSON ({exc}); check CompletionOptions.extra, "
            f"tool parameters and message contents for non-JSON values such as sets or NaN"
        ) from exc


# Header names whose values are credentials (``Authorization``, Azure's
# ``api-key``, ``x-api-key``, ``X-Auth-Token``...): never shown in errors.
SENSITIVE_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.I)
_BAD_HEADER_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def check_api_key(api_key: Optional[str]) -> Optional[str]:
    """The key, stripped; refused (without showing it) if it cannot be a header value.

    A key read from a file often ends with a newline.  Sent as is, requests
    refuses the header with an error that quotes it -- which would put the
    key into exception messages, logs and a browser's error event.
    """
    if api_key is None or api_key == "":
        return None
    if not isinstance(api_key, str):
        raise ConfigError(f"api_key must be a string, got {type(api_key).__name__}")
    key = api_key.strip()
    if not key:
        return None
    if _BAD_HEADER_CHARS.search(key) or not _is_latin1(key) or " " in key:
        raise ConfigError(
            "api_key holds characters that cannot be sent in an HTTP header (control characters, "
            "spaces or non-latin-1 text); check how the key is read (STREAMENGINE_API_KEY or "
            "OPENAI_API_KEY) -- the key is not shown here on purpose")
    return key


def check_headers(headers: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """Extra headers, checked now so a bad one is a clear ConfigError, not a failure per call."""
    checked: Dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise ConfigError(f"header name {name!r} is not a valid HTTP header name")
        if not isinstance(value, str) or _BAD_HEADER_CHARS.search(value) or not _is_latin1(value):
            shown = "(value not shown)" if SENSITIVE_HEADER.search(name) else repr(value)
            raise ConfigError(
                f"header {name!r} has a value that cannot be sent in HTTP {shown}: values must be "
                f"latin-1 text without control characters (CR, LF, NUL...)")
        checked[name] = value
    return checked


def _is_latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def secret_forms(secrets: Sequence[Optional[str]]) -> Tuple[str, ...]:
    """Each secret as it may appear in a message: raw, and escaped inside a repr()."""
    forms = []
    for secret in secrets:
        if secret:
            forms.append(secret)
            escaped = repr(secret)[1:-1]
            if escaped != secret:
                forms.append(escaped)
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted(set(forms), key=len, reverse=True))
