"""OpenTelemetry GenAI spans and metrics for runs, when ``opentelemetry-api`` is installed.

``instrumentation(...)`` is the one entry: ``None`` when the API is not
installed, so an engine without it imports nothing and checks one ``None``
per hook.  With the API but no SDK configured a run builds no spans
(``Instrumentation.live``); with a caller's span to pass on they are non-recording and
the hooks skip building attributes.  ``pip install 'streamengine[otel]'``.
"""
from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from .tracing import Instrumentation


def available() -> bool:
    """Whether ``opentelemetry-api`` can be imported (looked up without importing it)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):
        return False


def instrumentation(*, agent_name: str, capture_content: Optional[bool],
                    tracer_provider: Optional[TracerProvider] = None, meter_provider: Optional[MeterProvider] = None,
                    client: object = None) -> Optional[Instrumentation]:
    """The engine's :class:`~streamengine._otel.tracing.Instrumentation`, or ``None`` without the API."""
    if tracer_provider is None and meter_provider is None and not available():
        return None
    from .. import __version__
    from .tracing import Capture, Instrumentation
    return Instrumentation(agent_name=agent_name, capture=Capture.resolve(capture_content),
                           tracer_provider=tracer_provider, meter_provider=meter_provider, version=__version__,
                           client=client)
