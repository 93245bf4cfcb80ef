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
from typing import Mapping, Optional

from ..._errors import LlmHttpError

__all__ = ["MAX_RETRY_AFTER_S", "parse_retry_after", "short_cause", "status_error"]

MAX_RETRY_AFTER_S = 86400.0


def status_error(status: int, reason: str, url: str, text: str, headers: Mapping[str, str], *,
                 detail: str, hint: str) -> LlmHttpError:
    """The LlmHttpError for an error status: status, the provider's words, then what to do."""
    retry_after = parse_retry_after(headers)
    when = f"; retry after {retry_after:g}s" if retry_after is not None else ""
    message = (f"provider answered HTTP {status} {reason or ''}".rstrip()
               + f" for {url}: {detail} ({hint}{when})")
    return LlmHttpError(status, text, retry_after, message=message)


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
