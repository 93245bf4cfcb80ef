"""The public face: ``__all__`` is sorted, complete and importable."""
import inspect

import streamengine


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
    # A failing cancel callback is logged as a WARNING by streamengine._cancel.
    from streamengine._cancel import CancelToken

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
        assert any("cancel callback failed" in line and "streamengine._cancel" in line for line in lines)
        logger.remove(handler)
    finally:
        logger.remove(probe)
        logger.disable("streamengine")


def test_all_holds_what_a_user_needs_not_the_building_blocks():
    user_needs = {"StreamingEngine", "EngineConfig", "EngineResult", "TokenEvent", "DoneEvent", "ToolStartEvent",
                  "OpenAICompatibleClient", "ScriptedClient", "tool", "ToolRegistry", "ConfigError", "LlmError",
                  "SqliteRagStore", "enable_logging", "CancelToken", "CompletionOptions", "Message",
                  "ErrorClassifier", "ModelChunkEvent"}
    building_blocks = {"FeedResult", "ToolHandle", "make_call_strategy", "ToolCallAccumulator", "ResponseAggregator",
                       "EventEmitter", "XmlParseState", "InlineToolScanner", "ToolExecutor", "ModelFailover"}
    assert user_needs <= set(streamengine.__all__)
    assert building_blocks & set(streamengine.__all__) == set()


def test_building_blocks_stay_importable_from_their_modules_and_the_package():
    from streamengine._accumulate import ToolCallAccumulator
    from streamengine._calls.strategies import make_call_strategy
    from streamengine._inline.scanner import InlineToolScanner
    from streamengine.tools import ToolHandle

    assert streamengine._calls.strategies.make_call_strategy is make_call_strategy
    assert streamengine._accumulate.ToolCallAccumulator is ToolCallAccumulator
    assert streamengine.tools.ToolHandle is ToolHandle
    assert streamengine._inline.scanner.InlineToolScanner is InlineToolScanner


def test_xml_parse_state_is_a_deprecated_alias_of_the_inline_scanner():
    import warnings

    from streamengine._inline.scanner import InlineToolScanner

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from streamengine._inline.scanner import XmlParseState
    assert XmlParseState is InlineToolScanner
    assert any(issubclass(w.category, DeprecationWarning) and "InlineToolScanner" in str(w.message)
               for w in caught)
    try:
        streamengine.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
