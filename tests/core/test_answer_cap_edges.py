"""The answer cap at its edge: an answer of exactly ``max_answer_chars`` passes, one character more does not.

Over real HTTP to a FakeProvider, through the public engine.  The cap is
checked as the text accumulates (``_accumulate.ResponseAggregator.add``),
so each case is met in one chunk and split over two.
"""
from __future__ import annotations

from typing import Sequence

import pytest

from streamengine import EngineConfig, OpenAICompatibleClient, StreamingEngine
from streamengine.testing import FakeProvider
from streamengine.testing import steps as s

pytestmark = pytest.mark.usefixtures("no_thread_leak")

CAP = 10


def answer(pieces: Sequence[str]):
    with FakeProvider() as fp:
        fp.add_turn(*(s.text(piece) for piece in pieces))
        config = EngineConfig(models=["m"], max_answer_chars=CAP, idle_timeout=5, completion_timeout=10)
        with StreamingEngine(OpenAICompatibleClient(fp.base_url), config=config) as engine:
            return engine.complete([{"role": "user", "content": "q"}], raise_on_error=False)


@pytest.mark.parametrize("pieces", [["0123456789"], ["0123", "456789"]], ids=["one chunk", "two chunks"])
def test_an_answer_of_exactly_the_cap_passes(pieces):
    result = answer(pieces)
    assert result.answer == "0123456789" and result.error is None
    assert result.telemetry.stop_reason is None


@pytest.mark.parametrize("pieces", [["0123456789A"], ["0123", "456789A"]], ids=["one chunk", "two chunks"])
def test_one_character_over_the_cap_ends_the_round_at_the_output_limit(pieces):
    result = answer(pieces)
    assert result.telemetry.stop_reason == "output_limit"
    assert "max_answer_chars" in result.error and "10 character cap" in result.error
    assert "A" not in result.answer  # the chunk that crossed the cap is not kept
