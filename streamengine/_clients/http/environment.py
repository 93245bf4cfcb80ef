"""What the environment says about a request (proxies, CA bundle, ``~/.netrc``), read once per URL.

With ``trust_env`` on (its default), requests reads the environment again on
every request: it decodes every environment variable twice to find the
proxies and ``NO_PROXY``, looks for ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``
and reads ``~/.netrc``.  On a served stream of 60 tokens that is the largest
part of a request's fixed cost (``bench/README.md``, section 14).  httpx and
the openai SDK read the environment once, when the client is made.

A client that made its own session does the same, per URL: its session gets
``trust_env = False``, and the settings requests would have found are read at
the first request to a URL, kept, and passed with every request to it — the
same proxies, ``verify`` and netrc credentials requests itself would use.
To follow a change of the environment, make a new client.  A session you
pass is left alone: it reads the environment as requests always does.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional

import requests
import requests.utils

#: A client talks to a handful of URLs (its endpoints); past this many, the oldest are forgotten.
MAX_URLS = 64


class EnvironmentSettings:
    """The keyword arguments of ``Session.request`` that requests would take from the environment, per URL."""

    def __init__(self) -> None:
        self._by_url: Dict[str, Dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._probe = requests.Session()  # trust_env on: the one requests reads the environment with
        self._probe.close()  # never sends; nothing to pool

    def for_url(self, url: str) -> Dict[str, Any]:
        """``proxies``, ``verify`` and (from ``~/.netrc``) ``auth`` for a request to ``url``."""
        settings = self._by_url.get(url)
        if settings is None:
            settings = self._read(url)
            with self._lock:
                if len(self._by_url) >= MAX_URLS:
                    self._by_url.pop(next(iter(self._by_url)))
                self._by_url[url] = settings
        return settings

    def _read(self, url: str) -> Dict[str, Any]:
        merged = self._probe.merge_environment_settings(url, {}, None, None, None)
        settings: Dict[str, Any] = {"proxies": merged["proxies"], "verify": merged["verify"]}
        auth: Optional[Any] = requests.utils.get_netrc_auth(url)
        if auth:
            settings["auth"] = auth
        return settings


def read_once(session: requests.Session) -> EnvironmentSettings:
    """For a session the client made: requests stops reading the environment; ask the result instead."""
    session.trust_env = False
    return EnvironmentSettings()
