"""Logging: loguru, silent until the application asks for it.

A library must not print into its host's logs uninvited, so the package
disables itself at import; :func:`enable_logging` is the one switch.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from loguru import logger

_sink_id: Optional[int] = None


def enable_logging(level: str = "WARNING", sink: Any = None) -> int:
    """Turn on streamengine's logs at ``level`` into ``sink`` (default stderr).

    Returns the loguru handler id.  Calling it again replaces the earlier sink
    rather than duplicating every line.
    """
    global _sink_id
    _keep_default_handler_out()
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


def _keep_default_handler_out() -> None:
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


def _format(record: Any) -> str:
    # A callable format, so that records without a bound component still render
    # and the host's global loguru config is left untouched.
    record["extra"].setdefault("component", record["name"])
    return "{time:HH:mm:ss.SSS} {level: <7} {extra[component]} | {message}\n{exception}"


def component_logger(component: str, base: Any = None) -> Any:
    """A logger bound to a component name such as ``streamengine._calls.strategies.StreamingCallStrategy``."""
    return (base or logger).bind(component=component)

