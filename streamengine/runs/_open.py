"""A run log from a URL, for configuration files and the CLI (``serve --runs URL``)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .._errors import ConfigError
from .._logs import redact_url
from ._contract import RunLog

_FORMS = "memory:, sqlite:///path/to/runs.sqlite, redis://host:6379/0 or postgresql://user@host/db"


def open_run_log(url: str, **limits: Any) -> RunLog:
    """``memory:`` (this process), ``sqlite:///path`` (this host), ``redis://…`` / ``rediss://…``, ``postgresql://…``.

    ``limits`` (``lease_s``, ``retain_s``, ``max_events``...) go to the log.
    Open it in each worker process, after the fork.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"a run log URL is one of {_FORMS}; got {url!r}")
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        from ._memory import MemoryRunLog
        return MemoryRunLog(**limits)
    if scheme == "sqlite":
        path = url.split("://", 1)[1] if "://" in url else ""
        path = path[1:] if path.startswith("/") else path  # SQLAlchemy's form: 3 slashes relative, 4 absolute
        if not path:
            raise ConfigError(f"a SQLite run log URL names its file: sqlite:///path/to/runs.sqlite (relative) or "
                              f"sqlite:////abs/path.sqlite; got {url!r}")
        from ._sqlite import SqliteRunLog
        return SqliteRunLog(path, **limits)
    if scheme in ("redis", "rediss", "unix"):
        from ._redis import RedisRunLog
        return RedisRunLog(url, **limits)
    if scheme in ("postgresql", "postgres"):
        from ._postgres import PostgresRunLog
        return PostgresRunLog(url, **limits)
    raise ConfigError(f"unknown run log URL {redact_url(url)}: use {_FORMS}")
