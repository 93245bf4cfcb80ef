"""What text may show, and where it goes: secrets hidden, terminal control characters shown, the log.

One home for the rules every place that shows text from a URL, a provider,
a tool or an MCP server follows, and for the lazily configured loguru logger.

What a message, a log line, a span or a tool result may show of a URL or a secret.

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
* **URLs the owner gave** (an MCP server's endpoint) are shown with only
  their credentials masked (:func:`redact_credentials`, userinfo and
  credential-named parameters), so a user still reads which URL it was; a
  :class:`Redactor` keeps them as they are (``shown=``).

Text for a terminal: control characters shown, never obeyed.

Model, tool and MCP server text is hostile input, and a terminal obeys what
it is sent: ``ESC ] 52`` writes the clipboard, ``ESC ] 8`` hides a link
behind harmless words, ``ESC [ 2J`` clears the screen, a bidi override
reorders what a person reads, a zero-width character hides a difference.
:func:`for_terminal` replaces each such character one by one with a visible
stand-in, so it is as safe on a stream cut into tokens (an escape sequence
split between two) as on whole lines.

Logging: loguru, silent until the application asks for it, and imported when first needed.

A library must not print into its host's logs uninvited, so the package
disables itself the moment loguru is first touched; :func:`enable_logging`
is the one switch.  Loguru costs ~50 ms to import, so a module asks for a
:func:`component_logger` at import time and gets a stand-in that imports
loguru on its first log call (most runs never log anything).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Optional, Set, TextIO, Tuple, Union, cast
from urllib.parse import unquote

if TYPE_CHECKING:
    import logging

    from loguru import Logger, Message, Record

#: Where :func:`enable_logging` may send the logs: what loguru's ``logger.add`` takes (a stream, a
#: function of each formatted message, a ``logging.Handler``, or a file path).
Sink = Union[TextIO, "Callable[[Message], None]", "logging.Handler", str, "os.PathLike[str]"]

MASK = "***"
#: A known secret shorter than this is a placeholder (``ollama``, ``x``, ``sk-``), not worth hiding.
MIN_SECRET_CHARS = 8

# An absolute URL (scheme://...), or a relative reference starting with "/" that is not
# inside a word or a path (so "a/b" in prose is left alone).
_URL = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.\-]*://|(?<![\w/.\-])/(?=[\w.~%\-]))[^\s'\"<>`]*")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#@]*)@")
_QUERY_VALUE = re.compile(r"([?&;]([^=&;#]*)=)([^&;#]*)")
#: Query parameter names whose values are credentials (``token``, ``api_key``, ``X-Amz-Signature``...).
CREDENTIAL_PARAM = re.compile(r"auth|key|token|secret|passw|pwd|sig|credential|session|cookie|jwt", re.I)


def redact_url(url: str, masked: Callable[[str], bool] = lambda name: True) -> str:
    """``url`` with its userinfo and the query values of parameters ``masked`` names (all) masked."""
    url = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", url, count=1)
    head, hash_, fragment = url.partition("#")
    path, question, query = head.partition("?")
    if not question:
        return url
    return path + _QUERY_VALUE.sub(
        lambda m: m.group(1) + (MASK if m.group(3) and masked(unquote(m.group(2))) else m.group(3)),
        "?" + query) + hash_ + fragment


def redact_credentials(url: str) -> str:
    """``url`` with its userinfo and credential-named query values masked: a URL its owner still reads."""
    return redact_url(url, lambda name: bool(CREDENTIAL_PARAM.search(name)))


def redact_urls(text: str) -> str:
    """Every URL in ``text`` passed through :func:`redact_url`."""
    if "://" not in text and "?" not in text and "@" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def secret_forms(secrets: Iterable[Optional[str]]) -> Tuple[str, ...]:
    """Each secret worth hiding as it may appear in a message: raw, escaped inside a ``repr()``, and
    escaped inside a JSON string (an error body is redacted before it is parsed, so ``response="…"`` of a
    Digest header arrives as ``response=\\"…\\"``)."""
    forms: Set[str] = set()
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            forms.update((secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]))
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted(forms, key=len, reverse=True))


class Redactor:
    """Masks URLs by structure and the given secrets by value; ``Redactor()(text)`` is the safe text.

    ``shown``: URLs already made safe to show (:func:`redact_credentials`), kept as they are.
    """

    __slots__ = ("secrets", "shown")

    def __init__(self, secrets: Iterable[Optional[str]] = (), shown: Iterable[str] = ()) -> None:
        self.secrets = secret_forms(secrets)
        self.shown = tuple(sorted(set(shown), key=len, reverse=True))

    def __call__(self, text: str) -> str:
        kept = [url for url in self.shown if url in text]
        for i, url in enumerate(kept):
            text = text.replace(url, f"\x00{i}\x00")
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        text = redact_urls(text)
        for i, url in enumerate(kept):
            text = text.replace(f"\x00{i}\x00", url)
        return text

    def with_secrets(self, secrets: Iterable[Optional[str]]) -> Redactor:
        """A redactor that also hides ``secrets`` (a request's own credential headers)."""
        return Redactor(list(self.secrets) + list(secrets), self.shown)


#: For text that carries no known secret, only URLs.
redact = Redactor()


#: Bidi embedding, override and isolate controls and marks (U+061C, U+200E-U+200F): they reorder the text
#: around them.  Zero-width characters (U+200B-U+200D, U+FEFF): they hide a difference a person cannot
#: see (two names that look the same, a word split so a filter misses it).
_INVISIBLE = ((0x061C, 0xFEFF) + tuple(range(0x200B, 0x2010)) + tuple(range(0x202A, 0x202F))
              + tuple(range(0x2066, 0x206A)))


def _table() -> Dict[int, str]:
    table: Dict[int, str] = {}
    for code in range(0x20):
        if chr(code) not in "\t\n":
            table[code] = "^" + chr(code + 0x40)  # caret notation, as cat -v and less show them: ESC is ^[
    table[0x7F] = "^?"
    for code in tuple(range(0x80, 0xA0)) + _INVISIBLE:  # C1 controls (0x9B is an 8-bit CSI), bidi, zero-width
        table[code] = f"<U+{code:04X}>"
    return table


_VISIBLE = _table()


def for_terminal(text: str) -> str:
    """``text`` with every control character but tab and newline made visible (``ESC`` becomes ``^[``).

    A carriage return before a newline is dropped (the terminal shows the
    line the same); any other one is shown as ``^M``: it would let later
    text overwrite what came before it on the line.
    """
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_VISIBLE)


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is a terminal (a closed stream or one without ``isatty`` is not)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return False


_sink_id: Optional[int] = None
_logger: Optional[Logger] = None
_first_use = threading.Lock()


def loguru_logger() -> Logger:
    """Loguru's logger, with streamengine's records disabled the first time it is fetched."""
    global _logger
    if _logger is None:
        with _first_use:
            if _logger is None:
                from loguru import logger
                if not _host_decided(logger):
                    logger.disable("streamengine")
                _logger = logger
    return _logger


def _host_decided(logger: Logger) -> bool:
    """Whether the application already enabled or disabled ``streamengine`` in loguru itself.

    Loguru's documented way for an application to hear a library is
    ``logger.enable("streamengine")``; one that did so before our first log
    line must not be overridden by our lazy default.  Loguru keeps these
    choices in its core's activation list (read defensively: it is not API).
    """
    activations = getattr(getattr(logger, "_core", None), "activation_list", None) or ()
    return any(str(name).startswith("streamengine") for name, _ in activations)


def enable_logging(level: str = "WARNING", sink: Optional[Sink] = None) -> int:
    """Turn on streamengine's logs at ``level`` into ``sink`` (default stderr).

    Returns the loguru handler id.  Calling it again replaces the earlier sink
    rather than duplicating every line.
    """
    global _sink_id
    logger = loguru_logger()
    _keep_default_handler_out(logger)
    logger.enable("streamengine")
    if _sink_id is not None:
        try:
            logger.remove(_sink_id)
        except ValueError:
            pass
    _sink_id = logger.add(
        sink if sink is not None else sys.stderr,
        level=level,
        filter=lambda record: record["name"].startswith("streamengine"),
        format=_format,
        # diagnose would print local variables in tracebacks: secrets included.
        diagnose=False,
        backtrace=False,
    )
    return _sink_id


def _keep_default_handler_out(logger: Logger) -> None:
    """Stop loguru's built-in stderr handler (id 0) from printing our records a second time.

    It is replaced by the same handler minus streamengine's records, so the
    host's own logging looks exactly as before.  A host that already removed
    it is left alone.
    """
    try:
        logger.remove(0)
    except ValueError:
        return
    logger.add(sys.stderr, level=os.environ.get("LOGURU_LEVEL", "DEBUG"),
               filter=lambda record: not record["name"].startswith("streamengine"))


def _format(record: Record) -> str:
    # A callable format, so that records without a bound component still render
    # and the host's global loguru config is left untouched.
    record["extra"].setdefault("component", record["name"])
    return "{time:HH:mm:ss.SSS} {level: <7} {extra[component]} | {message}\n{exception}"


def component_logger(component: str, base: Optional[Logger] = None) -> Logger:
    """A logger bound to a component name such as ``streamengine.calls.StreamingCallStrategy``.

    ``base`` (a logger the application passed in) is bound at once; without
    one, the stand-in binds loguru's logger on first use.
    """
    if base is not None:
        loguru_logger()  # streamengine stays disabled in loguru until enable_logging()
        return base.bind(component=component)
    # The stand-in answers every attribute with the bound logger's own: a Logger to its callers.
    return cast("Logger", _LazyLogger(component))


class _LazyLogger:
    """Loguru's logger bound to ``component``, made on the first log call.

    Each method looked up is kept on the instance, so only the first call of
    each pays for the lookup; a call still runs in the caller's frame, which
    is what loguru reads the module name (and so the disabled state) from.
    """

    def __init__(self, component: str) -> None:
        self._component = component

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(loguru_logger().bind(component=self._component), name)
        setattr(self, name, value)
        return value
