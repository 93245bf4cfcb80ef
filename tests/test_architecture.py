"""The house holds: no import circle, no module importing a layer above it, a doc that names what exists,
one exception tree, one way to build a provider client.

docs/ARCHITECTURE.md is the current truth about the code; these tests keep
it so.  Imports are read from the source (module level, outside
``TYPE_CHECKING``), the way a reader follows them.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pickle
import re
from typing import Dict, List, Set, Type

import pytest

from streamengine import (
    AnthropicClient,
    ConfigError,
    EngineResult,
    LlmError,
    OpenAICompatibleClient,
    OpenAIResponsesClient,
    RunFailedError,
    StreamEngineError,
    Telemetry,
    ToolError,
)
from streamengine._clients.http.transport import HttpProviderClient, Wire

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "streamengine"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: Layers from the bottom up; a module may import its own layer and those below, never above.
LAYERS = [
    ("data", ["_errors", "_parts", "_messages", "_validation", "_logs", "_cancel", "_wait", "_config"]),
    ("parsing", ["_accumulate", "_inline"]),
    ("clients", ["_clients"]),
    ("tools", ["tools"]),
    ("one call", ["_calls"]),
    ("stores", ["rag", "runs"]),  # runs: the run logs (memory, SQLite, Redis, PostgreSQL)
    ("mcp", ["mcp"]),
    ("one run", ["_engine", "_otel"]),  # _otel: spans and metrics of a run, imported by _engine/run.py
    ("testing", ["testing"]),  # the fake provider and scenarios; the CLI's demo and harness use them
    ("delivery", ["web", "wsgi", "_cli", "__main__"]),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> Dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(module: str, is_package: bool, level: int, target: str) -> str:
    if level == 0:
        return target
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _top_level_imports(module: str, path: pathlib.Path, known: Set[str]) -> Set[str]:
    """The package modules ``module`` imports when it is imported (not in functions, not for type hints)."""
    tree = ast.parse(path.read_text())
    found: Set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(body: List[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node.level, node.module or "")
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if candidate in known else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    visit(tree.body)
    return {name for name in found if name in known and name != module}


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _top_level_imports(name, path, known) for name, path in modules.items()}


def _layer_of(module: str) -> int:
    inner = module.split(".")[1] if "." in module else ""
    for index, (_, prefixes) in enumerate(LAYERS):
        if inner in prefixes:
            return index
    return -1  # the package's own __init__: above everything, it re-exports


def test_no_import_circle():
    graph = _graph()
    state: Dict[str, int] = {}
    stack: List[str] = []
    circles: List[List[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt == "streamengine":
                continue  # the lazy package __init__ imports nothing at import time
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    assert circles == []


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for module, imports in _graph().items():
        mine = _layer_of(module)
        if mine < 0:
            continue
        for target in imports:
            theirs = _layer_of(target)
            if theirs > mine:
                upward.append(f"{module} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert upward == []


def test_every_module_is_in_a_layer():
    assert [m for m in _modules() if m != "streamengine" and _layer_of(m) < 0] == []


#: A module holds one idea; this only stops monsters (a split for size alone makes fragments).
MAX_MODULE_LINES = 800


def test_no_module_is_a_monster():
    long = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in long.items() if n > MAX_MODULE_LINES} == {}



# --- the tests mirror the package ------------------------------------------------------------

TESTS = ROOT / "tests"
#: Tests of the package as a whole; every other test lives in the folder of what it tests.
WHOLE_PACKAGE_TESTS = {"conftest.py", "test_architecture.py", "test_install.py", "test_public_api.py", "test_readme.py",
                       "test_types.py"}
#: One folder per part of the package (``mcp_client``, not ``mcp``: that would shadow the SDK), and ``support``.
TEST_FOLDERS = {"core", "calls", "engine", "clients", "tools", "web", "cli", "rag", "runs", "mcp_client", "otel",
                "testing", "support"}


def test_tests_are_laid_out_like_the_package():
    assert {p.name for p in TESTS.glob("*.py")} == WHOLE_PACKAGE_TESTS
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))} == TEST_FOLDERS


def test_helpers_live_in_support_and_test_modules_have_unique_names():
    """pytest imports a test module by its file name (no ``__init__.py``), so two folders may not share one."""
    outside = [p for p in TESTS.rglob("*.py") if not p.name.startswith("test_") and p.parent != TESTS
               and TESTS / "support" not in p.parents]
    assert outside == []
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []

# --- the doc names what exists ----------------------------------------------------------------

_DOTTED = re.compile(r"`((?:streamengine\.)?(?:_?[a-z][a-z0-9_]*)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")


def _named_in_doc() -> List[str]:
    names = []
    for match in _DOTTED.finditer(DOC.read_text()):
        name = match.group(1)
        head = name.split(".")[0]
        if head == "streamengine" or (PACKAGE / head).exists() or (PACKAGE / f"{head}.py").exists():
            names.append(name if head == "streamengine" else f"streamengine.{name}")
    return sorted(set(names))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_the_architecture_doc_names_modules_and_functions_that_exist():
    names = _named_in_doc()
    assert len(names) > 30, "the doc should name the modules and functions it describes"
    assert [name for name in names if not _resolves(name)] == []


@pytest.mark.parametrize("path", ["streamengine/_engine/rounds.py", "streamengine/_clients/http/transport.py"])
def test_the_doc_mentions_the_main_modules(path):
    module = _module_name(ROOT / path).replace("streamengine.", "")
    assert module in DOC.read_text()

# --- one exception tree ------------------------------------------------------------------------------
# One exception tree: every exception class the package defines derives from ``StreamEngineError``.
#
# Every module is imported and each exception class defined in it is checked,
# so a new error raised to a caller cannot sit outside the tree that
# ``except StreamEngineError`` catches.  The allowlist names the few internal
# exceptions that never reach a caller, each with why it may not join.

#: Exceptions outside the tree, each internal: caught where raised, never seen by a caller.
INTERNAL_EXCEPTIONS = {
    # Control flow inside one model call: the reader stopping the call; call() turns it into an LlmError.
    "streamengine._calls.strategies._Stopped",
    # json.dumps' default hook escaping a result that has no JSON form; result_to_text raises ToolReturnError.
    "streamengine.tools._tool._NoJsonForm",
    # Raised into the MCP SDK's HTTP transport, which must see an httpx StreamError to fail that one request.
    "streamengine.mcp._transports.AnswerTooLarge",
}


def _exceptions_defined_in(name: str) -> List[Type[BaseException]]:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an extra that is not installed (opentelemetry, mcp, psycopg...)
        if exc.name and not exc.name.startswith("streamengine"):
            pytest.skip(f"{name} needs {exc.name}")
        raise
    return [value for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name]


@pytest.mark.parametrize("module", sorted(name for name in _modules() if not name.endswith("__main__")))
def test_every_exception_a_module_defines_is_in_the_tree_or_named_internal(module: str) -> None:
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in _exceptions_defined_in(module)
               if not issubclass(cls, StreamEngineError)]
    assert sorted(set(outside) - INTERNAL_EXCEPTIONS) == [], "derive them from StreamEngineError (see _errors.py)"


def test_the_allowlist_names_only_classes_that_exist_outside_the_tree_and_say_internal() -> None:
    for dotted in INTERNAL_EXCEPTIONS:
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


# --- one way to build a provider client ---------------------------------------------------------------
# One way to build a provider client: the shared HTTP client holding the provider's wire.
#
# Each public client is an ``HttpProviderClient`` (the transport: session,
# credentials, cancel, bounded reads, per-call extras) given a ``Wire`` (what its
# API's requests, answers and errors look like); a client adds only its
# constructor and what its API offers besides chat (``embed``, ``from_env``),
# never a transport hook, and no client derives from another.

CLIENTS = [OpenAICompatibleClient, OpenAIResponsesClient, AnthropicClient]


@pytest.mark.parametrize("client_class", CLIENTS, ids=lambda c: c.__name__)
def test_a_client_is_the_shared_http_client_with_a_wire_and_overrides_none_of_it(client_class: type) -> None:
    assert client_class.__bases__ == (HttpProviderClient,)
    shared = {name for name, value in vars(HttpProviderClient).items() if callable(value)}
    assert shared & {name for name, value in vars(client_class).items() if callable(value)} == {"__init__"}
    with client_class("http://127.0.0.1:9/v1", api_key="sk-test") as client:
        assert isinstance(client.wire, Wire) and type(client.wire).__bases__ == (Wire,)


def test_each_client_keeps_its_settings_readable() -> None:
    with OpenAICompatibleClient("http://127.0.0.1:9/v1", stream_options=False) as chat, \
            OpenAIResponsesClient("http://127.0.0.1:9/v1") as responses, \
            AnthropicClient("http://127.0.0.1:9", api_key="k", anthropic_version="2024-01-01",
                            default_max_tokens=99, max_retries=1) as anthropic:
        assert chat.stream_options is False and responses.stream_options is False
        assert (anthropic.anthropic_version, anthropic.default_max_tokens, anthropic.max_retries) == (
            "2024-01-01", 99, 1)
