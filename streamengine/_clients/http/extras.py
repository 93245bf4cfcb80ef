"""The openai SDK's habits: ``extra_body``/``extra_headers``/``extra_query``, ``timeout=``, ``max_retries=``.

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

import copy
from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Tuple

from ..._errors import ConfigError
from ..._messages import CompletionOptions
from ..._validation import count, seconds
from .credentials import check_headers, credentials_in

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


class RequestExtras:
    """Mixed into an HTTP client: ``stream``/``open_stream``/``complete`` honour the extras of their options.

    A call with extra headers or query runs on a shallow copy of the client
    (same session and pool) whose headers, query and secrets include them:
    the transport reads them per request, and nothing of one call leaks into
    the next.
    """

    def stream(self, messages: Any, tools: Any = None, options: Optional[CompletionOptions] = None,
               cancel: Any = None) -> Any:
        client, options = self._for_call(options)
        return super(RequestExtras, client).stream(messages, tools, options, cancel)  # type: ignore[misc]

    def open_stream(self, messages: Any, tools: Any = None, options: Optional[CompletionOptions] = None,
                    cancel: Any = None) -> Any:
        client, options = self._for_call(options)
        return super(RequestExtras, client).open_stream(messages, tools, options, cancel)  # type: ignore[misc]

    def complete(self, messages: Any, tools: Any = None, options: Optional[CompletionOptions] = None,
                 cancel: Any = None) -> Any:
        client, options = self._for_call(options)
        return super(RequestExtras, client).complete(messages, tools, options, cancel)  # type: ignore[misc]

    def _for_call(self, options: Optional[CompletionOptions]) -> Tuple[Any, Optional[CompletionOptions]]:
        options, headers, query = split_extras(options)
        if not headers and not query:
            return self, options
        view = copy.copy(self)
        view._headers = {**self._headers, **headers}  # type: ignore[attr-defined]
        view._query = {**self._query, **query}  # type: ignore[attr-defined]
        view._redact = self._redact.with_secrets(credentials_in(None, headers, query))  # type: ignore[attr-defined]
        view._owns_session = False  # closing the view must never close the shared session
        return view, options


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
