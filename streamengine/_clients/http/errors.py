"""What every provider's failures have in common: the status line, Retry-After, a cause in few words.

The wording of the detail and the advice is the provider's own (its error
body, its hints); the shape of the message and the parsing of the headers
are shared, so failover sees the same :class:`LlmHttpError` from every
provider.
"""
from __future__ import annotations

import email.utils
import re
import time
from typing import Any, Callable, List, Mapping, Optional, Set

from ..._errors import LlmError, LlmHttpError, LlmStreamError

MAX_RETRY_AFTER_S = 86400.0


def status_error(status: int, reason: str, url: str, text: str, headers: Mapping[str, str], *,
                 detail: str, hint: str) -> LlmHttpError:
    """The LlmHttpError for an error status: status, the provider's words, then what to do."""
    retry_after = parse_retry_after(headers)
    when = f"; retry after {retry_after:g}s" if retry_after is not None else ""
    message = (f"provider answered HTTP {status} {reason or ''}".rstrip()
               + f" for {url}: {detail} ({hint}{when})")
    return LlmHttpError(status, text, retry_after, message=message)


def redact_exception(exc: BaseException, redact: Callable[[str], str]) -> None:
    """Redact the words of ``exc`` and of everything under it (cause, context, urllib3's ``reason``).

    It is chained to the error we raise, and a printed traceback shows the
    whole chain: urllib3 quotes the request's path with its query
    (``Max retries exceeded with url: /v1/chat?key=...``).
    """
    seen: Set[int] = set()
    todo: List[Optional[BaseException]] = [exc]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        error.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in error.args)
        todo += [error.__cause__, error.__context__, getattr(error, "reason", None)]
        todo += [arg for arg in error.args if isinstance(arg, BaseException)]


def short_cause(exc: BaseException, limit: int = 160) -> str:
    """An exception's own words, without urllib3's object reprs and argument tuples."""
    first = exc.args[0] if exc.args and isinstance(exc.args[0], str) else None
    text = first or str(exc) or type(exc).__name__
    text = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>:?\s*", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_retry_after(headers: Mapping[str, str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date).

    A number must be plain digits with an optional fraction (RFC 9110
    ``delay-seconds``, fractions tolerated): ``nan``, ``inf``, ``-1``,
    ``1e3``, ``0x10``, ``1_0`` are not numbers here.  Anything invalid,
    negative or over a day is ignored (``None``): a broken header must not
    park a caller for a year.  A date in the past means "now" (0).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = _finite(lowered.get("retry-after-ms"))
    if ms is not None:
        return _sane(ms / 1000.0)
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is not None:
        return _sane(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return _sane(max(0.0, when.timestamp() - now))


_DELAY = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?")


def _finite(value: Optional[str]) -> Optional[float]:
    # float() would take "nan", "inf", "1e9", " 1_0" and "+5"; a header is digits.
    if not isinstance(value, str) or not _DELAY.fullmatch(value.strip()):
        return None
    return float(value.strip())


def _sane(seconds: float) -> Optional[float]:
    return seconds if 0.0 <= seconds <= MAX_RETRY_AFTER_S else None



# -- in-band errors: one classification for every wire ---------------------------------

#: Error ``type`` (or string ``code``) names that providers send in a body or a
#: stream -> the HTTP status they stand for.  OpenAI, Groq, Mistral and
#: OpenRouter use OpenAI's names; Anthropic its own; vLLM and llama.cpp the
#: exception class or a short word.  The status decides what failover does.
ERROR_TYPE_STATUSES = {
    "invalid_request_error": 400, "badrequesterror": 400, "bad_request": 400,
    "context_length_exceeded": 400, "invalid_value": 400,
    "authentication_error": 401, "invalid_api_key": 401, "authenticationerror": 401,
    "billing_error": 402, "insufficient_quota": 402,
    "permission_error": 403, "permissiondeniederror": 403,
    "not_found_error": 404, "notfounderror": 404, "model_not_found": 404,
    "request_too_large": 413,
    "rate_limit_error": 429, "rate_limit_exceeded": 429, "ratelimiterror": 429, "tokens": 429, "requests": 429,
    "api_error": 500, "server_error": 500, "internal_error": 500, "internalservererror": 500,
    "service_unavailable": 503, "unavailable_error": 503,
    "timeout_error": 504,
    "overloaded_error": 529,
}

#: Words of an error that says "too busy" without a type we know.  "rate" alone
#: would match "generate"; these are the words providers use.
_RATE_LIMITED = re.compile(r"rate[ _-]?limit|too many requests", re.I)
_OVERLOAD = re.compile(r"overload|capacity", re.I)
_OVERLOADED_STATUSES = frozenset({429, 503, 529})
_BUSY_STATUS_IN_TEXT = re.compile(r"\b(429|503|529)\b")


def _status_number(value: Any) -> Optional[int]:
    """An HTTP error status sent as a number or digits (``400``, ``"503"``); anything else is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if isinstance(value, int) and 400 <= value <= 599 else None


def in_band_status(*, status: Any = None, kind: Any = None, code: Any = None, message: str = "") -> Optional[int]:
    """The HTTP status an in-band error stands for, or None when nothing says.

    In order: a status the provider sent (``status``, or a numeric ``code``
    as vLLM and OpenRouter send), the error's ``type`` or string ``code``
    (:data:`ERROR_TYPE_STATUSES`), then a busy status (429/503/529), "rate
    limit" words (a 429) or "overloaded" words (a 529) in the text.
    """
    for candidate in (status, code):
        number = _status_number(candidate)
        if number is not None:
            return number
    for name in (kind, code):
        if isinstance(name, str) and name.lower() in ERROR_TYPE_STATUSES:
            return ERROR_TYPE_STATUSES[name.lower()]
    words = " ".join(str(v) for v in (kind, code, message) if v is not None)
    said = _BUSY_STATUS_IN_TEXT.search(words)
    if said:
        return int(said.group(1))
    if _RATE_LIMITED.search(words):
        return 429
    return 529 if _OVERLOAD.search(words) else None


def in_band_error(described: str, status: Optional[int], body: str, redact: Callable[[str], str],
                  hint: Callable[[int], str]) -> LlmError:
    """The exception for an error sent inside a 200 answer, classified like the status it stands for.

    4xx-like (the request is wrong: a bad schema, a key, a model name) is an
    :class:`LlmHttpError` with that status, so failover treats it exactly as
    the same HTTP answer: fatal, except 429 (retried) and 404/408 (next
    model).  5xx-like, overloaded or unknown is a broken stream
    (:class:`LlmStreamError`): fail over.  ``described`` is where and what
    ("... sent an error in the stream after 3 events: type: message").
    """
    if status is not None and status < 500:
        return LlmHttpError(status, body, message=redact(f"{described} (the same as an HTTP {status}; {hint(status)})"))
    overloaded = status in _OVERLOADED_STATUSES
    return LlmStreamError(redact(described + ("; the provider is overloaded, retry later or fail over"
                                              if overloaded else "; retry or fail over")),
                          overloaded=overloaded)
