"""The histograms a run records: the GenAI conventions' own and the engine's, under ``streamengine.``.

Bucket boundaries follow the conventions' advice for durations (seconds, up
to ~80 s) and token counts (powers of four, up to ~67 M).  Each is guarded
(``guard.GuardedHistogram``): what the SDK runs inside ``record`` cannot raise
into the run.
"""
from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from . import conventions as c
from .guard import Guard, GuardedHistogram

_SECONDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
_TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]


class Instruments:
    """Made once per engine from the meter provider given (or the global one)."""

    def __init__(self, meter_provider: Any, version: str, guard: Guard) -> None:
        meter = metrics.get_meter("streamengine", version, meter_provider=meter_provider)

        def histogram(name: str, unit: str, description: str, boundaries: list) -> GuardedHistogram:
            return GuardedHistogram(_made(meter, name, unit, description, boundaries), guard)

        self.operation_duration = histogram(c.METRIC_OPERATION_DURATION, "s", "GenAI operation duration", _SECONDS)
        self.token_usage = histogram(c.METRIC_TOKEN_USAGE, "{token}", "Number of input and output tokens used",
                                     _TOKENS)
        self.time_to_first_chunk = histogram(c.METRIC_TIME_TO_FIRST_CHUNK, "s",
                                             "Time to the first meaningful chunk of a streamed response", _SECONDS)
        self.agent_duration = histogram(c.METRIC_AGENT_DURATION, "s", "Duration of one engine run", _SECONDS)
        self.tool_duration = histogram(c.METRIC_TOOL_DURATION, "s", "Duration of one tool call", _SECONDS)
        self.tool_behind_answer = histogram(
            c.METRIC_TOOL_BEHIND_ANSWER, "s",
            "Time a tool ran while the model's answer was still streaming (the time the engine saved)", _SECONDS)
        self.tool_queue_wait = histogram(c.METRIC_TOOL_QUEUE_WAIT, "s", "Time a tool call waited for a worker",
                                         _SECONDS)


def _made(meter: Any, name: str, unit: str, description: str, boundaries: list) -> Any:
    try:
        return meter.create_histogram(name, unit=unit, description=description,
                                      explicit_bucket_boundaries_advisory=boundaries)
    except TypeError:  # opentelemetry-api before 1.23 has no bucket advice
        return meter.create_histogram(name, unit=unit, description=description)
