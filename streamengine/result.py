"""What a run hands back: the answer, each round's text, tool results, telemetry."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from .messages import Usage
from .messages import ToolResult


@dataclass
class Telemetry:
    """What happened in one run; counters a dashboard or a test can read."""

    rounds: int = 0
    tools_started: int = 0
    tools_ok: int = 0
    tools_failed: int = 0
    tools_timed_out: int = 0
    dedup_skipped: int = 0
    cap_skipped: int = 0
    disallowed: int = 0
    refused: int = 0
    parse_errors: int = 0
    filing_errors: int = 0
    failovers: int = 0
    model_used: Optional[str] = None
    time_to_first_token_s: Optional[float] = None
    total_s: float = 0.0
    fallback_reason: Optional[str] = None


@dataclass(frozen=True)
class EngineResult:
    """The outcome of a run. ``answer`` is the revised answer of the last round."""

    answer: str
    rounds: Tuple[str, ...]
    tool_results: Tuple[ToolResult, ...]
    telemetry: Telemetry
    usage: Usage = field(default_factory=Usage)
    error: Optional[str] = None
