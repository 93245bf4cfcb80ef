"""One model call the way ``StreamingEngine`` makes it, watched through public seams only.

The client and fault tests check what a call does with a provider's bytes: the
answer it aggregates, the error it raises, the model that answered and the
attempts before it.  A user sees all of that through the engine, so the tests
do too: an :class:`ErrorClassifier` subclass hears every error the call raised
(the engine asks it about each one), an ``Observer`` gets the aggregated
response, and ``Telemetry`` says which model answered and which attempts
failed.  One run of one round: no continuation, no tools, no retries unless
asked for; a model that failed mid-answer fails over too
(``failover_after_tokens``), as a call on its own does.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from streamengine import (
    Chunk,
    CompletionOptions,
    EngineConfig,
    EngineResult,
    ErrorClass,
    ErrorClassifier,
    LlmClient,
    ModelChunkEvent,
    Response,
    RunFailedError,
    StreamingEngine,
    ToolSpec,
)


class RecordingClassifier(ErrorClassifier):
    """The default classifier that also keeps each error it was asked about, once, in order."""

    def __init__(self) -> None:
        self.errors: List[BaseException] = []

    def classify(self, exc: BaseException) -> ErrorClass:
        if not any(seen is exc for seen in self.errors):
            self.errors.append(exc)
        return super().classify(exc)


@dataclass(frozen=True)
class Answered:
    """A call that answered: the response, the model that gave it, what failed before, models given up on."""

    response: Response
    model: Optional[str]
    attempts: Tuple[Tuple[str, BaseException], ...]
    failovers: int
    result: EngineResult


class AllFailed(RunFailedError):
    """The engine's ``RunFailedError`` of a failover where no model answered, with each ``(model, error)``.

    ``str()`` is the engine's own error text (``all N model attempt(s) failed: ...``).
    """

    def __init__(self, result: EngineResult, attempts: Tuple[Tuple[str, BaseException], ...]) -> None:
        super().__init__(result)
        self.attempts = attempts


class Cancelled(RunFailedError):
    """The engine's ``RunFailedError`` of a call the caller cancelled (``stop_reason`` is ``cancelled``)."""


class EngineCall:
    """Calls ``client`` through a one-round engine with these deadlines and models.

    :meth:`call` returns the aggregated :class:`Response`; :meth:`failover` an
    :class:`Answered`.  A failed single-model call raises the error the call
    raised (the one a classifier sees), a failover that no model answered
    :class:`AllFailed` (the engine's ``RunFailedError``), one stopped by a
    fatal error that error, a cancelled one :class:`Cancelled`; :attr:`attempts` holds ``(model, error)`` of
    each failed attempt of the last call either way.  A model named in a
    call's ``options`` is that call's one model (the engine takes it as
    ``model=``); else ``models`` fail over in turn.
    """

    def __init__(self, client: LlmClient, idle: float = 5.0, cap: float = 10.0, models: Sequence[str] = ("m",),
                 max_retries: int = 0) -> None:
        self.classifier = RecordingClassifier()
        self.responses: List[Response] = []
        config = EngineConfig(models=list(models), idle_timeout=idle, completion_timeout=cap,
                              max_retries=max_retries, max_continuations=0, failover_after_tokens=True)
        self.engine = StreamingEngine(client, [], config, classifier=self.classifier, observers=[self])
        self.attempts: Tuple[Tuple[str, BaseException], ...] = ()
        self.result: Optional[EngineResult] = None

    def on_llm_responded(self, response: Response) -> None:
        self.responses.append(response)

    def call(self, messages: Any, options: Optional[CompletionOptions] = None,
             cancel: Optional[threading.Event] = None, on_chunk: Any = None,
             tools: Optional[Sequence[ToolSpec]] = None) -> Response:
        """The response of one call; the call's own error (a timeout, a broken stream...) if it failed."""
        try:
            return self.failover(messages, options=options, cancel=cancel, on_chunk=on_chunk).response
        except AllFailed:
            if self.classifier.errors:
                raise self.classifier.errors[-1] from None
            raise

    def failover(self, messages: Any, options: Optional[CompletionOptions] = None,
                 cancel: Optional[threading.Event] = None, on_chunk: Any = None) -> Answered:
        """Each model in turn until one answers; :class:`AllFailed` if none did."""
        self.classifier.errors.clear()
        self.responses.clear()
        model = options.model if options is not None else None
        if options is not None and model is not None:
            options = dataclasses.replace(options, model=None)
        unsubscribe = self.engine.emitter.subscribe(_chunks_to(on_chunk)) if on_chunk is not None else None
        try:
            result = self.engine.complete(messages, cancel, model=model, options=options, raise_on_error=False)
        finally:
            if unsubscribe is not None:
                unsubscribe()
        self.result = result
        self.attempts = _attempts(result, self.classifier.errors)
        if result.telemetry.stop_reason == "cancelled":
            raise Cancelled(result)
        errors = self.classifier.errors
        if result.error is not None and errors and result.error == str(errors[-1]):
            raise errors[-1]  # the run stopped on this error itself: a fatal one stops failover at once
        if result.error is not None or not self.responses:
            raise AllFailed(result, self.attempts)
        return Answered(self.responses[-1], result.telemetry.model_used, self.attempts,
                        result.telemetry.failovers, result)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> EngineCall:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class WholeAnswers(LlmClient):
    """``client`` seen as one that only answers in one piece: the engine makes it a buffered call."""

    def __init__(self, client: LlmClient) -> None:
        self.client = client

    def complete(self, messages: Any, tools: Optional[Sequence[ToolSpec]] = None,
                 options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None) -> Response:
        return self.client.complete(messages, tools, options, cancel)


def _chunks_to(on_chunk: Any) -> Any:
    """The emitter's subscriber that hands ``on_chunk`` each chunk read from the model."""
    def subscriber(event: Any) -> None:
        if isinstance(event, ModelChunkEvent):
            on_chunk(event.chunk)
    return subscriber


def _attempts(result: EngineResult, errors: Sequence[BaseException]) -> Tuple[Tuple[str, BaseException], ...]:
    """``(model, error)`` of each failed attempt: the model from ``Telemetry.failed_attempts``, in order."""
    models = [line.split(": ", 1)[0] for line in result.telemetry.failed_attempts]
    by_line: Dict[int, BaseException] = dict(enumerate(errors))
    return tuple((model, by_line[i]) for i, model in enumerate(models) if i in by_line)


def streamed(client: LlmClient, messages: Any, options: Optional[CompletionOptions] = None,
             ) -> Tuple[List[Chunk], Response]:
    """The chunks of one streamed call, and the response the engine aggregated from them."""
    chunks: List[Chunk] = []
    with EngineCall(client) as calls:
        response = calls.call(messages, options=options, on_chunk=chunks.append)
    return chunks, response
