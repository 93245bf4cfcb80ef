"""An output cap ends the call whatever the ``ErrorClassifier`` says.

``LlmOutputLimitError`` is an ``LlmError``, so a classifier of your own that
retries or fails over on every ``LlmError`` would otherwise send the same
request again, or to the next model, which crosses the same cap.  Over real
HTTP, with a second model that must never be asked.
"""
from __future__ import annotations

import pytest

from streamengine import (
    DoneEvent,
    EngineConfig,
    ErrorClass,
    ErrorClassifier,
    ErrorEvent,
    LlmError,
    OpenAICompatibleClient,
    StopReason,
    StreamingEngine,
)
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")


class RetryEverything(ErrorClassifier):
    def classify(self, exc: BaseException) -> ErrorClass:
        return ErrorClass.TRANSIENT_RETRY


class FailOverOnEveryLlmError(ErrorClassifier):
    def classify(self, exc: BaseException) -> ErrorClass:
        return ErrorClass.TRANSIENT_ADVANCE if isinstance(exc, LlmError) else ErrorClass.FATAL


CLASSIFIERS = [RetryEverything(), FailOverOnEveryLlmError()]


def engine_on(fp: FakeProvider, classifier: ErrorClassifier, **config: object) -> StreamingEngine:
    settings = {"models": ["m1", "m2"], "idle_timeout": 10.0, "completion_timeout": 30.0, "max_retries": 3, **config}
    return StreamingEngine(OpenAICompatibleClient(fp.base_url), (), EngineConfig(**settings),  # type: ignore[arg-type]
                           classifier=classifier)


@pytest.mark.parametrize("classifier", CLASSIFIERS, ids=lambda c: type(c).__name__)
def test_an_output_cap_ends_the_run_once_and_no_other_model_is_asked(classifier: ErrorClassifier) -> None:
    with FakeProvider() as fp:
        # Reasoning is not shown, so the round is not committed: only the rule stops a failover here.
        fp.respond_with(lambda request: [s.forever(s.reasoning("r" * 1000), every=0.0005)])
        with engine_on(fp, classifier, max_reasoning_chars=20_000) as engine:
            events = list(engine.run([{"role": "user", "content": "question"}]))
        asked = [request.json.get("model") for request in fp.requests]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    result = done.result
    assert result.telemetry.stop_reason == StopReason.OUTPUT_LIMIT
    assert asked == ["m1"], asked
    assert result.telemetry.failovers == 0 and len(result.telemetry.failed_attempts) == 1
    assert [e.fatal for e in events if isinstance(e, ErrorEvent)] == [True]
