"""Logging: loguru, silent until the application asks for it, and imported when first needed.

A library must not print into its host's logs uninvited, so the package
disables itself the moment loguru is first touched; :func:`enable_logging`
is the one switch.  Loguru costs ~50 ms to import, so a module asks for a
:func:`component_logger` at import time and gets a stand-in that imports
loguru on its first log call (most runs never log anything).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

_sink_id: Optional[int] = None
_logger: Any = None
_first_use = threading.Lock()


def loguru_logger() -> Any:
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


def _host_decided(logger: Any) -> bool:
    """Whether the application already enabled or disabled ``streamengine`` in loguru itself.

    Loguru's documented way for an application to hear a library is
    ``logger.enable("streamengine")``; one that did so before our first log
    line must not be overridden by our lazy default.  Loguru keeps these
    choices in its core's activation list (read defensively: it is not API).
    """
    activations = getattr(getattr(logger, "_core", None), "activation_list", None) or ()
    return any(str(name).startswith("streamengine") for name, _ in activations)


def enable_logging(level: str = "WARNING", sink: Any = None) -> int:
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


def _keep_default_handler_out(logger: Any) -> None:
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
    """A logger bound to a component name such as ``streamengine.calls.StreamingCallStrategy``.

    ``base`` (a logger the application passed in) is bound at once; without
    one, the stand-in binds loguru's logger on first use.
    """
    if base is not None:
        loguru_logger()  # streamengine stays disabled in loguru until enable_logging()
        return base.bind(component=component)
    return _LazyLogger(component)


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

