"""Model failover: try the candidate models in order, retry rate limits after a back-off.

Each failure is sorted into an :class:`ErrorClass` by an :class:`ErrorClassifier`:

``TRANSIENT_ADVANCE``
    The model is unavailable right now — timeouts, connection errors, broken
    streams, in-band overload, HTTP 404 (model not found), 408, 5xx, 529 —
    so the next model is tried.
``TRANSIENT_RETRY``
    HTTP 429: the same model is retried after ``Retry-After`` (the client
    parses it, invalid values become ``None``); without one, exponential
    back-off; every wait capped at ``max_retry_wait``.  A ``Retry-After``
    beyond the cap says the model is out for longer than we wait: the next
    model is tried at once (the last model is retried, waiting up to the
    cap).  Once the retries are used up the next model is tried.
``FATAL``
    The request itself is wrong (400, 401, 403, other 4xx, a
    :class:`ConfigError`), the caller cancelled, the output crossed a cap
    (:class:`LlmOutputLimitError`), or the error is not an
    LLM error at all (a bug): raised at once, as is.

Before each retry or failover ``may_advance()`` is asked; the engine answers
False once a person has seen a token, and the error is then raised as is
(never replay what a person has seen).  Each step is logged with its verb:
``model a unavailable, failing over to b``, ``model a timed out, failing over
to b``, ``model a rate limited (429), retrying in 2s``.
"""
from __future__ import annotations

import enum
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, List, Optional, Sequence, Tuple

import tenacity

from .. import _validation as validation
from .._errors import (
    NEVER_RETRIED,
    AllModelsFailedError,
    ConfigError,
    LlmCancelledError,
    LlmConnectionError,
    LlmError,
    LlmHttpError,
    LlmOutputLimitError,
    LlmStreamError,
    LlmTimeoutError,
)
from .._logs import component_logger
from .._messages import Chunk, CompletionOptions, MessageLike, Response, ToolSpec
from .._wait import Wait
from .strategies import CallStrategy, OnToolCalls

Attempt = Tuple[str, BaseException]


class ErrorClass(enum.Enum):
    """What to do about a failed call."""

    TRANSIENT_ADVANCE = "transient_advance"
    TRANSIENT_RETRY = "transient_retry"
    FATAL = "fatal"


class ErrorClassifier:
    """Sorts exceptions into :class:`ErrorClass`; subclass and override :meth:`classify` to change it."""

    ADVANCE_STATUSES = frozenset({404, 408, 529})
    RETRY_STATUSES = frozenset({429})

    def classify(self, exc: BaseException) -> ErrorClass:
        if isinstance(exc, (LlmCancelledError, AllModelsFailedError, ConfigError, LlmOutputLimitError)):
            return ErrorClass.FATAL
        if isinstance(exc, LlmHttpError):
            return self.classify_status(exc.status_code)
        if isinstance(exc, (LlmTimeoutError, LlmConnectionError, LlmStreamError)):
            return ErrorClass.TRANSIENT_ADVANCE
        if isinstance(exc, LlmError):
            return ErrorClass.TRANSIENT_ADVANCE
        return ErrorClass.FATAL

    def classify_status(self, status: int) -> ErrorClass:
        if status in self.RETRY_STATUSES:
            return ErrorClass.TRANSIENT_RETRY
        if status in self.ADVANCE_STATUSES or status >= 500:
            return ErrorClass.TRANSIENT_ADVANCE
        return ErrorClass.FATAL


@dataclass(frozen=True)
class FailoverResult:
    """A successful call: the response, the model that gave it, and what failed before.

    ``attempts`` holds every failed call before the success, retries
    included, as ``(model, exception)``; ``failovers`` counts the models
    given up on (0 when the first model answered).
    """

    response: Response
    model: str
    attempts: Tuple[Attempt, ...] = ()
    failovers: int = 0


class ModelFailover:
    """Calls a strategy with each model in turn until one answers.

    ``max_retries`` is the number of *re*-tries of a rate-limited (429)
    model; ``max_retry_wait`` caps any single wait, ``Retry-After`` included.
    Waits end at once when the call's ``cancel`` is set.
    """

    backoff_initial: float = 0.5  # first exponential back-off wait, when no Retry-After is given

    def __init__(self, strategy: CallStrategy, models: Sequence[str], classifier: Optional[ErrorClassifier] = None,
                 max_retries: int = 2, max_retry_wait: float = 30.0, logger: Any = None) -> None:
        if not callable(getattr(strategy, "stream_call", None)):
            raise ConfigError(f"strategy must be a CallStrategy (see make_call_strategy), got {strategy!r}")
        self.strategy = strategy
        self.models = _check_models(models)
        if classifier is not None and not callable(getattr(classifier, "classify", None)):
            raise ConfigError(f"classifier must be an ErrorClassifier (with classify(exc)), got {classifier!r}")
        self.classifier = classifier if classifier is not None else ErrorClassifier()
        self.max_retries = validation.count(max_retries, "max_retries")
        self.max_retry_wait = validation.seconds(max_retry_wait, "max_retry_wait", allow_zero=True)
        self._log = component_logger("streamengine._calls.failover.ModelFailover", logger)

    def stream_call(self, messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]] = None,
                    options: Optional[CompletionOptions] = None, cancel: Optional[threading.Event] = None,
                    on_chunk: Optional[Callable[[Chunk], None]] = None,
                    may_advance: Optional[Callable[[], bool]] = None,
                    on_attempt: Optional[Callable[[str, int], None]] = None,
                    on_tool_calls: Optional[OnToolCalls] = None,
                    on_attempt_failed: Optional[Callable[[str, BaseException], None]] = None,
                    ) -> Generator[Wait, None, FailoverResult]:
        """Try each model in order, as a generator of the calls' waits; see the module doc for each error.

        ``options.model`` is replaced by each candidate in turn.
        ``on_attempt(model, number)`` (optional) runs before every call,
        retries included, numbered from 1; ``on_attempt_failed(model, exc)``
        hears each attempt that raised, retried or not, before failover
        decides what follows.

        Each model is retried on rate limits as tenacity decides, in tenacity's
        loop form, so each attempt's waits pass up, and so does each back-off:
        tenacity's sleep only notes it, and the wait is yielded here before the
        next attempt (the driving thread keeps its heartbeats, tool deadlines
        and cancel while it waits).
        """
        base = options if options is not None else CompletionOptions()
        attempts: List[Attempt] = []
        for position, model in enumerate(self.models):
            policy = _RetryPolicy(self, model, has_next=position < len(self.models) - 1, cancel=cancel,
                                  may_advance=may_advance, attempts=attempts)
            model_options = base.with_model(model)
            try:
                for attempt in policy.retrying():
                    yield from policy.backing_off()
                    with attempt:
                        _before_attempt(model, cancel, on_attempt, len(attempts) + 1)
                        try:
                            response = yield from self.strategy.stream_call(
                                messages, tools, model_options, cancel, on_chunk, on_tool_calls)
                        except Exception as exc:
                            if on_attempt_failed is not None:
                                on_attempt_failed(model, exc)
                            raise
                        return FailoverResult(response, model, tuple(attempts), failovers=position)
                raise AssertionError("unreachable: tenacity returns or re-raises")  # pragma: no cover
            except Exception as exc:
                self._after_failure(exc, model, position, cancel, may_advance, attempts)
        raise AssertionError("unreachable: the last model's failure raises")  # pragma: no cover

    def _after_failure(self, exc: Exception, model: str, position: int, cancel: Optional[threading.Event],
                       may_advance: Optional[Callable[[], bool]], attempts: List[Attempt]) -> None:
        """Decide, after a model gave up: raise (fatal, last model, no advance) or return to try the next."""
        kind = self.classify(exc)
        if kind is ErrorClass.FATAL:
            if not isinstance(exc, LlmCancelledError):
                self._log.warning("model {} failed with a fatal error, not failing over: {}", model, _cause(exc))
            raise exc
        attempts.append((model, exc))
        if position == len(self.models) - 1:
            self._log.error("model {} {}; no model left: all {} failed ({})", model, _verb(exc),
                            len(self.models), _cause(exc))
            raise AllModelsFailedError(attempts) from exc
        if cancel is not None and cancel.is_set():
            raise LlmCancelledError(f"LLM call cancelled by the caller after model {model} failed") from exc
        if may_advance is not None and not may_advance():
            self._log.warning("model {} {}; not failing over: the answer already reached the caller ({})",
                              model, _verb(exc), _cause(exc))
            raise exc
        self._log.warning("model {} {}, failing over to {} ({})", model, _verb(exc),
                          self.models[position + 1], _cause(exc))

    def classify(self, exc: BaseException) -> ErrorClass:
        """The classifier's verdict, except that :data:`NEVER_RETRIED` errors are fatal whatever it says."""
        return ErrorClass.FATAL if isinstance(exc, NEVER_RETRIED) else self.classifier.classify(exc)

    def _asks_too_long(self, exc: BaseException) -> bool:
        """The provider asks for a longer wait than ``max_retry_wait``."""
        retry_after = _retry_after(exc)
        return retry_after is not None and retry_after > self.max_retry_wait


def _before_attempt(model: str, cancel: Optional[threading.Event],
                    on_attempt: Optional[Callable[[str, int], None]], number: int) -> None:
    """A cancel ends the call before the next attempt; else ``on_attempt`` hears its number."""
    if cancel is not None and cancel.is_set():
        raise LlmCancelledError("LLM call cancelled by the caller before calling model " + model)
    if on_attempt is not None:
        on_attempt(model, number)


class _WaitRetryAfter(tenacity.wait.wait_base):
    """Wait what the provider's ``Retry-After`` asks, else the fallback strategy; never past ``cap``."""

    def __init__(self, fallback: tenacity.wait.wait_base, cap: float) -> None:
        self.fallback = fallback
        self.cap = cap

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        asked = _retry_after(outcome.exception() if outcome is not None else None)
        return min(asked, self.cap) if asked is not None else self.fallback(retry_state)


class _StopWhen(tenacity.stop.stop_base):
    """Stop retrying when ``predicate(retry_state)`` says so (the round is committed)."""

    def __init__(self, predicate: Callable[[tenacity.RetryCallState], bool]) -> None:
        self.predicate = predicate

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.predicate(retry_state)


class _RetryPolicy:
    """What tenacity needs for one model: which errors to retry, when to stop, how long to wait.

    The waits and stops are tenacity's own strategies, composed:
    ``Retry-After`` with an exponential fallback, capped; stop after the
    retries *or* once the caller's round is committed (``may_advance``).
    """

    def __init__(self, failover: ModelFailover, model: str, *, has_next: bool, cancel: Optional[threading.Event],
                 may_advance: Optional[Callable[[], bool]], attempts: List[Attempt]) -> None:
        self.failover = failover
        self.model = model
        self.has_next = has_next
        self.cancel = cancel
        self.may_advance = may_advance
        self.attempts = attempts
        self.log = failover._log
        self.last: Optional[BaseException] = None  # the error being waited out, for chaining a cancel
        self.resume_at: Optional[float] = None  # monotonic end of the back-off tenacity asked for, not waited yet

    def retrying(self) -> tenacity.Retrying:
        failover = self.failover
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(self.should_retry),
            stop=tenacity.stop_after_attempt(failover.max_retries + 1) | _StopWhen(self.committed),
            wait=_WaitRetryAfter(tenacity.wait_exponential(multiplier=failover.backoff_initial,
                                                           max=failover.max_retry_wait), failover.max_retry_wait),
            sleep=self.sleep, before_sleep=self.before_sleep, reraise=True)

    def should_retry(self, exc: BaseException) -> bool:
        if self.failover.classify(exc) is not ErrorClass.TRANSIENT_RETRY:
            return False
        if self.has_next and self.failover._asks_too_long(exc):
            self.log.warning("model {} {} with Retry-After {:g}s, over the {:g}s cap: not waiting",
                             self.model, _verb(exc), _retry_after(exc), self.failover.max_retry_wait)
            return False
        return True

    def committed(self, retry_state: tenacity.RetryCallState) -> bool:
        """A person has seen this round's answer: the error is raised as is, never replayed."""
        if self.may_advance is None or self.may_advance():
            return False
        exc = _exception_of(retry_state)
        self.log.warning("model {} {}; not retrying: the answer already reached the caller ({})",
                         self.model, _verb(exc), _cause(exc))
        return True

    def before_sleep(self, retry_state: tenacity.RetryCallState) -> None:
        exc = _exception_of(retry_state)
        self.attempts.append((self.model, exc))
        seconds = retry_state.next_action.sleep if retry_state.next_action is not None else 0.0
        self.log.warning("model {} {}, retrying in {:g}s (retry {} of {}; {})", self.model, _verb(exc),
                         round(seconds, 3), retry_state.attempt_number, self.failover.max_retries, _cause(exc))
        self.last = exc

    def sleep(self, seconds: float) -> None:
        """tenacity's sleep: note the back-off; :meth:`backing_off` waits it out as a yielded wait."""
        self.resume_at = time.monotonic() + seconds

    def backing_off(self) -> Generator[Wait, None, None]:
        """The back-off noted by :meth:`sleep`, as waits without a socket; a cancel ends it at once."""
        until, self.resume_at = self.resume_at, None
        if until is None:
            return
        cancel = self.cancel
        ready = cancel.is_set if cancel is not None else None
        wait = Wait(None, until=until, ready=ready)
        while True:  # yielded once even when it is over (a Retry-After of 0): the driver sees every back-off
            yield wait  # the driver may end it sooner by lowering ``until`` (a test's fast-forward)
            if (ready is not None and ready()) or time.monotonic() >= wait.until:
                break
        if ready is not None and ready():
            raise LlmCancelledError(f"LLM call cancelled by the caller while waiting to retry model {self.model}"
                                    ) from self.last


def _exception_of(retry_state: tenacity.RetryCallState) -> BaseException:
    """The failed attempt's exception (tenacity asks stop and before_sleep only after a failure)."""
    outcome = retry_state.outcome
    exc = outcome.exception() if outcome is not None else None
    assert exc is not None
    return exc


def _retry_after(exc: Optional[BaseException]) -> Optional[float]:
    """The error's ``Retry-After`` in seconds, when it has a usable one."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _check_models(models: Sequence[str]) -> Tuple[str, ...]:
    if isinstance(models, str):
        raise ConfigError(f"models must be a list of model names, e.g. [{models!r}], not a single string")
    checked = tuple(models or ())
    if not checked:
        raise ConfigError("ModelFailover needs at least one model name, e.g. models=['gpt-4o-mini'] "
                          "(or set STREAMENGINE_MODEL)")
    for model in checked:
        validation.name(model, f"every model in {list(checked)!r}")
    return checked


def _verb(exc: BaseException) -> str:
    """How a failure reads in a log line: ``model a <verb>, failing over to b``."""
    if isinstance(exc, LlmTimeoutError):
        return exc.verb
    if isinstance(exc, LlmHttpError) and exc.status_code == 429:
        return "rate limited (429)"
    return "unavailable"


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
