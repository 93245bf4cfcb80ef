"""EngineConfig and the output caps: the limits and settings every run of an engine uses, checked once.

A config is frozen and validated on construction, so a typo fails where it is
written and not after the first paid model call; a crossed output cap is told
one way (:func:`output_limit_error`).

The caps on what a model may send in one call and one run, and the one way a crossed cap is told.

Memory per run is bounded by configuration, never by what a provider sends:
without caps a fast stream grew a 439 MB answer in 10 s.  The caps are
checked where output accumulates (``_accumulate``: per call; the round's
stream: the run's total), before the chunk that crosses one is kept.

EngineConfig: the limits and settings every run of an engine uses, checked once.

A config is frozen and validated on construction, so a typo fails where it
is written and not after the first paid model call.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import InitVar, dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

from . import _validation as validation
from ._errors import ConfigError, LlmOutputLimitError
from ._messages import MAX_ARGUMENT_CHARS, Chunk, CompletionOptions, Response

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
        check_length("reasoning items", sum(item.size for item in response.provider_items), self.reasoning_chars,
                      "EngineConfig.max_reasoning_chars")
        check_length("refusal", len(response.refusal or ""), self.answer_chars, "EngineConfig.max_answer_chars")
        for call in response.tool_calls:
            check_length("tool arguments", len(call.arguments), self.tool_argument_chars,
                          "EngineConfig.max_tool_argument_chars")


def check_length(what: str, length: int, limit: int, setting: str) -> None:
    if length > limit:
        raise output_limit_error(what, limit, setting)


def output_chars(chunk: Chunk) -> int:
    """Characters of model output in one chunk: text, reasoning, refusal, provider items and tool-call fragments.

    A tool-call delta costs one character more than it carries: an empty one
    may open a call (memory), so a stream of them is not free.
    """
    total = len(chunk.content or "") + len(chunk.reasoning or "") + len(chunk.refusal or "")
    for item in chunk.provider_items:
        total += item.size
    for delta in chunk.tool_calls or ():
        total += 1 + len(delta.arguments_fragment or "") + len(delta.name or "") + len(delta.id or "")
    return total


#: ``inline``: tools are called with ``<tool name="...">{...}</tool>`` blocks in the
#: answer text; ``native``: with the provider's tool-call API; ``auto``: both.
TOOL_MODES = ("auto", "inline", "native")

#: The one default cap on a model call, everywhere (engine, strategies, CLI): ten
#: minutes, the openai SDK's too.  A reasoning model may think for minutes before
#: it answers, and a buffered call sends nothing until it is done; a stream that
#: stalls is ended much sooner by ``idle_timeout``, which only model output resets.
DEFAULT_COMPLETION_TIMEOUT_S = 600.0

#: What waiting filings may hold: 64 MiB is some 13,000 results of 4,000 characters.
DEFAULT_MAX_FILING_BYTES = 64 * 1024 * 1024

_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(CompletionOptions))


@dataclass(frozen=True)
class EngineConfig:
    """Limits and settings for every run of an engine; validated on construction.

    ``model="m"`` is shorthand for ``models=["m"]``.  ``options`` may be a
    :class:`CompletionOptions` or a plain mapping such as
    ``{"temperature": 0.2}`` (keys that are not CompletionOptions fields go
    to ``extra``, i.e. into the request body as they are).

    ``max_answer_chars`` (one round's answer, and apart its refusal),
    ``max_reasoning_chars`` (one round's reasoning), ``max_tool_argument_chars``
    (each native call's arguments) and ``max_run_output_chars`` (all a run
    receives) bound memory by configuration, not by what a provider sends;
    the defaults are several times the longest output any model offers
    (see ``OutputLimits``).  Crossing one ends the round with
    ``stop_reason="output_limit"``.

    ``max_filing_bytes`` bounds what tool results waiting to be filed in the
    RAG store may hold (their text plus 1 KiB each); past it a filing is
    refused with the cause (the store is stuck, or cannot keep up).

    ``approval_timeout`` bounds how long one ``approve`` question may stay
    unanswered; past it the call is refused (``skipped="not_approved"``).
    """

    models: Sequence[str] = ()
    max_continuations: int = 3
    max_tools_per_round: int = 3
    max_tools_total: int = 5
    tool_timeout: float = 30.0
    idle_timeout: float = 30.0
    completion_timeout: float = DEFAULT_COMPLETION_TIMEOUT_S
    allowed_tools: Optional[Iterable[str]] = None
    tool_mode: str = "auto"
    options: Union[CompletionOptions, Mapping[str, Any], None] = None
    max_block_chars: int = 16384
    pool_size: int = 32
    tool_queue_timeout: float = 10.0
    max_retries: int = 2
    chunk_size: int = 800
    chunk_overlap: int = 100
    embed_model: Optional[str] = None
    ingest_tool_results: bool = True
    filing_timeout: float = 5.0
    max_filing_bytes: int = DEFAULT_MAX_FILING_BYTES
    failover_after_tokens: bool = False
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS
    max_reasoning_chars: int = DEFAULT_MAX_ANSWER_CHARS
    max_tool_argument_chars: int = MAX_ARGUMENT_CHARS
    max_run_output_chars: int = DEFAULT_MAX_RUN_OUTPUT_CHARS
    approval_timeout: float = 300.0
    model: InitVar[Optional[str]] = None

    def __post_init__(self, model: Optional[str]) -> None:
        object.__setattr__(self, "models", _models(self.models, model))
        for field_name in ("max_continuations", "max_tools_per_round", "max_tools_total", "max_retries"):
            validation.count(getattr(self, field_name), f"EngineConfig.{field_name}")
        for field_name in ("max_block_chars", "pool_size", "chunk_size", "max_answer_chars", "max_reasoning_chars",
                           "max_tool_argument_chars", "max_run_output_chars", "max_filing_bytes"):
            validation.count(getattr(self, field_name), f"EngineConfig.{field_name}", minimum=1)
        validation.count(self.chunk_overlap, "EngineConfig.chunk_overlap")
        if self.max_tool_argument_chars > MAX_ARGUMENT_CHARS:
            raise ConfigError(f"EngineConfig.max_tool_argument_chars ({self.max_tool_argument_chars}) must be at most "
                              f"{MAX_ARGUMENT_CHARS}: a tool call with longer arguments is never run")
        if self.chunk_overlap >= self.chunk_size:
            raise ConfigError(f"EngineConfig.chunk_overlap ({self.chunk_overlap}) must be smaller "
                              f"than chunk_size ({self.chunk_size})")
        if not isinstance(self.failover_after_tokens, bool):
            raise ConfigError(f"EngineConfig.failover_after_tokens must be True or False, "
                              f"got {self.failover_after_tokens!r}")
        for field_name in ("tool_timeout", "idle_timeout", "completion_timeout", "filing_timeout",
                           "tool_queue_timeout", "approval_timeout"):
            validation.seconds(getattr(self, field_name), f"EngineConfig.{field_name}")
        if self.tool_mode not in TOOL_MODES:
            raise ConfigError(f"EngineConfig.tool_mode must be one of {', '.join(TOOL_MODES)}, "
                              f"got {self.tool_mode!r}")
        object.__setattr__(self, "options", completion_options(self.options, "EngineConfig.options"))
        if self.allowed_tools is not None:
            if isinstance(self.allowed_tools, str):
                raise ConfigError("EngineConfig.allowed_tools must be a collection of tool names, "
                                  f"not one string ({self.allowed_tools!r}); use [{self.allowed_tools!r}]")
            object.__setattr__(self, "allowed_tools", frozenset(self.allowed_tools))

    @property
    def output_limits(self) -> OutputLimits:
        """The per-call caps a call strategy enforces (the run's total is kept by the round)."""
        return OutputLimits(self.max_answer_chars, self.max_reasoning_chars, self.max_tool_argument_chars)

    @property
    def uses_inline_tools(self) -> bool:
        return self.tool_mode in ("inline", "auto")

    @property
    def uses_native_tools(self) -> bool:
        return self.tool_mode in ("native", "auto")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> EngineConfig:
        """``STREAMENGINE_MODEL`` (comma-separated failover list) plus keyword overrides."""
        env = os.environ if environ is None else environ
        raw = env.get("STREAMENGINE_MODEL", "")
        models = [m.strip() for m in raw.split(",") if m.strip()]
        if not models and "models" not in overrides and "model" not in overrides:
            raise ConfigError("no model configured: set STREAMENGINE_MODEL (e.g. 'gpt-4o-mini' or "
                              "'primary,fallback') or pass EngineConfig(models=[...])")
        if "model" not in overrides:
            overrides.setdefault("models", models)
        return cls(**overrides)


def _models(models: Union[str, Iterable[str], None], model: Optional[str]) -> Tuple[str, ...]:
    """The failover list from ``models=`` or the one-model shorthand ``model=``."""
    if model is not None:
        validation.name(model, "EngineConfig.model")
        if models:
            raise ConfigError(f"EngineConfig got both model={model!r} and models={models!r}; pass one: "
                              f"models=[primary, fallback, ...] or model='one-model'")
        return (model,)
    listed = [models] if isinstance(models, str) else list(models or ())
    if not listed or not all(isinstance(m, str) and m.strip() for m in listed):
        raise ConfigError(
            f"EngineConfig.models must be a non-empty list of model names (first = primary), "
            f"got {models!r}; e.g. EngineConfig(models=['gpt-4o-mini']) or EngineConfig(model='gpt-4o-mini')")
    return tuple(listed)


def completion_options(value: object, what: str) -> Optional[CompletionOptions]:
    """``value`` as :class:`CompletionOptions`: kept if it is one, built if it is a mapping.

    Keys of the mapping that are CompletionOptions fields set them; the rest
    go to ``extra`` (merged into the request body as they are).  ``model`` is
    refused: the engine sets it from the failover list.
    """
    if value is None or isinstance(value, CompletionOptions):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be a CompletionOptions or a mapping such as "
                          f"{{'temperature': 0.2}}, got {type(value).__name__}")
    if "model" in value:
        raise ConfigError(f"{what} must not set 'model': the engine picks it from models=[...] "
                          "(first = primary); put the model there")
    known = {key: item for key, item in value.items() if key in _OPTION_FIELDS and key != "extra"}
    extra = dict(value.get("extra") or {})
    extra.update({key: item for key, item in value.items() if key not in _OPTION_FIELDS})
    return CompletionOptions(**known, extra=extra or None)
