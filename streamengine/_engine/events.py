"""What ``StreamingEngine.run()`` yields to its caller, and what the web layer turns into frames.

:class:`TokenEvent`, :class:`ToolStartEvent` and friends each carry a
``name`` class attribute that is the SSE event name, typed as its ``Literal``
so that ``if event.name == "token": event.text`` narrows the :data:`Event`
union for a type checker (a class attribute, not a field: it stays out of
``dataclasses.fields``, equality, pickles and ``vars``).  Call-level hooks (a
chunk event per chunk read, observers of whole responses) are one layer
down, in :mod:`streamengine._calls.hooks`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Optional, Union

from .._messages import ToolCall

if TYPE_CHECKING:  # engine-level types live in upper layers; only hints need them
    from .._messages import ToolResult
    from .result import EngineResult


# --------------------------------------------------------------------------- engine level

@dataclass(frozen=True)
class TokenEvent:
    """Visible answer text, as it streams."""

    name: ClassVar[Literal["token"]] = "token"
    text: str


@dataclass(frozen=True)
class ToolStartEvent:
    """A tool's function was entered: its deadline counts from here (not from a wait for a worker)."""

    name: ClassVar[Literal["tool_start"]] = "tool_start"
    call: ToolCall


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool finished, failed, timed out or was skipped: sent the moment that is known.

    ``skipped`` is None for a call that ran (ok, failed or timed out), else why it
    never ran, for a program or a page to show without reading the error text
    (which a web app may redact): ``"duplicate"``, ``"not_approved"`` (a side-effect
    call nothing said yes to), ``"not_allowed"`` (not in ``allowed_tools``, or no
    such tool), ``"round_cap"``, ``"request_cap"``, ``"invalid"`` (a block or
    arguments that could not be read), ``"pool_busy"``, ``"cancelled"``,
    ``"interrupted"`` (a side-effect call a resumed run's interrupted round
    had started: not run again, it may have taken effect).

    ``call`` is the call as the model wrote it (None from an engine of your
    own): a skipped call had no ``tool_start``, yet a frontend's tool card
    still shows what was asked.
    """

    name: ClassVar[Literal["tool_result"]] = "tool_result"
    result: ToolResult
    skipped: Optional[str] = None
    call: Optional[ToolCall] = None


@dataclass(frozen=True)
class RefusalEvent:
    """The model refused (OpenAI's ``refusal``): ``text`` is what it said, sent once per round.

    Its own event, not a token: a refusal is not the answer, and a caller
    that shows only tokens would otherwise show an empty answer that
    finished normally.
    """

    name: ClassVar[Literal["refusal"]] = "refusal"
    text: str
    round: int = 1


@dataclass(frozen=True)
class ReasoningEvent:
    """What a thinking model thinks, as it streams (a summary of it on some APIs): ``text`` of round ``round``.

    Its own event, never a token: reasoning is not the answer, so a caller
    that shows only tokens shows the answer alone, and one that shows this
    too gives a person watching a sign of life while the model thinks.
    """

    name: ClassVar[Literal["reasoning"]] = "reasoning"
    text: str
    round: int = 1


@dataclass(frozen=True)
class RoundEvent:
    """A new model round began (round 1 is the first answer, 2 the first continuation)."""

    name: ClassVar[Literal["round"]] = "round"
    round: int


@dataclass(frozen=True)
class ErrorEvent:
    """Something went wrong; ``message`` says what, for a person.

    ``fatal`` is True when the run failed or stopped early because of it;
    False for a problem the run went on past (a tool block the model wrote
    that could not be read, a result that could not be filed in the store).
    """

    name: ClassVar[Literal["error"]] = "error"
    message: str
    fatal: bool = True


@dataclass(frozen=True)
class ResetEvent:
    """Discard the text (and reasoning) of round ``round`` shown so far: it is streamed again on another model.

    Sent with ``EngineConfig(failover_after_tokens=True)``, when a model
    failed mid-answer and another model is left, and whenever a model that
    had only shown reasoning failed and the round is asked again (a retry or
    another model); ``reason`` says which failed.  A run resumed from a
    :class:`~streamengine.Checkpoint` starts with one for the round that was
    interrupted (no second ``round`` event: the round goes on, asked again).
    """

    name: ClassVar[Literal["reset"]] = "reset"
    round: int
    reason: str


@dataclass(frozen=True)
class DoneEvent:
    """The run ended; ``result`` holds the answer and telemetry."""

    name: ClassVar[Literal["done"]] = "done"
    result: EngineResult


@dataclass(frozen=True)
class HeartbeatEvent:
    """Nothing happened for a while; only sent when the caller asked for heartbeats.

    SSE renders it as the comment ``: ping`` so proxies and WSGI servers
    notice a gone client.
    """

    name: ClassVar[Literal["heartbeat"]] = "heartbeat"


Event = Union[TokenEvent, ReasoningEvent, ToolStartEvent, ToolResultEvent, RoundEvent, RefusalEvent, ResetEvent,
              ErrorEvent, DoneEvent, HeartbeatEvent]

