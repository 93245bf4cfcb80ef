"""Serving the app under a prefix next to another WSGI app (Flask, Django)."""
from __future__ import annotations

from typing import Callable, Iterable

from .._errors import ConfigError
from ._http import StartResponse


def mount(host_app: Callable[..., Iterable[bytes]], prefix: str,
          app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app sending ``prefix`` and everything below it to ``app``, the rest to ``host_app``.

    The way to put the stream next to an existing Flask or Django app without
    touching its routing: the prefix moves from ``PATH_INFO`` to
    ``SCRIPT_NAME`` (PEP 3333), so ``app`` sees its own paths and the page
    links to ``<prefix>/v1/chat/stream``::

        application = mount(get_wsgi_application(), "/chat", make_wsgi_app(engine))
    """
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.endswith("/") \
            or any(c in prefix for c in "?#") or not prefix.isprintable():
        raise ConfigError(f"mount prefix must look like '/chat' (leading slash, no trailing slash), got {prefix!r}")
    for name, value in (("host_app", host_app), ("app", app)):
        if not callable(value):
            raise ConfigError(f"mount {name} must be a WSGI callable, got {type(value).__name__}")

    def dispatch(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or ""
        if path == prefix or path.startswith(prefix + "/"):
            environ = dict(environ, SCRIPT_NAME=(environ.get("SCRIPT_NAME") or "") + prefix,
                           PATH_INFO=path[len(prefix):])
            return app(environ, start_response)
        return host_app(environ, start_response)

    return dispatch
