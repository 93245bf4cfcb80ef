"""What a run hands back: the answer, each round's text, tool results, telemetry."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .._messages import ToolResult, Usage


@dataclass
class Telemetry:
    """What happened in one run; counters a dashboard or a test can read.

    The one counter record of a run: the dispatcher's gates count into it as
    they decide (``tools_started``, ``dedup_skipped``, ``cap_skipped``,
    ``disallowed``, ``parse_errors``, ``refused``), tool outcomes and filing
    errors are counted as they happen.  Every call that reached the pool
    ends as exactly one of ``tools_ok``, ``tools_failed`` (a busy refusal
    and a cancel included) or ``tools_timed_out``.
    """

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
    max_queue_wait_s: float = 0.0  # the longest any call of the run waited for a free worker
    failovers: int = 0
    model_used: Optional[str] = None
    time_to_first_token_s: Optional[float] = None
    total_s: float = 0.0
    #: Why the run stopped early, or None for a normal answer: ``cancelled``,
    #: ``llm_error``, ``llm_error_after_tokens``, ``max_continuations_reached``,
    #: ``internal_error``.
    stop_reason: Optional[str] = None
    #: Each model round's finish reason, in order (``stop``, ``tool_calls``, ``length``,
    #: ``content_filter``; None when the provider sent none).  ``length`` or
    #: ``content_filter`` means that round's answer was cut off.
    finish_reasons: List[Optional[str]] = field(default_factory=list)
    #: Each model attempt that failed, in order, as ``"MODEL: ErrorType: message"`` (one line, at most
    #: :data:`MAX_FAILURE_CHARS`; the message is the client's, which never shows a secret).
    failed_attempts: List[str] = field(default_factory=list)


#: How much of one failed attempt ``Telemetry.failed_attempts`` keeps.
MAX_FAILURE_CHARS = 300


def attempt_failure(model: str, exc: BaseException) -> str:
    """One line saying which model failed and why, for ``Telemetry.failed_attempts``."""
    message = " ".join(str(exc).split())
    line = f"{model}: {type(exc).__name__}: {message}" if message else f"{model}: {type(exc).__name__}"
    return line if len(line) <= MAX_FAILURE_CHARS else line[:MAX_FAILURE_CHARS - 1] + "…"


@dataclass(frozen=True)
class EngineResult:
    """The outcome of a run. ``answer`` is the revised answer of the last round.

    ``usage`` adds up the token counts of every model call, or is None when
    the provider reported none (zeros would claim a free answer).
    ``refusal`` is what the model said when it refused (OpenAI's
    ``refusal``), None when it did not: apart from ``answer``, so an empty
    answer is never mistaken for a finished one.  ``reasoning`` is what a
    thinking model thought in the last round (None without any), as
    ``answer`` is that round's text; ``reasoning_rounds`` holds each round's
    (``""`` for a round without), beside ``rounds``.  Neither is ever part of
    ``answer``.
    """

    answer: str
    rounds: Tuple[str, ...]
    tool_results: Tuple[ToolResult, ...]
    telemetry: Telemetry
    usage: Optional[Usage] = None
    error: Optional[str] = None
    refusal: Optional[str] = None
    reasoning_rounds: Tuple[str, ...] = ()

    @property
    def reasoning(self) -> Optional[str]:
        """The last round's reasoning, None when it had none."""
        return self.reasoning_rounds[-1] or None if self.reasoning_rounds else None

    @property
    def finish_reasons(self) -> Tuple[Optional[str], ...]:
        """Each model round's finish reason (see :attr:`Telemetry.finish_reasons`)."""
        return tuple(self.telemetry.finish_reasons)

    @property
    def cut_off(self) -> Optional[str]:
        """``length`` or ``content_filter`` when the last round's answer was cut off, else None."""
        reasons = self.telemetry.finish_reasons
        return reasons[-1] if reasons and reasons[-1] in CUT_OFF_FINISH_REASONS else None


#: Finish reasons that mean the answer was cut off, not finished.
CUT_OFF_FINISH_REASONS = frozenset({"length", "content_filter"})
