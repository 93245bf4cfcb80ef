"""What a caller may add to a request: headers, keys and base URL (checked, never shown), the openai SDK's extras.

Everything here is checked when the client is built, so a bad key, header or
option is a ConfigError naming it -- never a failure at the first call.

What a provider client may put in its request headers and base URL, and which of it must never be shown.

Everything here is checked when the client is built, so a bad key or header
is a ConfigError naming it -- never a failure deep in ``requests`` whose
message would quote the key.  What must never be shown is handed to the
client's ``_logs.Redactor``.

The openai SDK's habits: ``extra_body``/``extra_headers``/``extra_query``, ``timeout=``, ``max_retries=``.

People coming from the openai SDK (or litellm) put these in the options:
sent as they are they would become literal top-level keys of the request
body, and a server silently ignores them (llama.cpp drops a ``grammar`` it
never sees at the top level).  Here they are read for what they mean:
``extra_body`` is merged into the body, ``extra_headers`` and ``extra_query``
go with this one request.  The header values are checked, and credential-like
header and query values redacted, like the client's own.

The constructors take the SDK's ``default_headers=`` (the same as
``headers=``), ``timeout=`` (seconds to connect: the SDK's per-read timeout
is the engine's ``idle_timeout`` here, its total the engine's
``completion_timeout``) and ``max_retries=`` (retries of a rate-limited
call, used by the engine instead of ``EngineConfig.max_retries``).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ..._errors import ConfigError
from ..._messages import CompletionOptions
from ..._validation import count, seconds

# Header and query parameter names whose values are credentials (``Authorization``,
# Azure's ``api-key``, ``x-api-key``, ``X-Auth-Token``, ``?key=``...): never shown in errors.
SENSITIVE_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.I)
_BAD_HEADER_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# An HTTP auth-scheme as credentials start with it (``Bearer``, ``Basic``, ``Token``, ``Negotiate``).
_AUTH_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


def check_api_key(api_key: Optional[str], source: str = "STREAMENGINE_API_KEY or OPENAI_API_KEY") -> Optional[str]:
    """The key, stripped; refused (without showing it) if it cannot be a header value.

    A key read from a file often ends with a newline.  Sent as is, requests
    refuses the header with an error that quotes it -- which would put the
    key into exception messages, logs and a browser's error event.
    ``source`` names where the key usually comes from, for the message.
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
            f"spaces or non-latin-1 text); check how the key is read ({source}) "
            "-- the key is not shown here on purpose")
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


def parse_base_url(base_url: str) -> Tuple[str, Optional[Tuple[str, str]], Dict[str, str]]:
    """``base_url`` without its ``user:password@`` and query; that pair (percent-decoded, as requests
    reads it) or None; the query, sent with every request.

    The pair is sent as Basic auth, so the URL that is shown, logged or put
    on a span never holds it.
    """
    root, _, query = base_url.partition("?")
    parts = urlsplit(root)
    userinfo, at, host = parts.netloc.rpartition("@")
    auth = None
    if at:
        user, _, password = userinfo.partition(":")
        root, auth = urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))
    return root, auth, dict(parse_qsl(query, keep_blank_values=True))


def credentials_in(auth: Optional[Tuple[str, str]], *named: Mapping[str, str]) -> List[str]:
    """What a client must never show: the password of ``auth`` (the user name when it stands alone,
    as a token does), and the values of credential-like names in ``named`` (headers, query parameters)."""
    secrets: List[str] = []
    if auth is not None:
        user, password = auth
        secrets.append(password or user)
    for values in named:
        secrets += [part for name, value in values.items() if SENSITIVE_HEADER.search(name)
                    for part in credential_parts(value)]
    return secrets


def credential_parts(value: str) -> List[str]:
    """What to mask of a credential's value: each word but a leading auth scheme.

    Masked word by word, a token is hidden wherever it shows (a provider may
    quote it bare, without its ``Bearer``), and ``Bearer ***`` still tells
    how the request authenticated.
    """
    words = value.replace(",", " ").split()
    if len(words) > 1 and _AUTH_SCHEME.fullmatch(words[0]):
        words = words[1:]
    return words


EXTRA_KEYS = ("extra_body", "extra_headers", "extra_query")


def _mapping(value: Any, key: str) -> Dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"options {key!r} must be a dict (as in the openai SDK), got {type(value).__name__}")
    return dict(value)


def split_extras(options: Optional[CompletionOptions]) -> Tuple[Optional[CompletionOptions], Dict[str, str],
                                                                 Dict[str, str]]:
    """``(options with extra_body merged in, extra headers, extra query)``; options without them as they are."""
    extra = dict(options.extra or {}) if options is not None else {}
    if not any(key in extra for key in EXTRA_KEYS):
        return options, {}, {}
    body = _mapping(extra.pop("extra_body", None), "extra_body")
    headers = check_headers({str(k): v for k, v in _mapping(extra.pop("extra_headers", None),
                                                              "extra_headers").items()})
    query = {str(k): str(v) for k, v in _mapping(extra.pop("extra_query", None), "extra_query").items()}
    extra.update(body)
    assert options is not None
    return replace(options, extra=extra or None), headers, query


def sdk_settings(headers: Optional[Mapping[str, str]], default_headers: Optional[Mapping[str, str]],
                 connect_timeout: Optional[float], timeout: Optional[float],
                 max_retries: Optional[int]) -> Tuple[Optional[Dict[str, str]], float, Optional[int]]:
    """``(headers, connect timeout, max retries)`` from the client's own and the SDK's keyword names."""
    merged = {**(default_headers or {}), **(headers or {})} if (headers or default_headers) else None
    if timeout is not None and connect_timeout is not None:
        raise ConfigError("pass connect_timeout or timeout (the openai SDK's name for it), not both")
    connect = seconds(timeout if timeout is not None else (10.0 if connect_timeout is None else connect_timeout),
                      "timeout" if timeout is not None else "connect_timeout")
    retries = None if max_retries is None else count(max_retries, "max_retries")
    return merged, connect, retries
