"""The caps on what a model may send in one call and one run, and the one way a crossed cap is told.

Memory per run is bounded by configuration, never by what a provider sends:
without caps a fast stream grew a 439 MB answer in 10 s.  The caps are
checked where output accumulates (``_accumulate``: per call; the round's
stream: the run's total), before the chunk that crosses one is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

from ._errors import LlmOutputLimitError
from ._messages import MAX_ARGUMENT_CHARS, Chunk, Response

__all__ = ["DEFAULT_MAX_ANSWER_CHARS", "DEFAULT_MAX_RUN_OUTPUT_CHARS", "OutputLimits", "check_length",
           "output_chars", "output_limit_error"]

#: The default cap on one round's answer text (and, apart, its reasoning and its refusal), in
#: characters.  The longest output any model offers today is 128k tokens, about 512k characters
#: of English (some 4 a token): 2M is four times that, so a real answer never meets it, while a
#: runaway stream stops at a few MB of memory instead of growing until the completion timeout.
DEFAULT_MAX_ANSWER_CHARS = 2_000_000
#: The default cap on everything one run receives (all rounds' text, reasoning, refusals, tool
#: arguments): the default four rounds (``max_continuations=3``), each at the answer cap.
DEFAULT_MAX_RUN_OUTPUT_CHARS = 4 * DEFAULT_MAX_ANSWER_CHARS


def output_limit_error(what: str, limit: int, setting: str) -> LlmOutputLimitError:
    """The one wording of a crossed cap: which output, which setting, what to do."""
    return LlmOutputLimitError(
        f"the model's {what} passed the {limit} character cap ({setting}); the round was ended "
        f"and what was already shown is kept; raise {setting} if real answers need more",
        what=what, limit=limit)


@dataclass(frozen=True)
class OutputLimits:
    """Caps, in characters, on what one model call may send; the engine fills them from EngineConfig.

    ``answer_chars`` caps the answer text and, apart, the refusal;
    ``reasoning_chars`` a thinking model's reasoning; ``tool_argument_chars``
    each native tool call's arguments (never above the
    ``MAX_ARGUMENT_CHARS`` a call may be run with).
    """

    answer_chars: int = DEFAULT_MAX_ANSWER_CHARS
    reasoning_chars: int = DEFAULT_MAX_ANSWER_CHARS
    tool_argument_chars: int = MAX_ARGUMENT_CHARS

    def check(self, response: Response) -> None:
        """A whole response (a buffered call) against the same caps a stream meets as it flows."""
        check_length("answer", len(response.content or ""), self.answer_chars, "EngineConfig.max_answer_chars")
        check_length("reasoning", len(response.reasoning or ""), self.reasoning_chars,
                      "EngineConfig.max_reasoning_chars")
        check_length("refusal", len(response.refusal or ""), self.answer_chars, "EngineConfig.max_answer_chars")
        for call in response.tool_calls:
            check_length("tool arguments", len(call.arguments), self.tool_argument_chars,
                          "EngineConfig.max_tool_argument_chars")


def check_length(what: str, length: int, limit: int, setting: str) -> None:
    if length > limit:
        raise output_limit_error(what, limit, setting)


def output_chars(chunk: Chunk) -> int:
    """Characters of model output in one chunk: text, reasoning, refusal and tool-call fragments.

    A tool-call delta costs one character more than it carries: an empty one
    may open a call (memory), so a stream of them is not free.
    """
    total = len(chunk.content or "") + len(chunk.reasoning or "") + len(chunk.refusal or "")
    for delta in chunk.tool_calls or ():
        total += 1 + len(delta.arguments_fragment or "") + len(delta.name or "") + len(delta.id or "")
    return total
