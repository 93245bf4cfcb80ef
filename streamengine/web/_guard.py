"""Who may start a run, from where, and how many at once.

Every check here runs before a stream starts, so a refusal is an ordinary
JSON response and costs no provider call:

* **Host** (DNS rebinding): a page on ``evil.example`` whose name is made to
  resolve to ``127.0.0.1`` talks to this server as "same origin"; only the
  ``Host`` header still says ``evil.example``.  So the Host must be one the
  app was told about (by default the loopback names and the server's own).
* **authorize(environ)**: the application's hook (session cookie, API key,
  ...).  Falsy -> 401; raising :class:`PermissionError` -> 403 with its text.
* **Stream limits**: each open stream holds a server thread for its whole
  length.  A global cap below the server's thread count keeps threads free
  for ``/healthz`` and the page; a per-client cap keeps one client from
  taking all of them.  Over either cap -> 429 with ``Retry-After``.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, FrozenSet, Iterable, Optional

from .. import _validation as validation
from .._errors import ConfigError
from ._http import HttpError

ClientKey = Callable[[dict], str]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def client_address(environ: dict) -> str:
    """The default client key: the peer address (behind a proxy, pass a ``client_key`` that reads yours)."""
    return environ.get("REMOTE_ADDR") or "unknown"


class HostCheck:
    """The ``Host`` header must name this server; ``None`` hosts = loopback names + the bound address."""

    def __init__(self, allowed_hosts: Optional[Iterable[str]]) -> None:
        if isinstance(allowed_hosts, str):
            raise ConfigError(f"allowed_hosts must be a collection of host names, got the string "
                              f"{allowed_hosts!r}; write allowed_hosts=[{allowed_hosts!r}]")
        self._any = False
        self._configured: Optional[FrozenSet[str]] = None
        if allowed_hosts is not None:
            hosts = [self._checked(h) for h in allowed_hosts]
            self._any = "*" in hosts
            self._configured = frozenset(h for h in hosts if h != "*")

    @staticmethod
    def _checked(host: object) -> str:
        if not isinstance(host, str) or not host.strip() or any(c in host for c in "/@ "):
            raise ConfigError(f"allowed_hosts entries must be host names like 'chat.example.com' or "
                              f"'127.0.0.1' (no scheme, port or path), or '*' for any; got {host!r}")
        return _bare(host.strip().lower())

    def check(self, environ: dict) -> None:
        if self._any:
            return
        raw = environ.get("HTTP_HOST") or ""
        host = _host_of(raw.strip().lower())
        allowed = self._configured if self._configured is not None else self._defaults(environ)
        if host is None or host not in allowed:
            raise HttpError(f"Host {raw or '(none)'!r} is not served here (DNS rebinding guard); allowed: "
                            f"{', '.join(sorted(allowed))}. Serving under another name? "
                            "Pass make_wsgi_app(engine, allowed_hosts=[...])", 400, field="Host")

    @staticmethod
    def _defaults(environ: dict) -> FrozenSet[str]:
        server = _bare((environ.get("SERVER_NAME") or "").lower())
        return LOOPBACK_HOSTS | ({server} if server not in _WILDCARDS else set())


def _host_of(header: str) -> Optional[str]:
    """The host name of a ``Host`` header, or None when it is not ``host[:port]``.

    A Host header carries no userinfo (RFC 9110 7.2), so ``127.0.0.1:80@evil.example``
    is refused rather than read as "127.0.0.1"; the port, when present, must be digits.
    """
    if "@" in header:
        return None
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        host, rest = header[:end + 1], header[end + 1:]
    elif header.count(":") == 1:
        host, port = header.split(":")
        rest = ":" + port
    else:
        host, rest = header, ""  # a bare IPv6 address without brackets has several colons and no port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii()):
        return None
    return _bare(host)


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class StreamLimiter:
    """Counts open streams, in total and per client key; refuses over either cap with a 429."""

    def __init__(self, max_streams: int, max_streams_per_client: int, client_key: ClientKey,
                 retry_after_s: int) -> None:
        for name, value in (("max_streams", max_streams), ("max_streams_per_client", max_streams_per_client),
                            ("retry_after_s", retry_after_s)):
            validation.count(value, name, minimum=1)
        if not callable(client_key):
            raise ConfigError(f"client_key must be a function environ -> str, got {type(client_key).__name__}")
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client
        self._client_key = client_key
        self._retry_after = str(retry_after_s)
        self._lock = threading.Lock()
        self._total = 0
        self._per_client: Dict[str, int] = {}

    @property
    def active(self) -> int:
        return self._total

    def acquire(self, environ: dict) -> Callable[[], None]:
        """Take a slot for this request's client, or raise a 429; returns ``release()`` (idempotent)."""
        key = str(self._client_key(environ))
        with self._lock:
            if self._total >= self.max_streams:
                raise self._refusal(f"the server is at its limit of {self.max_streams} concurrent streams")
            held = self._per_client.get(key, 0)
            if held >= self.max_streams_per_client:
                raise self._refusal(f"this client already has {held} open streams (the limit is "
                                    f"{self.max_streams_per_client}); close one")
            self._total += 1
            self._per_client[key] = held + 1
        released = []

        def release() -> None:
            with self._lock:
                if released:
                    return
                released.append(True)
                self._total -= 1
                left = self._per_client[key] - 1
                if left:
                    self._per_client[key] = left
                else:
                    del self._per_client[key]

        return release

    def _refusal(self, why: str) -> HttpError:
        return HttpError(f"{why}; retry after {self._retry_after} s", 429, [("Retry-After", self._retry_after)])
