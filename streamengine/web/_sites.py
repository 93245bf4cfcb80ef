"""Which browsers' requests may start a run: the cross-site checks and CORS.

Browsers say where a request comes from (``Sec-Fetch-Site``) and what it is
for (``Sec-Fetch-Mode``, ``Sec-Fetch-Dest``); clients that are not browsers
(curl, a backend) send none of these and are not affected, except a GET that
asks for HTML, which is what a browser too old to send them does when it
follows a link.

* **POST**: another site may start a run only when ``allow_origin`` admits
  its origin (a JSON POST needs a CORS preflight, so the browser asks first).
* **GET** needs no preflight, so ``<img src=".../v1/chat/stream?q=...">`` on
  any page, or a link clicked in a mail or chat app (``Sec-Fetch-Site:
  none``, ``Sec-Fetch-Mode: navigate``), would start a run: whatever
  ``allow_origin`` says, a browser's GET run must be same-origin and made by
  the page's script (``Sec-Fetch-Dest: empty``, not a navigation).
* **Autorun** (``/?autorun=PROMPT``) asks on load only for a same-origin
  request; any other only fills the prompt box, and a person presses Send.
"""
from __future__ import annotations

import re
from typing import FrozenSet, Iterable, Sequence, Union

from .._errors import ConfigError
from ._http import Headers, HttpError

Origins = Union[None, str, FrozenSet[str]]
_ORIGIN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#]+$")
_OPEN_THE_PAGE = "open the page at / and ask there"


def same_origin(environ: dict) -> bool:
    """The browser says the request comes from this site's own page (the only one that may autorun)."""
    return environ.get("HTTP_SEC_FETCH_SITE") == "same-origin"


class CrossSite:
    """``allow_origin`` checked once; the cross-site refusals and the CORS headers follow from it."""

    def __init__(self, allow_origin: Union[str, Iterable[str], None]) -> None:
        self.origins: Origins = _check_origins(allow_origin)

    @property
    def cors(self) -> bool:
        return self.origins is not None

    def refuse_post(self, environ: dict) -> None:
        """Another site may POST a run only if ``allow_origin`` lets its origin in (a run costs money, calls tools)."""
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site not in ("cross-site", "same-site"):
            return
        origin = environ.get("HTTP_ORIGIN", "")
        if origin and self.origin_allowed(origin):
            return
        source = f" from {origin}" if origin else ""
        raise HttpError(f"refused a {site} request{source}: another site may not start runs here; to allow "
                        "one, pass its origin as make_wsgi_app(engine, allow_origin=[...])", 403, field="Origin")

    @staticmethod
    def refuse_get(environ: dict) -> None:
        """A GET run comes from this site's own script (fetch/EventSource), never from a link or a tag."""
        site = environ.get("HTTP_SEC_FETCH_SITE", "")
        if site == "none":
            raise HttpError("refused a GET run from outside this site's page (a link opened from another "
                            f"application, a bookmark or a typed address); {_OPEN_THE_PAGE}",
                            403, field="Sec-Fetch-Site")
        if site and site != "same-origin":
            raise HttpError(f"refused a {site} GET run: other sites may start runs only with a POST that "
                            "allow_origin admits", 403, field="Sec-Fetch-Site")
        dest = environ.get("HTTP_SEC_FETCH_DEST", "")
        if dest and dest != "empty":
            raise HttpError(f"refused a GET run loaded as {dest!r}: runs start from the page's fetch() or "
                            f"EventSource; {_OPEN_THE_PAGE}", 403, field="Sec-Fetch-Dest")
        if environ.get("HTTP_SEC_FETCH_MODE", "") == "navigate":
            raise HttpError("refused a GET run opened as a page: runs start from the page's fetch() or "
                            f"EventSource; {_OPEN_THE_PAGE}", 403, field="Sec-Fetch-Mode")
        if not site and _asks_for_html(environ):
            raise HttpError(f"refused a GET run asking for HTML (a browser following a link); {_OPEN_THE_PAGE}, "
                            "or send Accept: text/event-stream from a client of your own", 403, field="Accept")

    def origin_allowed(self, origin: str) -> bool:
        if self.origins is None:
            return False
        if self.origins == "*":
            return True
        if isinstance(self.origins, str):
            return origin == self.origins
        return origin in self.origins

    def cors_headers(self, environ: dict) -> Headers:
        if self.origins is None:
            return []
        if self.origins == "*":
            return [("Access-Control-Allow-Origin", "*")]
        if isinstance(self.origins, str):
            return [("Access-Control-Allow-Origin", self.origins)]
        origin = environ.get("HTTP_ORIGIN", "")
        headers = [("Vary", "Origin")]
        if origin in self.origins:
            headers.append(("Access-Control-Allow-Origin", origin))
        return headers

    @staticmethod
    def preflight_headers(allowed: Sequence[str]) -> Headers:
        return [
            ("Allow", ", ".join(allowed)),
            ("Access-Control-Allow-Methods", ", ".join(allowed)),
            ("Access-Control-Allow-Headers", "Content-Type"),
            ("Access-Control-Max-Age", "600"),
        ]


def _asks_for_html(environ: dict) -> bool:
    """``Accept`` names an HTML type: what a browser sends for a navigation, never fetch() or EventSource."""
    accept = environ.get("HTTP_ACCEPT", "").lower()
    types = {part.split(";", 1)[0].strip() for part in accept.split(",")}
    return bool(types & {"text/html", "application/xhtml+xml"})


def _check_origins(allow_origin: Union[str, Iterable[str], None]) -> Origins:
    """``None``, ``"*"``, one origin, or a frozenset of origins; each checked so no header can be forged."""
    if allow_origin is None or allow_origin == "*":
        return allow_origin
    origins = [allow_origin] if isinstance(allow_origin, str) else list(allow_origin)
    for origin in origins:
        if not isinstance(origin, str) or not _ORIGIN.match(origin):
            raise ConfigError(f"allow_origin entries must look like 'https://app.example' (scheme://host[:port], "
                              f"no path or trailing slash) or be '*', got {origin!r}")
    if not origins:
        raise ConfigError("allow_origin is an empty collection; pass None for same-origin only")
    return origins[0] if isinstance(allow_origin, str) else frozenset(origins)
