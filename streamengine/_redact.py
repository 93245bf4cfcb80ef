"""What a message, a log line, a span or a tool result may show of a URL or a secret.

One home for the rule, so every place that shows text built from a URL, a
provider's answer or an MCP server's error hides the same things:

* **URLs by structure**: the userinfo (``user:PASS@``, or a token as the user
  name) and every query value (``?token=…``) become ``***``; scheme, host,
  port, path and query names stay, so the message still says where it went.
  Relative references after a space (``url: /v1/chat?key=…``, as urllib3
  writes them) are treated the same way.
* **Known secrets by value**, only those long enough to be secrets
  (:data:`MIN_SECRET_CHARS`): a dummy key such as ``ollama`` or ``x`` must not
  turn "ollama pull llama3.2" into "*** pull llama3.2".
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Tuple

MASK = "***"
#: A known secret shorter than this is a placeholder (``ollama``, ``x``, ``sk-``), not worth hiding.
MIN_SECRET_CHARS = 8

# An absolute URL (scheme://...), or a relative reference starting with "/" that is not
# inside a word or a path (so "a/b" in prose is left alone).
_URL = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.\-]*://|(?<![\w/.\-])/(?=[\w.~%\-]))[^\s'\"<>`]*")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#@]*)@")
_QUERY_VALUE = re.compile(r"([?&;][^=&;#]*=)([^&;#]*)")


def redact_url(url: str) -> str:
    """``url`` with its userinfo and query values masked; everything else kept."""
    url = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", url, count=1)
    head, hash_, fragment = url.partition("#")
    path, question, query = head.partition("?")
    if not question:
        return url
    return path + _QUERY_VALUE.sub(lambda m: m.group(1) + (MASK if m.group(2) else ""), "?" + query) \
        + hash_ + fragment


def redact_urls(text: str) -> str:
    """Every URL in ``text`` passed through :func:`redact_url`."""
    if "://" not in text and "?" not in text and "@" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def secret_forms(secrets: Iterable[Optional[str]]) -> Tuple[str, ...]:
    """Each secret worth hiding as it may appear in a message: raw, and escaped inside a ``repr()``."""
    forms = set()
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            forms.add(secret)
            escaped = repr(secret)[1:-1]
            if escaped != secret:
                forms.add(escaped)
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted(forms, key=len, reverse=True))


class Redactor:
    """Masks URLs by structure and the given secrets by value; ``Redactor()(text)`` is the safe text."""

    __slots__ = ("secrets",)

    def __init__(self, secrets: Iterable[Optional[str]] = ()) -> None:
        self.secrets = secret_forms(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return redact_urls(text)

    def with_secrets(self, secrets: Iterable[Optional[str]]) -> Redactor:
        """A redactor that also hides ``secrets`` (a request's own credential headers)."""
        return Redactor(list(self.secrets) + list(secrets))


#: For text that carries no known secret, only URLs.
redact = Redactor()
