"""The public face: ``__all__`` is sorted, complete and importable."""
import ast
import importlib
import inspect

import pytest

import streamengine

PUBLIC_MODULES = ["streamengine", "streamengine.web", "streamengine.tools", "streamengine.rag", "streamengine.mcp",
                  "streamengine.testing", "streamengine.wsgi", "streamengine.runs"]


def test_all_is_sorted_and_unique():
    assert list(streamengine.__all__) == sorted(set(streamengine.__all__))


def test_every_name_in_all_is_defined():
    missing = [name for name in streamengine.__all__ if not hasattr(streamengine, name)]
    assert missing == []


def test_every_public_class_or_function_is_exported():
    public = {
        name for name, value in vars(streamengine).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert public - set(streamengine.__all__) == set()


def _warn_from_inside_the_package():
    # A failing cancel callback is logged as a WARNING by the package's cancel token.
    from streamengine import CancelToken

    token = CancelToken()
    token.add_callback(lambda: 1 / 0)
    token.set()


def test_logging_is_silent_until_enabled_then_goes_to_the_sink():
    from loguru import logger

    seen = []
    probe = logger.add(lambda m: seen.append(m.record["message"]), level="DEBUG")
    try:
        _warn_from_inside_the_package()
        assert seen == []
        lines = []
        handler = streamengine.enable_logging("WARNING", sink=lambda m: lines.append(str(m)))
        _warn_from_inside_the_package()
        assert any("cancel callback failed" in line and "streamengine.cancel" in line for line in lines)
        logger.remove(handler)
    finally:
        logger.remove(probe)
        logger.disable("streamengine")


def test_all_holds_what_a_user_needs_not_the_building_blocks():
    user_needs = {"StreamingEngine", "EngineConfig", "EngineResult", "TokenEvent", "DoneEvent", "ToolStartEvent",
                  "OpenAICompatibleClient", "ScriptedClient", "tool", "ToolRegistry", "ConfigError", "LlmError",
                  "SqliteRagStore", "enable_logging", "CancelToken", "CompletionOptions", "Message",
                  "ErrorClassifier", "ModelChunkEvent", "ReasoningEvent"}
    building_blocks = {"FeedResult", "ToolHandle", "make_call_strategy", "ToolCallAccumulator", "ResponseAggregator",
                       "EventEmitter", "XmlParseState", "InlineToolScanner", "ToolExecutor", "ModelFailover"}
    assert user_needs <= set(streamengine.__all__)
    assert building_blocks & set(streamengine.__all__) == set()


def test_the_old_shims_are_gone_and_unknown_names_raise():
    for name in ("XmlParseState", "ToolExecutor", "make_call_strategy", "NoSuchThing"):
        try:
            getattr(streamengine, name)
        except AttributeError as exc:
            assert name in str(exc)
        else:
            raise AssertionError(f"streamengine.{name} must not exist")


def test_importing_the_package_imports_no_heavy_dependency():
    """``import streamengine`` stays cheap: clients, stores and logging load on first use."""
    import subprocess
    import sys
    probe = ("import sys, streamengine; heavy = ('requests', 'loguru', 'sqlite3', 'tenacity', 'pydantic'); "
             "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    probe = ("import sys, streamengine; streamengine.Message; heavy = ('requests', 'loguru', 'sqlite3', 'tenacity'); "
             "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_package_exports_only_names_it_defines():
    import importlib
    for package in ("streamengine.tools", "streamengine.rag", "streamengine.web", "streamengine.testing",
                    "streamengine.wsgi", "streamengine.runs"):
        module = importlib.import_module(package)
        assert list(module.__all__) == sorted(set(module.__all__)), package
        assert [name for name in module.__all__ if not hasattr(module, name)] == [], package


def test_the_frontend_routes_are_exported_where_the_stream_path_is():
    from streamengine import web, wsgi

    for module in (web, wsgi):
        assert (module.CHAT_PATH, module.AGUI_PATH, module.STREAM_PATH) == ("/api/chat", "/agui", "/v1/chat/stream")


def test_a_cancel_token_is_an_event_that_waits_sets_and_clears_across_threads():
    """CancelToken is an Event whose set() also runs its callbacks, in the setting thread."""
    import threading

    from streamengine import CancelToken

    token = CancelToken()
    assert isinstance(token, threading.Event) and not token.is_set() and not token.wait(0.01)
    order = []
    waiter = threading.Thread(target=lambda: order.append(("woke", token.wait(10))))
    waiter.start()
    token.add_callback(lambda: order.append(("callback", token.cancelled)))
    setter = threading.Timer(0.05, token.set)
    setter.start()
    waiter.join(10)
    setter.join(10)
    assert sorted(order) == [("callback", True), ("woke", True)] and token.is_set()
    token.clear()
    assert not token.is_set() and not token.cancelled and not token.wait(0.01)


def _tree(module_name):
    if module_name == "streamengine.mcp":
        pytest.importorskip("mcp")
    return ast.parse(inspect.getsource(importlib.import_module(module_name)))


def _literal_all(tree):
    [value] = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
    assert isinstance(value, ast.List) and all(isinstance(e, ast.Constant) for e in value.elts), \
        "__all__ must be a literal list of strings, so type checkers read it"
    return [e.value for e in value.elts]


def _explicit_reexports(nodes):
    """Names imported as ``from .x import Name as Name``: what ``mypy --strict`` accepts as re-exported."""
    return {alias.asname: "." * node.level + (node.module or "") for node in nodes if isinstance(node, ast.ImportFrom)
            for alias in node.names if alias.asname == alias.name or (node.module is None and alias.asname)}


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_each_public_module_has_a_literal_all_of_explicit_reexports(module_name):
    tree = _tree(module_name)
    names = _literal_all(tree)
    nodes = list(tree.body)
    nodes += [inner for node in tree.body if isinstance(node, ast.If) for inner in node.body]
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    missing = [name for name in names if name not in _explicit_reexports(nodes) and name not in defined]
    assert missing == [], f"{module_name}: re-export these as `from .x import Name as Name`"


def test_the_lazy_table_and_what_type_checkers_see_agree():
    """``import streamengine`` imports a name on first use (``_HOMES``); mypy reads the TYPE_CHECKING imports."""
    tree = _tree("streamengine")
    assert sorted(_literal_all(tree)) == sorted(streamengine._HOMES)
    [checking] = [node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)]
    assert _explicit_reexports(checking.body) == streamengine._HOMES


def test_content_parts_and_their_web_policy_are_public():
    """Images, audio and files in messages: the part records at the top, the web app's policy beside the app."""
    import streamengine.web
    import streamengine.wsgi

    assert {"AudioPart", "FilePart", "ImagePart", "TextPart"} <= set(streamengine.__all__)
    assert "PartsPolicy" in streamengine.web.__all__ and "PartsPolicy" in streamengine.wsgi.__all__
    assert streamengine.wsgi.PartsPolicy is streamengine.web.PartsPolicy
    assert streamengine.ImagePart("https://x.example/a.png").kind == "image"
