"""One exception tree for the whole library: every error it raises to a caller is a :class:`StreamEngineError`.

::

    StreamEngineError
    ├── ConfigError (ValueError)
    │   ├── ScenarioError                   testing: a scenario file that cannot be run
    │   └── PartNotCarriedError             an image, audio or file the model's API cannot take
    ├── LlmError
    │   ├── LlmHttpError                    status_code, body, retry_after
    │   ├── LlmTimeoutError (TimeoutError)  timeout_s, chunks_received, verb
    │   ├── LlmStreamError                  broken / malformed / in-band error stream
    │   │   └── LlmProtocolError            the provider did not speak the wire format
    │   ├── LlmConnectionError (ConnectionError)
    │   ├── LlmCancelledError               the caller cancelled the call
    │   ├── LlmOutputLimitError             the model's output crossed a cap: what, limit
    │   ├── AllModelsFailedError            attempts: every model's cause
    │   └── RunFailedError                  complete() of a run with no answer: result
    ├── ToolError                           a tool could not be defined or called
    │   ├── ToolFailure                     tools: a failure worded for the model, the result as is
    │   │   ├── ToolReturnError             tools: a return value with no JSON form
    │   │   └── McpToolError                mcp: the server's error
    │   │       └── McpUnavailable          mcp: the server cannot answer
    │   ├── RemoteToolError                 tools: a remote tool's exception that could not travel back
    │   └── BlockError                      an inline ``<tool>`` block that is not a valid call
    ├── SseEventTooLarge (ValueError)       clients: an SSE event past its size or work limit
    ├── RequestRejected (ValueError)        web: a request's messages break the policy
    ├── HttpError                           web: a request refused before streaming
    ├── RunLogError                         runs: the run log could not do what was asked
    │   ├── RunNotFound (LookupError)       runs: unknown, expired or another owner's run
    │   ├── RunFencedError                  runs: a producer's stale lease; nothing was written
    │   └── RunExistsError                  runs: create() with a taken id
    ├── RunClientError                      testing: a served run that could not be started or followed
    ├── UsageError                          CLI: a command line that cannot run as written
    └── ConversationLogError            CLI: the run log cannot be read or written

Classes outside this module are defined beside the code that raises them;
``tests/test_architecture.py`` checks every module's exceptions
against the tree (its allowlist names the few internal ones that never reach
a caller, and why).  Third-party exceptions are translated at one boundary
(the client) and chained with ``raise ... from``, so the original cause is
never lost.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Type


class StreamEngineError(Exception):
    """Base of every error this library raises on purpose."""


class ConfigError(StreamEngineError, ValueError):
    """A setting or argument is invalid; the message says which and how to fix it."""


class PartNotCarriedError(ConfigError):
    """A message's image, audio or file that a model's API cannot carry: the request's content, not a setting.

    Raised before any request is sent; a web app answers it as the client's
    (422), not as its own failure.
    """


class LlmError(StreamEngineError):
    """A call to the model failed."""


class LlmHttpError(LlmError):
    """The provider answered with an HTTP error status."""

    def __init__(
        self,
        status_code: int,
        body: str = "",
        retry_after: Optional[float] = None,
        message: Optional[str] = None,
    ) -> None:
        self.status_code = status_code
        self.body = body[:1024]
        self.retry_after = retry_after
        super().__init__(message or f"provider answered HTTP {status_code}: {self.body}")


class LlmTimeoutError(LlmError, TimeoutError):
    """The model was silent too long, or its stream ran past the absolute cap."""

    def __init__(self, message: str, *, timeout_s: float, chunks_received: int, verb: str) -> None:
        self.timeout_s = timeout_s
        self.chunks_received = chunks_received
        self.verb = verb
        super().__init__(message)


class LlmStreamError(LlmError):
    """The stream broke, was malformed, or carried an in-band error."""

    def __init__(self, message: str, *, overloaded: bool = False) -> None:
        self.overloaded = overloaded
        super().__init__(message)


class LlmProtocolError(LlmStreamError):
    """The provider did not speak the OpenAI wire format (wrong content type, bad JSON)."""


class LlmConnectionError(LlmError, ConnectionError):
    """The provider could not be reached or dropped the connection."""


class LlmCancelledError(LlmError):
    """The call was cancelled by the caller; not a provider fault."""


class LlmOutputLimitError(LlmError):
    """The model's output crossed one of the run's caps (``EngineConfig.max_*_chars``).

    Not a provider outage: the same request is never retried nor sent to
    another model, whatever an ``ErrorClassifier`` says (:data:`NEVER_RETRIED`).
    ``what`` names the cap (``"answer"``, ``"reasoning"``, ``"refusal"``,
    ``"tool arguments"``, ``"run output"``), ``limit`` its size in characters.
    """

    def __init__(self, message: str, *, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        super().__init__(message)


class AllModelsFailedError(LlmError):
    """Every model in the failover list failed; ``attempts`` holds each cause."""

    def __init__(self, attempts: Sequence[Tuple[str, BaseException]]) -> None:
        self.attempts = list(attempts)
        causes = "; ".join(f"{model}: {type(exc).__name__}: {exc}" for model, exc in self.attempts)
        super().__init__(f"all {len(self.attempts)} model attempt(s) failed: {causes}")


class RunFailedError(LlmError):
    """``complete()`` of a run that produced no answer; ``result`` (an ``EngineResult``) is what the run did get.

    ``cause``, when known, is the error that ended the run; it is chained as ``__cause__``.
    """

    def __init__(self, result: Any, cause: Optional[BaseException] = None) -> None:
        self.result = result
        super().__init__(getattr(result, "error", None) or "the run failed")
        self.__cause__ = cause


class ToolError(StreamEngineError):
    """A tool could not be defined, validated or called."""


#: Errors that end the model call at once, whatever an ``ErrorClassifier`` says: the cap would be crossed
#: again by the same request on any model, and a cancel is the caller's wish, not a provider's fault.
#: Failover consults this before asking its classifier.
NEVER_RETRIED: Tuple[Type[LlmError], ...] = (LlmOutputLimitError, LlmCancelledError)
