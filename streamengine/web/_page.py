"""The page the app serves at ``/``: read once, with a CSP that allows exactly its inline code.

The page (``streamengine/static/index.html``) is self-contained: its script
and style are inline, so the Content-Security-Policy names them by SHA-256
and allows nothing else (no external assets, no other inline code).
"""
from __future__ import annotations

import base64
import hashlib
import html
import pkgutil
import re
from typing import Dict, List, Tuple

from .._errors import ConfigError
from .._messages import LLM_WARNING
from ._sites import same_origin

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


def load_page() -> Tuple[str, str]:
    """The page and a CSP allowing exactly its inline script and style (by SHA-256)."""
    data = pkgutil.get_data("streamengine", "static/index.html")
    if data is None:  # pragma: no cover - a broken installation
        raise ConfigError("streamengine/static/index.html is missing from this installation; reinstall streamengine")
    page = data.decode("utf-8")
    hashes: Dict[str, List[str]] = {"script": [], "style": []}
    for kind, content in _INLINE.findall(page):
        digest = base64.b64encode(hashlib.sha256(content.encode("utf-8")).digest()).decode("ascii")
        hashes[kind].append(f"'sha256-{digest}'")
    script = " ".join(hashes["script"]) or "'none'"
    style = " ".join(hashes["style"]) or "'none'"
    csp = (f"default-src 'none'; script-src {script}; style-src {style}; connect-src 'self'; "
           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return page, csp


def fill_page(page: str, stream_url: str, environ: dict) -> bytes:
    """The page for one request: its stream URL, whether ``?autorun=`` may start a run, the warning prefix."""
    # ?autorun=PROMPT asks on load only for a same-origin request (_sites); any other only fills the box.
    autorun = "on" if same_origin(environ) else "off"
    return (page.replace("__STREAM_URL__", html.escape(stream_url, quote=True))
            .replace("__AUTORUN__", autorun)
            .replace("__LLM_WARNING__", html.escape(LLM_WARNING, quote=True)).encode("utf-8"))
