"""What went wrong with a provider, in words a person acts on.

Every message starts with the cause ("could not connect to URL: connection
refused") and ends with what to do; the library exception underneath stays
chained for ``-v`` and tracebacks.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
from typing import Any, Iterator, Mapping, Optional
from urllib.parse import urlsplit

import requests

from ..._errors import LlmHttpError
from ..http.errors import in_band_error, in_band_status, short_cause, status_error

_HINTS = {
    400: "the provider rejected the request; check the model name, messages and options",
    401: "check the API key (STREAMENGINE_API_KEY or OPENAI_API_KEY)",
    403: "the API key is not allowed to use this model or endpoint",
    404: "check base_url and the model name",
    429: "rate limited by the provider; slow down or retry later",
}
NO_JINJA_HINT = ("the server cannot take native tools (llama-server without --jinja): start it with --jinja, "
                 "or call tools inline with EngineConfig(tool_mode='inline') (CLI: --tool-mode inline)")
NO_STREAM_OPTIONS_HINT = ("the server does not accept 'stream_options': turn it off with "
                          "OpenAICompatibleClient(..., stream_options=False) (CLI: --no-stream-options)")


def http_error(status: int, reason: str, url: str, text: str, headers: Mapping[str, str], *,
               base_url: str, sent_stream_options: bool) -> LlmHttpError:
    """The LlmHttpError for an error status: status, provider's message, then what to do."""
    detail = provider_message(text) or text[:300].strip() or "(empty body)"
    return status_error(status, reason, url, text, headers, detail=detail,
                        hint=_hint(status, text, base_url, sent_stream_options))


def _hint(status: int, text: str, base_url: str, sent_stream_options: bool) -> str:
    if sent_stream_options and 400 <= status < 500 and status not in (401, 403, 404, 429) \
            and "stream_options" in text:
        return NO_STREAM_OPTIONS_HINT
    if "--jinja" in text:
        return NO_JINJA_HINT
    if status == 404:
        suggestion = _with_v1(base_url)
        if suggestion:
            return f"the base URL has no /v1: did you mean {suggestion}?"
    return _hint_for_status(status)


def _with_v1(base_url: str) -> Optional[str]:
    """``base_url + "/v1"`` when the URL looks like a server root missing the API prefix."""
    path = urlsplit(base_url).path
    segments = [s for s in path.split("/") if s]
    if any(re.fullmatch(r"v\d+(?:beta|alpha)?\d*", s) for s in segments) or "deployments" in segments:
        return None
    return base_url.rstrip("/") + "/v1"


def connection_error_message(exc: BaseException, url: str, base_url: str, connect_timeout: float) -> str:
    """One line for a request that got no answer: where, the cause in plain words, what to check."""
    causes = list(_causes(exc))

    def found(*kinds: Any, names: tuple = ()) -> Optional[BaseException]:
        return next((c for c in causes if isinstance(c, kinds) or type(c).__name__ in names), None)

    where = f"could not connect to {base_url}"
    if found(ConnectionRefusedError):
        return f"{where}: connection refused \u2014 is the server running?"
    if found(socket.gaierror, names=("NameResolutionError",)):
        host = urlsplit(base_url).hostname
        return f"{where}: cannot resolve the host name {host!r} \u2014 check the base URL and your network"
    tls = found(ssl.SSLError)
    if tls is not None:
        return (f"{where}: TLS handshake failed ({short_cause(tls)}) "
                f"\u2014 check http:// vs https:// and the server's certificate")
    # urllib3's NewConnectionError subclasses ConnectTimeoutError: it only counts with a real timeout.
    timeout = found(requests.ConnectTimeout, socket.timeout)
    if timeout is not None:
        return (f"{where}: no answer to the connection within {connect_timeout:g}s ({type(timeout).__name__}) "
                f"\u2014 is the host reachable (firewall, VPN, the port)?")
    dropped = found(ConnectionResetError, BrokenPipeError, names=("RemoteDisconnected",))
    if dropped is not None:
        return (f"the server at {base_url} closed the connection before answering ({short_cause(dropped)}) "
                f"\u2014 it may have crashed or be overloaded; retry, or check the URL (http vs https, the port)")
    deepest = causes[-1] if causes else exc
    return f"no answer from {url}: {short_cause(deepest)} \u2014 check that the provider is running and base_url is right"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then everything underneath it (cause, context, urllib3's ``reason``, args)."""
    seen = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [arg for arg in getattr(current, "args", ()) if isinstance(arg, BaseException)]
        todo.extend(e for e in linked if isinstance(e, BaseException))


def provider_message(text: str) -> Optional[str]:
    """The provider's own error message from a JSON error body, if there is one."""
    try:
        payload = json.loads(text)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload)
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        for key in ("message", "detail", "error"):
            if isinstance(error.get(key), str) and error[key]:
                return error[key]
    if isinstance(payload.get("detail"), str):
        return payload["detail"]
    return None


def raise_in_band_error(payload: Any, url: str, redact: Any, after: Optional[int] = None) -> None:
    """Raise for an ``{"error": ...}`` object in a 200 answer or stream; nothing otherwise.

    Classified by :func:`..http.errors.in_band_error` like every wire: the
    provider's status (``status``, ``status_code``, a numeric ``code``) or
    its type decides, so Groq's ``invalid_request_error`` with status 400 is
    as fatal as an HTTP 400.
    """
    if not isinstance(payload, dict) or not payload.get("error"):
        return
    error = payload["error"]
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind, code = error.get("type"), error.get("code")
        status = error.get("status_code", error.get("status", payload.get("status_code")))
    else:
        message, kind, code, status = str(error), None, None, payload.get("status_code")
    facts = ", ".join(f"{k}={v}" for k, v in (("type", kind), ("code", code)) if v is not None)
    where = f"in the stream after {after} events" if after is not None else "in its answer"
    described = f"provider at {url} sent an error {where}: {message}" + (f" ({facts})" if facts else "")
    raise in_band_error(described, in_band_status(status=status, kind=kind, code=code, message=message),
                        json.dumps(payload)[:1024], redact, _hint_for_status)


def _hint_for_status(status: int) -> str:
    return _HINTS.get(status) or ("the provider failed; retry later or fail over to another model"
                                  if status >= 500 else "the request was not accepted")
