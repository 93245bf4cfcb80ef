"""The built-in demo: a scripted model calls two slow tools mid-answer; the timing proves the overlap.

``streamengine demo`` needs no key and no network.  A :class:`FakeProvider`
on loopback plays a model that writes a trip plan over ~2.5 s and, early in
that answer, writes two inline ``<tool>`` blocks; two demo tools sleep ~1 s
each (through ``ToolContext.sleep``, so a cancelled run stops them at once)
and return data; the continuation round gives the revised answer.

The summary is built only from numbers measured in the run: the provider
stamps the moment it wrote the last byte of round 1 (a ``signal`` step), the
tools' ``ToolResult.started_at``/``ended_at`` are ``time.monotonic()``
values, and the total is when ``DoneEvent`` arrived.  "If tools waited for
the stream's end" is then arithmetic on those numbers, not a second run:
the tool phase would have ended at *stream end + longest tool* (in
parallel) or *stream end + sum of tools* (one by one) instead of when it
really did, and everything after it shifts by the difference.

``--fast`` scales every delay by 0.1 (the tests use it), but the pauses right
after the tool blocks (see :func:`_script`).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .._clients.openai import OpenAICompatibleClient
from .._config import EngineConfig
from .._engine.events import DoneEvent, Event, RoundEvent, ToolStartEvent
from .._engine.result import EngineResult
from .._engine.run import StreamingEngine
from .._errors import ToolError
from .._messages import MessageLike, StopReason
from ..testing import FakeProvider, Stamp, Step
from ..testing import steps as s
from ..tools import Tool, ToolContext, tool

DEMO_MODEL = "demo-model"
DEMO_QUESTION = "Plan a weekend in Lisbon for me: what's the weather, and is there a flight from Berlin?"
FAST_SCALE = 0.1
TOOL_SECONDS = 1.0

# Round 1, as (text, pause after it in seconds at scale 1).  The two blocks come
# early so the tools have the rest of the answer (~2 s) to run in.
_ROUND_1: Tuple[Tuple[str, float], ...] = (
    ("Planning your Lisbon weekend. ", 0.10),
    ("First the weather ", 0.05),
    ('<tool name="get_weather">{"city": "Lisbon"}</tool>', 0.15),
    (" and the flights from Berlin ", 0.05),
    ('<tool name="search_flights">{"origin": "BER", "destination": "LIS"}</tool>', 0.20),
    (". While those run, a sketch of the three days:\n", 0.25),
    ("- Friday evening: Alfama, ", 0.20),
    ("the old quarter, with dinner near the Miradouro de Santa Luzia.\n", 0.25),
    ("- Saturday: Belem ", 0.20),
    ("(the tower, the monastery, and pasteis de nata), ", 0.25),
    ("then sunset at LX Factory.\n", 0.25),
    ("- Sunday: a day trip to Sintra ", 0.20),
    ("by train from Rossio, 40 minutes.\n", 0.20),
    ("I'll adjust this once the tools answer.", 0.0),
)

# Round 2: the revised answer, written with what the tools returned.
_ROUND_2: Tuple[Tuple[str, float], ...] = (
    ("Here is your Lisbon weekend. ", 0.08),
    ("Weather: 24 C and sunny on Saturday, 22 C with a light wind on Sunday, ", 0.08),
    ("so keep Belem for Saturday and take a jacket to Sintra. ", 0.08),
    ("Flight: TP 537 leaves Berlin (BER) on Friday at 18:05 and lands in Lisbon at 20:40, ", 0.08),
    ("from EUR 129, in time for a late dinner in Alfama. ", 0.08),
    ("Enjoy the trip!", 0.0),
)


def demo_tools(scale: float = 1.0) -> List[Tool]:
    """The two slow demo tools; each sleeps ``TOOL_SECONDS * scale`` and returns data."""
    seconds = TOOL_SECONDS * scale

    @tool
    def get_weather(city: str, ctx: ToolContext) -> Dict[str, Any]:
        """Current weather and the weekend forecast for a city."""
        if not ctx.sleep(seconds):
            raise ToolError("cancelled")
        return {"city": city, "saturday": "24 C, sunny", "sunday": "22 C, light wind"}

    @tool
    def search_flights(origin: str, destination: str, ctx: ToolContext) -> Dict[str, Any]:
        """Direct flights between two airports (IATA codes) on Friday."""
        if not ctx.sleep(seconds):
            raise ToolError("cancelled")
        return {"flights": [{"flight": "TP 537", "from": origin, "to": destination, "departs": "Fri 18:05",
                             "arrives": "20:40", "price_eur": 129}]}

    return [get_weather, search_flights]


def _script(parts: Sequence[Tuple[str, float]], scale: float) -> List[Step]:
    """The provider's steps; a pause right after a tool block is not scaled.

    A tool starts on a fresh worker thread: even ``--fast`` leaves it the
    time of a real stream to do so before the next words, so the demo shows
    what it says (tools start mid-stream) on a loaded machine too.
    """
    out: List[Step] = []
    for text, pause in parts:
        out.append(s.text(text))
        if pause:
            out.append(s.delay(pause if text.startswith("<tool") else pause * scale))
    return out


def demo_turns(scale: float = 1.0, round1_end: Optional[threading.Event] = None) -> Tuple[List[Step], List[Step]]:
    """The two provider turns; ``round1_end`` is set when the provider wrote round 1's last byte."""
    first = _script(_ROUND_1, scale) + [s.finish(StopReason.STOP), s.usage(120, 160), s.done()]
    if round1_end is not None:
        first.append(s.signal(round1_end))
    second = _script(_ROUND_2, scale) + [s.finish(StopReason.STOP), s.usage(300, 90), s.done()]
    return first, second


def _config() -> EngineConfig:
    return EngineConfig(models=[DEMO_MODEL], idle_timeout=10.0, completion_timeout=30.0, tool_timeout=10.0)


# --------------------------------------------------------------------------- measuring a run

@dataclass(frozen=True)
class ToolTiming:
    """One tool's run, in seconds since the request was sent."""

    name: str
    started: float
    ended: float
    ok: bool
    error: Optional[str] = None

    @property
    def duration(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class DemoReport:
    """What ``format_summary`` needs; every number measured in the run (offsets from the request)."""

    stream_end: float
    total: float
    tools: Tuple[ToolTiming, ...]
    round2_start: Optional[float] = None
    result: Optional[EngineResult] = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.error is None and len(self.tools) == 2

    @property
    def longest_tool(self) -> float:
        return max((t.duration for t in self.tools), default=0.0)

    @property
    def tools_sum(self) -> float:
        return sum(t.duration for t in self.tools)

    @property
    def tool_phase_end(self) -> float:
        """When round 1 was really ready to continue: the later of stream end and last tool end."""
        return max([self.stream_end] + [t.ended for t in self.tools])

    def saved(self, sequential: bool) -> float:
        """How much later the answer would end if the tools had waited for the stream's end."""
        waited = self.stream_end + (self.tools_sum if sequential else self.longest_tool)
        return waited - self.tool_phase_end


def run_demo(*, fast: bool = False, on_event: Optional[Callable[[Event, float], None]] = None,
             question: str = DEMO_QUESTION) -> DemoReport:
    """Run the scripted conversation once; ``on_event(event, seconds_since_request)`` sees each event."""
    scale = FAST_SCALE if fast else 1.0
    round1_end = Stamp()
    with FakeProvider() as fp:
        for turn in demo_turns(scale, round1_end):
            fp.add_turn(*turn)
        client = OpenAICompatibleClient(fp.base_url)
        try:
            with StreamingEngine(client, demo_tools(scale), _config()) as engine:
                return _measure(engine.run([{"role": "user", "content": question}]), round1_end, on_event)
        finally:
            client.close()


def _measure(events: Iterator[Event], round1_end: Stamp,
             on_event: Optional[Callable[[Event, float], None]]) -> DemoReport:
    t0 = time.monotonic()  # the run starts its request on the first next()
    result: Optional[EngineResult] = None
    round2_start: Optional[float] = None
    total = 0.0
    started_ids = set()
    for event in events:
        if isinstance(event, ToolStartEvent):
            started_ids.add(event.call.id)
        now = time.monotonic() - t0
        if isinstance(event, RoundEvent) and event.round == 2:
            round2_start = now
        if isinstance(event, DoneEvent):
            result, total = event.result, now
        if on_event is not None:
            on_event(event, now)
    stream_end = (round1_end.at - t0) if round1_end.at is not None else total
    tools = tuple(
        ToolTiming(r.name, r.started_at - t0, r.ended_at - t0, r.ok, r.error)
        for r in (result.tool_results if result is not None else ())
        if r.call_id in started_ids  # skipped calls have results too, but never started
    )
    return DemoReport(stream_end=stream_end, total=total, tools=tools, round2_start=round2_start, result=result)


# --------------------------------------------------------------------------- the summary

def format_summary(report: DemoReport) -> str:
    """The timing table; ``+s`` are seconds since the request was sent."""
    lines = ["Timing, measured in this run (+s = seconds since the request was sent):",
             f"  {'model stream, round 1':<28} +0.00 .. +{report.stream_end:.2f}"]
    for t in report.tools:
        lead = report.stream_end - t.started
        when = f"started {lead:.2f}s before the stream ended" if lead > 0 else \
            f"started {-lead:.2f}s after the stream ended"
        status = "" if t.ok else f"  FAILED: {t.error}"
        lines.append(f"  {'tool ' + t.name:<28} +{t.started:.2f} .. +{t.ended:.2f}  {t.duration:.2f}s, {when}{status}")
    if report.round2_start is not None:
        lines.append(f"  {'model stream, round 2':<28} +{report.round2_start:.2f} .. +{report.total:.2f}")
    telemetry = report.result.telemetry if report.result is not None else None
    engine_says = f"  (engine telemetry: total_s {telemetry.total_s:.2f})" if telemetry is not None else ""
    lines.append(f"  {'total':<28} {report.total:.2f}s{engine_says}")
    if not report.tools:
        lines.append("No tool ran, so there is nothing to compare.")
        return "\n".join(lines)
    lines += ["", "The same work if the tools had waited for the stream's end (arithmetic on the numbers above):"]
    ways = (("in parallel after the stream", False, report.longest_tool, "longest tool"),
            ("one by one after the stream", True, report.tools_sum, "sum of tools"))
    for label, sequential, amount, what in ways:
        saved = report.saved(sequential)
        lines.append(f"  {label:<30} {report.stream_end:.2f} + {amount:.2f} ({what}) -> total "
                     f"{report.total + saved:.2f}s, overlap saved {saved:.2f}s")
    lines += ["", _verdict(report)]
    return "\n".join(lines)


def _verdict(report: DemoReport) -> str:
    early = [t for t in report.tools if t.started < report.stream_end]
    hidden = sum(max(0.0, min(t.ended, report.stream_end) - t.started) for t in early)
    if len(early) == len(report.tools):
        who = "Both tools" if len(early) == 2 else f"All {len(early)} tools"
        return (f"{who} started while the model was still writing: {hidden:.2f}s of tool time "
                "ran behind the answer instead of after it.")
    return (f"{len(early)} of {len(report.tools)} tools started before the stream ended "
            f"({hidden:.2f}s of tool time ran behind the answer); the machine may be busy.")


# --------------------------------------------------------------------------- the web demo

class DemoEngine:
    """What the WSGI app needs from an engine (``run``), replaying the demo for every request.

    Each run gets its own ``FakeProvider`` and engine: turns are consumed in
    order, so two browser tabs sharing one provider would take each other's
    rounds.  The scripted model gives the same answer whatever is asked.
    """

    def __init__(self, fast: bool = False) -> None:
        self.scale = FAST_SCALE if fast else 1.0

    def run(self, messages: Sequence[MessageLike], cancel: Optional[threading.Event] = None, *,
            heartbeat_s: Optional[float] = None) -> Iterator[Event]:
        return self._events(list(messages), cancel, heartbeat_s)

    def _events(self, messages: List[MessageLike], cancel: Optional[threading.Event],
                heartbeat_s: Optional[float]) -> Iterator[Event]:
        with FakeProvider() as fp:
            for turn in demo_turns(self.scale):
                fp.add_turn(*turn)
            client = OpenAICompatibleClient(fp.base_url)
            try:
                with StreamingEngine(client, demo_tools(self.scale), _config()) as engine:
                    yield from engine.run(messages, cancel, heartbeat_s=heartbeat_s)
            finally:
                client.close()

    def close(self) -> None:
        """Nothing shared to release: each run cleans up after itself."""
