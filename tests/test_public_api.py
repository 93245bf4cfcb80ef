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
    # A failing cancel callback is logged as a WARNING by streamengine.cancel.
    from streamengine.cancel import CancelToken

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
