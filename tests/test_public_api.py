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


def test_logging_is_disabled_until_enabled(capsys):
    from loguru import logger
    logger.bind(component="streamengine.test").warning("should be silent")
    assert "should be silent" not in capsys.readouterr().err
