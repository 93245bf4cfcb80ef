"""What a run needs from its engine (:class:`RunDeps`) and what it gathers (:class:`RunState`).

Their own module so that :class:`~streamengine._engine.rounds.RoundRunner`
takes plain data, never the engine: a run can be built and tested without a
:class:`~streamengine._engine.run.StreamingEngine`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from .._calls.failover import ModelFailover
from .._cancel import CancelToken
from .._config import EngineConfig
from .._messages import Message, ToolCall, ToolResult, Usage
from ..tools import ToolExecutor, ToolRegistry
from .events import Event
from .result import Telemetry


@dataclass(frozen=True)
class RunDeps:
    """What a run needs from the engine that started it, and nothing more.

    Shared by every run of one engine; each field is safe to use from many
    runs at once.  ``filing`` (a :class:`~.filing.FilingQueue`; None without a
    store: no filing, no filing wait) files successful results off the tool
    workers; ``run_tools(scope)`` gives the tools bound to one run's RAG scope
    (``rag_search``).  ``approve`` is asked before a side-effect tool runs.
    """

    config: EngineConfig
    registry: ToolRegistry
    executor: ToolExecutor
    failover: ModelFailover
    log: Any
    filing: Any = None
    run_tools: Optional[Callable[[str], Dict[str, Any]]] = None
    approve: Optional[Callable[[ToolCall], object]] = None


@dataclass
class RunState:
    """What one run has gathered so far; owned by the thread that drives the run.

    ``emit`` puts an event from any thread; ``emit_here`` (when given) only
    from the thread that drives the run, which needs no wake-up: a token
    costs a deque append.
    """

    conversation: List[Message]
    cancel: CancelToken
    emit: Callable[[Event], None]
    started: float
    scope: str = ""  # the RAG scope this run files into and searches: its conversation, or itself
    telemetry: Telemetry = field(default_factory=Telemetry)
    rounds: List[str] = field(default_factory=list)
    results: List[ToolResult] = field(default_factory=list)
    usage: Optional[Usage] = None  # None until the provider reports usage
    answer: Optional[str] = None
    error: Optional[str] = None
    refusal: Optional[str] = None
    done: bool = False
    emit_here: Optional[Callable[[Event], None]] = None  # None: ``emit`` serves the driving thread too
    trace: Any = None  # the run's OpenTelemetry trace (``_otel.tracing.RunTrace``), None when not traced
