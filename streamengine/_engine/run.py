"""The streaming engine: answers stream to the caller while their tools already run.

Thread layout of one run (docs/ARCHITECTURE.md has the whole picture)::

    caller's thread   iterates run(): the run is a generator (RoundRunner.run) driven right here;
                      reads the provider's socket, parses, dispatches, yields events; waits on
                      one selector (loop.RunLoop): the socket + a wake-up pipe, until the nearest
                      deadline (idle, cap, tool, heartbeat)
    tool threads      the engine's ToolExecutor: tool_start / tool_result put from there, waking the wait
    reader thread     only with run(..., read_ahead=True): drives the same generator into a bounded
                      EventChannel, for consumers that are slow on purpose (speech, a GUI)

A slow consumer delays reading the provider by at most what the kernel's
socket buffers hold; a token costs one wake-up.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import queue
import sys
import threading
import time
from typing import Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .. import _validation as validation
from .._calls.failover import ErrorClassifier, ModelFailover
from .._calls.hooks import EventEmitter
from .._calls.strategies import make_call_strategy
from .._cancel import CancelToken, on_cancel
from .._clients.base import LlmClient
from .._config import EngineConfig, completion_options
from .._errors import ConfigError, RunFailedError
from .._logs import component_logger
from .._messages import LLM_WARNING, CompletionOptions, Message, MessageLike, ToolCall, as_messages
from .._otel import instrumentation
from ..tools import Tool, ToolExecutor, ToolRegistry
from .checkpoint import Checkpoint
from .events import DoneEvent, Event
from .filing import FilingQueue, run_scope
from .loop import HEARTBEAT, Heartbeat, RunLoop
from .result import EngineResult
from .rounds import RoundRunner, RunDeps, RunState
from .tool_calls import Approve

#: How long a read-ahead consumer waits for its reader thread to end after the run.
_READER_JOIN_S = 5.0
#: Stop reasons of a run that produced no answer: ``complete()`` raises for them.
_NOTHING_PRODUCED = frozenset({"llm_error", "internal_error", "output_limit"})
#: How a run starts: from a checkpoint or not, and who gets its checkpoints.
Plan = Tuple[Optional[Checkpoint], Optional[Callable[[Checkpoint], None]]]


def _produced_nothing(result: EngineResult) -> bool:
    """The run failed and no round has text but the engine's warning: there is no answer at all."""
    return (result.error is not None and result.telemetry.stop_reason in _NOTHING_PRODUCED
            and not any(text and not text.startswith(LLM_WARNING) for text in result.rounds))


class Run:
    """One run: iterate it for its events, or read them in lists with :meth:`batches`, not both.

    The run happens in the thread that iterates it.  :meth:`close` (or
    leaving a loop early, or dropping the last reference) cancels it: the
    provider's stream is shut, the tools are cancelled, ``done`` is not sent.
    """

    __slots__ = ("_batches", "_beat", "_events")

    def __init__(self, batches: Generator[List[Event], None, None], beat: Optional[Heartbeat] = None) -> None:
        self._batches = batches
        self._beat = beat
        self._events: Optional[Generator[Event, None, None]] = None

    def __iter__(self) -> Iterator[Event]:
        if self._events is None:
            self._events = _flattened(self._batches)
        return self._events

    def __next__(self) -> Event:
        return next(iter(self))

    def batches(self) -> Iterator[List[Event]]:
        """The events in lists, each what was ready before the run would wait: send each one at once.

        For a consumer that batches its output (the WSGI stream writes a list's
        frames in one socket write): no event ever waits for the model's next token.
        """
        if self._events is not None:
            raise ConfigError("this run is being read event by event already; call batches() before iterating")
        return self._batches

    def set_heartbeat(self, heartbeat_s: Optional[float]) -> None:
        """From now on, a ``HeartbeatEvent`` after ``heartbeat_s`` of silence (None: none); from the driving thread.

        For a consumer that needs waking only at times (the web layer's run-log
        producer, while tokens wait to be appended), so a quiet run wakes no
        more often than it must.  A ``read_ahead=True`` run keeps its own.
        """
        seconds = validation.seconds(heartbeat_s, "heartbeat_s", allow_none=True)
        if self._beat is not None:
            self._beat.set(seconds)

    def close(self) -> None:
        """Stop the run now (from the thread that iterates it); the same as leaving its loop early."""
        if self._events is not None:
            self._events.close()
        self._batches.close()


def _flattened(batches: Generator[List[Event], None, None]) -> Generator[Event, None, None]:
    try:
        for batch in batches:
            yield from batch
    finally:
        batches.close()


class StreamingEngine:
    """Runs conversations round by round; one engine serves many runs, from many threads.

    The engine owns a tool pool shared by its runs; ``close()`` (or leaving a
    ``with`` block) stops it.

    Seams, each built by default when not given: ``classifier`` (an
    :class:`ErrorClassifier`) decides which provider errors fail over, retry
    or stop; ``emitter`` (an :class:`EventEmitter`, also ``engine.emitter``)
    gets a :class:`ModelChunkEvent` for every chunk read from the model, the
    last one with ``is_final`` and the whole response; ``observers`` hear
    ``on_llm_responded(response)`` once per successful model call.

    ``executor`` (any ``concurrent.futures.Executor``: a
    ``ProcessPoolExecutor``, ``distributed.Client(...).get_executor()``)
    runs the tools declared ``@tool(executor="remote")``; the others run on
    the engine's own threads.  The engine never shuts it down.

    OpenTelemetry (when ``opentelemetry-api`` is installed; docs/observability.md):
    each run is an ``invoke_agent {agent_name}`` span with ``chat`` and
    ``execute_tool`` spans under it, on ``tracer_provider``/``meter_provider``
    or the global ones; ``capture_content=True`` records prompts, answers and
    tool arguments and results (off by default; the environment's
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` otherwise).

    ``approve(call) -> bool`` is asked, on a thread of its own once the round's
    stream ended, before each tool marked ``side_effects=True`` (an MCP tool
    not marked read-only) runs; only ``True`` lets it run.  Without it (here or
    per run) such calls are refused.  A refusal, a hook that raised, or no
    answer within ``EngineConfig.approval_timeout`` becomes an error result the
    model reads; a cancel of the run skips the calls still waiting.
    """

    def __init__(self, client: LlmClient, tools: Iterable[Any] = (), config: Optional[EngineConfig] = None,
                 *, rag: Any = None, observers: Sequence[Any] = (), logger: Any = None,
                 classifier: Optional[ErrorClassifier] = None, emitter: Optional[EventEmitter] = None,
                 approve: Optional[Callable[[ToolCall], object]] = None,
                 executor: Optional[concurrent.futures.Executor] = None, agent_name: str = "streamengine",
                 capture_content: Optional[bool] = None, tracer_provider: Any = None,
                 meter_provider: Any = None) -> None:
        if not isinstance(client, LlmClient):
            raise ConfigError(f"StreamingEngine needs an LlmClient (e.g. OpenAICompatibleClient(base_url)), "
                              f"got {type(client).__name__}")
        self.config = config if config is not None else EngineConfig.from_env()
        if not isinstance(self.config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {type(self.config).__name__}")
        self.client = client
        approve = checked_approve(approve, "StreamingEngine(approve=...)")
        self.registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.rag = rag
        self._registered_search = register_rag_search(self.registry, rag) if rag is not None else None
        self._log = component_logger("streamengine._engine.run.StreamingEngine", logger)
        if approve is None:
            warn_unapproved(self.registry, self._log)
        self.emitter = emitter if emitter is not None else EventEmitter()
        strategy = make_call_strategy(client, idle_timeout=self.config.idle_timeout,
                                      completion_timeout=self.config.completion_timeout,
                                      observers=observers, emitter=self.emitter, logger=logger,
                                      output_limits=self.config.output_limits)
        # A client built with the SDK's max_retries= keeps its say over the retries of a rate limit.
        retries = getattr(client, "max_retries", None)
        max_retries = self.config.max_retries if retries is None else retries

        def failover_for(models: Sequence[str]) -> ModelFailover:
            return ModelFailover(strategy, list(models), classifier=classifier, logger=logger,
                                 max_retries=max_retries)
        self._failover_for = failover_for
        failover = self._failover_for(self.config.models)
        # Public for operators: ``engine.executor.stuck_workers()`` shows tools that ignore cancels.
        # One pool for every run of this engine, shared fairly: a run never holds more
        # workers than its per-round cap, and waiting calls are served run by run.
        self.executor = ToolExecutor(max_workers=self.config.pool_size, logger=logger,
                                     queue_timeout=self.config.tool_queue_timeout,
                                     max_per_owner=max(1, self.config.max_tools_per_round), remote=executor)
        self.filing = (FilingQueue(rag, self.config, self._log, self.config.max_filing_bytes) if rag is not None
                       else None)
        if capture_content is not None and not isinstance(capture_content, bool):
            raise ConfigError(f"capture_content must be True, False or None (the environment decides), "
                              f"got {capture_content!r}")
        self._otel = instrumentation(agent_name=validation.name(agent_name, "agent_name"),
                                     capture_content=capture_content, tracer_provider=tracer_provider,
                                     meter_provider=meter_provider, client=client)
        self._deps = RunDeps(config=self.config, registry=self.registry, executor=self.executor,
                             failover=failover, log=self._log, filing=self.filing,
                             run_tools=self._scoped_tools if rag is not None else None, approve=approve)
        self._closed = False

    @property
    def approve(self) -> Optional[Callable[[ToolCall], object]]:
        """The engine's ``approve`` hook (None: side-effect calls are refused unless a run brings its own)."""
        return self._deps.approve

    def _scoped_tools(self, scope: str) -> Dict[str, Tool]:
        return scoped_tools(self.registry, self._registered_search, self.rag, scope)

    # --- public API --------------------------------------------------------------
    def run(self, messages: Union[Sequence[MessageLike], Checkpoint], cancel: Optional[threading.Event] = None, *,
            heartbeat_s: Optional[float] = None, model: Optional[str] = None,
            options: Any = None, conversation_id: Optional[str] = None, read_ahead: bool = False,
            approve: Optional[Callable[[ToolCall], object]] = None,
            on_checkpoint: Optional[Callable[[Checkpoint], None]] = None) -> Run:
        """Start a run: iterate the :class:`Run` for its events as they happen; ``DoneEvent`` is always last.

        The run happens in the thread that iterates it.  Stopping iteration
        early (``break``, ``close()``, garbage collection) or setting
        ``cancel`` shuts the provider stream down, cancels the tools and ends
        every thread the run started.  With ``heartbeat_s``, a
        ``HeartbeatEvent`` is yielded whenever nothing happened for that long.
        ``model`` (one model, no failover) and ``options`` (a CompletionOptions
        or a dict, set fields on top of the engine's) hold for this run only.

        ``conversation_id`` is the run's RAG scope: ``rag_search`` finds what
        runs with the same id filed, and nothing else.  Without one the run
        is its own scope.  Runs of one user, or one tenant, share a store's
        filings only by passing the same id (the application chooses it,
        never the browser).

        ``read_ahead=True`` is for a consumer that is slow on purpose (it
        speaks each sentence, or paints a GUI): a reader thread then drives
        the run into a bounded queue, so the provider is read and tools start
        while the consumer is busy.  The default reads only as fast as the
        consumer takes events (up to what the socket buffers hold).

        ``approve(call) -> bool`` replaces the engine's ``approve`` for this run
        (e.g. asking the person of this request): only ``True`` lets a
        side-effect call run.

        ``on_checkpoint(checkpoint)`` is called, on the thread that drives the
        run, before the first round and after each round whose tool results
        are all in, with a :class:`~._engine.checkpoint.Checkpoint` (JSON with
        ``to_json()``), once the events before it were handed out.  Passing a
        ``Checkpoint`` as ``messages`` goes on from it, on any engine with the
        same configuration: the run starts with a ``ResetEvent`` for the round
        that was interrupted and counts rounds, usage and limits on
        (``_engine/checkpoint.py`` says what is and is not the same as an
        uninterrupted run).

        The arguments are checked here, before the first event: a
        :class:`ConfigError` is raised by this call, not by the iteration.
        """
        if self._closed:
            raise ConfigError("this StreamingEngine is closed; create a new one")
        heartbeat_s = validation.seconds(heartbeat_s, "heartbeat_s", allow_none=True)
        if not isinstance(read_ahead, bool):
            raise ConfigError(f"read_ahead must be True or False, got {read_ahead!r}")
        # A run's own scope is a fresh uuid: only worth making when a store can use it.
        resume = messages if isinstance(messages, Checkpoint) else None
        if on_checkpoint is not None and not callable(on_checkpoint):
            raise ConfigError(f"on_checkpoint must be a callable taking a Checkpoint, got "
                              f"{type(on_checkpoint).__name__}")
        scope = run_scope(conversation_id) if conversation_id is not None or self.rag is not None else ""
        if resume is not None and conversation_id is None and resume.scope:
            scope = resume.scope  # the run files into and searches the scope it had
        conversation = list(resume.messages) if resume is not None else as_messages(messages)  # type: ignore[arg-type]
        if not conversation:
            raise ConfigError("messages is empty; pass at least one message, e.g. "
                              "[{'role': 'user', 'content': 'hi'}]")
        deps = self._deps_for(model, options, checked_approve(approve, "run(approve=...)"))
        if resume is not None and resume.round > deps.config.max_continuations:
            raise ConfigError(f"this checkpoint is after round {resume.round}, and this engine stops after round "
                              f"{deps.config.max_continuations + 1} (max_continuations="
                              f"{deps.config.max_continuations}); resume it on an engine with the same configuration")
        self._check_parts(conversation, deps.config.models)
        # The run's span is a child of the context current *here*, whichever thread then drives the run.
        otel = self._otel
        parent = otel.current_context() if otel is not None else None
        trace = functools.partial(otel.start_run, parent=parent, conversation_id=conversation_id,
                                  messages=conversation) if otel is not None and otel.live(parent) else None
        plan = (resume, on_checkpoint)
        if read_ahead:
            return Run(self._read_ahead(conversation, cancel, heartbeat_s, deps, scope, trace, plan))
        beat = Heartbeat(heartbeat_s)
        return Run(self._batches(conversation, cancel, beat, deps, scope, trace, plan), beat)

    def _check_parts(self, conversation: List[Message], models: Sequence[str]) -> None:
        """Images, audio and files checked against the API of every model the run may fail over to, before
        the first request: a part one of them cannot carry is a :class:`ConfigError` now, not mid-run."""
        if any(message.has_media for message in conversation):
            for name in models:
                self.client.check_parts(conversation, name)

    def _deps_for(self, model: Optional[str], options: Any, approve: Optional[Callable[[ToolCall], object]]) -> RunDeps:
        """The engine's run dependencies, or a copy with this run's model, options and approve hook."""
        if approve is not None:
            return dataclasses.replace(self._deps_for(model, options, None), approve=approve)
        if model is None and options is None:
            return self._deps
        extra = completion_options(options, "run(options=...)")
        base = completion_options(self.config.options, "EngineConfig.options") or CompletionOptions()
        models = (validation.name(model, "run(model=...)"),) if model else self.config.models
        config = dataclasses.replace(self.config, options=base.merged(extra), models=models)
        failover = self._failover_for(config.models) if model else self._deps.failover
        return dataclasses.replace(self._deps, config=config, failover=failover)

    def complete(self, messages: Sequence[MessageLike], cancel: Optional[threading.Event] = None, *,
                 model: Optional[str] = None, options: Any = None, conversation_id: Optional[str] = None,
                 raise_on_error: bool = True, approve: Optional[Callable[[ToolCall], object]] = None) -> EngineResult:
        """Run to the end and return the result (no events).

        A run that failed before producing any answer raises its error
        (:class:`RunFailedError`, an :class:`LlmError`; ``.result`` holds the
        partial result), so a script does not go on with a warning as its
        answer.  ``raise_on_error=False`` returns that result instead, with
        ``answer`` the visible ``⚠️ LLM error: ...`` and ``error`` set.
        ``model``, ``options``, ``conversation_id`` and ``approve`` are as for :meth:`run`.
        """
        # run() always ends with DoneEvent: a deque of length 1 keeps the last event.
        events = self.run(messages, cancel, model=model, options=options, conversation_id=conversation_id,
                          approve=approve)
        last = collections.deque(events, maxlen=1)
        assert last and isinstance(last[0], DoneEvent)
        result = last[0].result
        if raise_on_error and _produced_nothing(result):
            raise RunFailedError(result)
        return result

    def close(self) -> None:
        """Stop the tool pool; runs still going get their tools cancelled."""
        self._closed = True
        self.executor.shutdown(wait=True)
        if self.filing is not None:
            self.filing.close(self.config.filing_timeout)

    def __enter__(self) -> StreamingEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- one run -------------------------------------------------------------------
    def _batches(self, conversation: List[Message], cancel: Optional[threading.Event],
                 beat: Heartbeat, deps: RunDeps, scope: str,
                 trace: Optional[Callable[[], Any]] = None, plan: Plan = (None, None)
                 ) -> Generator[List[Event], None, None]:
        """The run, driven by the thread that iterates this generator (``loop.RunLoop``).

        ``plan``: the checkpoint it resumes (or None) and its ``on_checkpoint``.
        """
        # The run's own token: the caller's event cancels it, never the other way round.
        token = CancelToken()
        stop_watch = on_cancel(cancel, token.set)
        loop = beat.loop = RunLoop(token, beat.seconds)
        resume, on_checkpoint = plan
        started = time.monotonic() - (resume.elapsed_s if resume is not None else 0.0)
        state = RunState(conversation=conversation, cancel=token, emit=loop.emit, started=started,
                         emit_here=loop.outbox.append, scope=scope, trace=trace() if trace is not None else None)
        runner = RoundRunner(deps, state, resume, on_checkpoint)
        loop.tools_due = runner.calls.next_deadline
        loop.on_tools_due = runner.calls.poll_deadlines
        loop.tools_pending = runner.calls.pending
        steps = runner.run()  # ends with done, whatever happens in it
        finished = False
        try:
            yield from loop.batches(steps)
            finished = True
        finally:
            if not finished:  # left early: cancel, and let the run end itself (tools, socket, telemetry)
                token.set()
                _finish_cancelled(steps, self.config.completion_timeout)
            stop_watch()
            loop.close()
            if state.trace is not None:
                last = loop.handed
                done = last[-1] if finished and last and isinstance(last[-1], DoneEvent) else None
                state.trace.ended(done.result if done is not None else None, cancelled=not finished)

    def _read_ahead(self, conversation: List[Message], cancel: Optional[threading.Event],
                    heartbeat_s: Optional[float], deps: RunDeps, scope: str,
                    trace: Optional[Callable[[], Any]] = None, plan: Plan = (None, None)
                    ) -> Generator[List[Event], None, None]:
        """The same run, driven by a reader thread into a bounded channel (``run(read_ahead=True)``)."""
        token = CancelToken()
        stop_watch = on_cancel(cancel, token.set)
        channel = EventChannel(cancel=token)
        batches = self._batches(conversation, token, Heartbeat(None), deps, scope, trace, plan)

        def read() -> None:
            try:
                for batch in batches:
                    for event in batch:
                        channel.put(event)
            finally:
                channel.close()

        reader = threading.Thread(target=read, name="streamengine-read-ahead", daemon=True)
        reader.start()
        finished = False
        try:
            while True:
                items = channel.drain(heartbeat_s)
                if not items:
                    if channel.closed:
                        return
                    yield [HEARTBEAT]
                    continue
                yield items
                if isinstance(items[-1], DoneEvent):  # the last event a run puts
                    finished = True
                    return
        finally:
            if not finished:
                token.set()
            stop_watch()
            reader.join(timeout=max(_READER_JOIN_S, self.config.completion_timeout))


def _finish_cancelled(steps: Any, give_up_s: float) -> None:
    """Run a cancelled run's generator to its end here: every layer looks at the cancel when resumed.

    Nothing is waited for (a tool that ignores its cancel is abandoned, as on
    any cancel); a generator still going after ``give_up_s`` is closed.
    """
    give_up_at = time.monotonic() + give_up_s
    try:
        next(steps)
        while time.monotonic() < give_up_at:
            steps.send(None)
            time.sleep(0.001)  # a layer that needs a moment (a worker ending) gets it; cancel is set
    except StopIteration:
        return
    steps.close()


# --- The tools a run gets besides the registry's, and what lets a side-effect tool run. ----------------------------
# With a store (``rag=``) the engine registers its own ``rag_search`` template
# and hands each run a copy bound to the run's scope.  The application's own
# Python ``rag_search`` wins, as documented; one an MCP server offers is a
# clash refused at construction, like any other name clash: it would silently
# replace the scoped search.  A side-effect tool runs only when an ``approve``
# hook returns True; an engine that has such tools and no hook says so once,
# when it is built.

def checked_approve(approve: Any, where: str) -> Optional[Approve]:
    """``approve`` if it is a callable or None; anything else is a :class:`ConfigError` naming ``where``."""
    if approve is not None and not callable(approve):
        raise ConfigError(f"{where}: approve must be a callable taking a ToolCall and returning True to run it, "
                          f"got {type(approve).__name__}")
    checked: Optional[Approve] = approve
    return checked


def warn_unapproved(registry: ToolRegistry, log: Any) -> None:
    """Side-effect tools and nothing to approve them: said once, at construction, not per refused call."""
    unapproved = [t.name for t in registry if t.side_effects]
    if unapproved:
        log.warning("tools with side effects will not run, nothing approves them: {}; pass approve= to "
                    "StreamingEngine or run() to let them run", ", ".join(map(repr, unapproved)))


def register_rag_search(registry: ToolRegistry, rag: Any) -> Optional[Tool]:
    """Our ``rag_search`` template (its spec is what the model sees), or None if the application has its own."""
    from ..rag._base import make_rag_search_tool
    if "rag_search" in registry:
        server = _mcp_server_of(registry.get("rag_search"))
        if server is not None:
            raise ConfigError(
                f"MCP server {server!r} offers a tool named 'rag_search', which would replace the engine's own "
                f"search of rag=; rename the server's tools with McpServer.tools(prefix='...') (e.g. "
                f"prefix='mcp_') or leave it out with McpServer.tools(include=[...]) naming the others")
        return None
    template = make_rag_search_tool(rag, scope=None)  # each run calls a copy bound to its scope
    registry.register(template)
    return template


def scoped_tools(registry: ToolRegistry, template: Optional[Tool], rag: Any, scope: str) -> Dict[str, Tool]:
    """The run's ``rag_search``, bound to its scope; none when the application's own is registered."""
    from ..rag._base import bound_to_scope
    if template is None or registry.get("rag_search") is not template:
        return {}  # the application's own rag_search (registered before or after the engine) runs as is
    return {"rag_search": bound_to_scope(template, rag, scope)}


def _mcp_server_of(tool: Any) -> Optional[str]:
    """The name of the MCP server ``tool`` came from, or None for any other tool."""
    if "streamengine.mcp" not in sys.modules:  # no MCP tool exists before that package is imported
        return None
    from ..mcp import McpTool
    return tool.server.name if isinstance(tool, McpTool) else None

# --- A bounded, one-consumer event channel between a run's reader thread and its caller. ---------------------------
# Used only by ``engine.run(..., read_ahead=True)``: a reader thread drives the
# run into it, for a consumer that is slow on purpose.  (By default the run is
# driven by the consumer's own thread and needs no channel.)
#
# Built on :class:`queue.SimpleQueue`, whose ``put`` and ``get`` are C code:
# ``put`` wakes a waiting consumer from C, and only the first ``put`` after the
# consumer fell asleep pays for the wake-up.  A ``threading.Condition`` costs
# a dozen Python-level calls per notify (measured: 86k notifies for 100k
# tokens).  The consumer drains everything that arrived together in one go, so
# a burst of tokens costs one wake-up.
#
# **Bounded**, because the consumer may be slower than the model: a browser
# that reads nothing while the model writes 60 MB would otherwise make the
# queue hold all of it.  When ``max_items`` events wait, ``put`` blocks the
# producer (the reader thread), the run stops reading the provider's socket, and
# TCP pushes back on the provider.  The producer is woken by the consumer's
# next drain (one ``Event.set`` per drain, not per item) or by ``cancel``;
# once cancelled, ``put`` never blocks, so a cancelled run can always finish.
# The time it waits is the consumer's, and the run's loop counts it as such
# (``Wait.held``): the model's idle timer never spends it.

#: Events a channel holds before the producer waits: a few hundred kB of tokens
#: at most, and enough that a consumer draining in batches never starves it.
DEFAULT_MAX_ITEMS = 1024
_WAIT_SLICE_S = 0.5  # a blocked producer rechecks the queue this often even if no wake-up came

_CLOSED = object()  # put by close(): always the last item


class EventChannel:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS, cancel: Optional[threading.Event] = None) -> None:
        validation.count(max_items, "EventChannel max_items", minimum=1)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._max = max_items
        self._room = threading.Event()  # set by the consumer after a drain, or on cancel
        self._producer_waiting = False
        self._cancel = cancel
        self._stop_watch = _watch(cancel, self._room.set)
        self._closing = False
        self._done = False  # the close marker was taken: nothing more will come

    def put(self, item: Any) -> None:
        """Queue ``item``; waits while ``max_items`` are queued, unless the run is cancelled."""
        q = self._queue
        q.put(item)
        if q.qsize() >= self._max:
            self._wait_while_full()

    def _wait_while_full(self) -> None:
        q = self._queue
        cancel = self._cancel
        while q.qsize() >= self._max and not (cancel is not None and cancel.is_set()):
            self._room.clear()
            self._producer_waiting = True  # before the recheck: a drain after it will set _room
            if q.qsize() < self._max:
                break
            self._room.wait(_WAIT_SLICE_S)
        self._producer_waiting = False

    def close(self) -> None:
        """No more items will come; wakes the consumer.

        The marker goes in before ``closed`` can say so: a consumer that looked
        in between would otherwise count the last item (the run's ``done``) as
        the marker, and never take it.
        """
        if not self._closing:
            self._queue.put(_CLOSED)
            self._closing = True
            self._stop_watch()

    @property
    def closed(self) -> bool:
        """Closed and every item taken (the marker, queued before ``_closing`` is set, is all that is left)."""
        return self._done or (self._closing and self._queue.qsize() <= 1)

    @property
    def backlog(self) -> int:
        """Items waiting now (for tests and monitoring)."""
        return self._queue.qsize()

    def drain(self, timeout: Optional[float]) -> List[Any]:
        """Everything queued now; waits up to ``timeout`` for the first item.

        Returns ``[]`` on timeout, or when the channel is closed and empty.
        """
        if self._done:
            return []
        q = self._queue
        try:
            first = q.get(True, timeout) if timeout is None or timeout > 0 else q.get(False)
        except queue.Empty:
            return []
        items = [first]
        get = q.get_nowait
        for _ in range(q.qsize()):  # only this thread takes items: qsize() of them are there
            items.append(get())
        if self._producer_waiting:
            self._room.set()
        if items[-1] is _CLOSED:
            items.pop()
            self._done = True
        return items


def _watch(cancel: Optional[threading.Event], wake: Any) -> Any:
    """Wake a blocked producer on cancel; returns the remover (free with a CancelToken)."""
    add = getattr(cancel, "add_callback", None)
    if add is None:  # a plain Event is rechecked every _WAIT_SLICE_S
        return lambda: None
    return add(wake)
