"""One exception tree: every exception class the package defines derives from ``StreamEngineError``.

Every module is imported and each exception class defined in it is checked,
so a new error raised to a caller cannot sit outside the tree that
``except StreamEngineError`` catches.  The allowlist names the few internal
exceptions that never reach a caller, each with why it may not join.
"""
from __future__ import annotations

import importlib
import inspect
import pathlib
import pickle
from typing import List, Type

import pytest

import streamengine
from streamengine import ConfigError, EngineResult, LlmError, RunFailedError, StreamEngineError, Telemetry, ToolError

PACKAGE = pathlib.Path(streamengine.__file__).parent

#: Exceptions outside the tree, each internal: caught where raised, never seen by a caller.
INTERNAL = {
    # Control flow inside one model call: the reader stopping the call; call() turns it into an LlmError.
    "streamengine._calls.strategies._Stopped",
    # json.dumps' default hook escaping a result that has no JSON form; result_to_text raises ToolReturnError.
    "streamengine.tools._tool._NoJsonForm",
    # Raised into the MCP SDK's HTTP transport, which must see an httpx StreamError to fail that one request.
    "streamengine.mcp._transports.AnswerTooLarge",
}


def _modules() -> List[str]:
    """Every module of the package but ``__main__`` (importing it runs the command line; it defines nothing)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__":
            names.append(".".join(parts))
    return names


def _exceptions_defined_in(name: str) -> List[Type[BaseException]]:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an extra that is not installed (opentelemetry, mcp, psycopg...)
        if exc.name and not exc.name.startswith("streamengine"):
            pytest.skip(f"{name} needs {exc.name}")
        raise
    return [value for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name]


@pytest.mark.parametrize("module", _modules())
def test_every_exception_a_module_defines_is_in_the_tree_or_named_internal(module: str) -> None:
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in _exceptions_defined_in(module)
               if not issubclass(cls, StreamEngineError)]
    assert sorted(set(outside) - INTERNAL) == [], "derive them from StreamEngineError (see _errors.py)"


def test_the_allowlist_names_only_classes_that_exist_outside_the_tree_and_say_internal() -> None:
    for dotted in INTERNAL:
        module, _, name = dotted.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert not issubclass(cls, StreamEngineError)
        assert cls.__doc__ and ("Internal" in cls.__doc__ or "SDK" in cls.__doc__), dotted


@pytest.mark.parametrize("dotted, extra_base", [
    ("streamengine.web.RequestRejected", ValueError),
    ("streamengine._clients.http.sse_read.SseEventTooLarge", ValueError),
    ("streamengine.testing._scenario.ScenarioError", ConfigError),
    ("streamengine.tools._tool.ToolFailure", ToolError),
    ("streamengine.mcp._tools.McpToolError", ToolError),
    ("streamengine.tools._tool.RemoteToolError", ToolError),
    ("streamengine._inline.BlockError", ToolError),
    ("streamengine._cli.build.UsageError", StreamEngineError),
    ("streamengine._cli.log.ConversationLogError", StreamEngineError),
    ("streamengine.web._guard.HttpError", StreamEngineError),
])
def test_the_errors_that_lived_outside_the_tree_keep_the_bases_users_catch(dotted: str, extra_base: type) -> None:
    module, _, name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, StreamEngineError) and issubclass(cls, extra_base)


def _failed_result() -> EngineResult:
    return EngineResult(answer="", rounds=(), tool_results=(), telemetry=Telemetry(stop_reason="llm_error"),
                        error="provider answered HTTP 400: bad request")


def test_run_failed_error_is_an_llm_error_that_chains_its_cause() -> None:
    cause = LlmError("provider answered HTTP 400: bad request")
    error = RunFailedError(_failed_result(), cause)
    assert isinstance(error, LlmError) and error.__cause__ is cause
    assert str(error) == "provider answered HTTP 400: bad request" and error.result.error == str(error)
    with pytest.raises(RunFailedError) as caught:
        raise error
    assert caught.value.__cause__ is cause
    assert RunFailedError(_failed_result()).__cause__ is None


def test_a_remote_tool_error_still_travels_between_processes() -> None:
    from streamengine.tools._tool import RemoteToolError

    error = pickle.loads(pickle.dumps(RemoteToolError("ValueError: no")))
    assert isinstance(error, ToolError) and str(error) == "ValueError: no"
