"""The records a run passes around: messages, chunks, responses, tool calls and results, the tool's context.

The data that flows between provider, engine and caller: small frozen dataclasses.

Frozen so that a chunk handed to an observer cannot be changed under the
engine; plain dicts (``{"role": ..., "content": ...}``) are accepted wherever
messages are taken and turned into :class:`Message` by :func:`as_message`.

What a running tool may look at to stop early: :class:`ToolContext`.

Its own module because it is the one piece of tool data with behaviour
(clocks, a cancel event, pickling across processes); the plain records a
call produces (:class:`~streamengine._messages.ToolResult`) stay with the
other data in ``_messages``.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from ._errors import ConfigError, ToolError
from ._parts import Part, has_media, parse_parts, text_of

_T = TypeVar("_T")

MAX_ARGUMENT_CHARS = 1_000_000
#: Deeper arguments are refused before ``json.loads`` sees them.  Parsing them
#: would run ``json`` to the interpreter's recursion limit: slow, and any
#: finaliser the garbage collector happens to run at that depth fails too.
MAX_ARGUMENT_DEPTH = 128

# A JSON string (escapes followed) or one bracket: strings are skipped whole.
_NESTING_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)


def unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` for tool arguments: a key given twice is an error.

    With plain ``json.loads`` the last one wins silently, so ``{"to": "bob", "to": "eve"}``
    would mean something else to a reader (or a reviewing approver) than to the tool.
    """
    obj: Dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} appears twice in one object")
        obj[key] = value
    return obj


def too_deep(text: str, limit: int = MAX_ARGUMENT_DEPTH) -> bool:
    """Whether JSON ``text`` nests brackets deeper than ``limit``; linear, no recursion.

    The bracket count is the cheap test: only text with more than ``limit``
    brackets can be that deep, and only then is it scanned.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for match in _NESTING_TOKEN.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > limit:
                return True
        elif token == "]" or token == "}":
            depth -= 1
    return False


@dataclass(frozen=True)
class ToolCall:
    """A complete tool call; ``arguments`` is the JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str = "{}"

    def args(self) -> Dict[str, Any]:
        """Parse ``arguments``; an empty text means no arguments."""
        text = self.arguments.strip()
        if not text:
            return {}
        if len(text) > MAX_ARGUMENT_CHARS:
            raise ToolError(
                f"arguments of tool call {self.name!r} are {len(text)} characters, over the "
                f"{MAX_ARGUMENT_CHARS} limit; ask the model for smaller arguments"
            )
        if too_deep(text):
            raise ToolError(
                f"arguments of tool call {self.name!r} are not valid JSON for a tool: they nest deeper "
                f"than {MAX_ARGUMENT_DEPTH} levels; expected a JSON object such as {{\"query\": \"...\"}}"
            )
        try:
            value = json.loads(text, object_pairs_hook=unique_keys)  # the inline blocks' rule, too
        except (ValueError, RecursionError) as exc:
            raise ToolError(
                f"arguments of tool call {self.name!r} are not valid JSON ({exc}); "
                f"expected a JSON object such as {{\"query\": \"...\"}}"
            ) from exc
        if not isinstance(value, dict):
            raise ToolError(
                f"arguments of tool call {self.name!r} must be a JSON object, got {type(value).__name__}"
            )
        return value

    def to_openai(self) -> Dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed fragment of a native tool call, keyed by ``index``.

    ``done`` says the call is complete with this fragment: a wire that marks
    the end of each call (Anthropic's ``content_block_stop``, the Responses
    API's ``output_item.done``) says so, and the call is dispatched at once.
    Chat Completions marks no end, so its calls close as the accumulator infers.
    """

    index: int
    id: Optional[str] = None
    name: Optional[str] = None
    arguments_fragment: Optional[str] = None
    done: bool = False


@dataclass(frozen=True)
class Usage:
    """Token counts; ``cached_tokens`` (of the prompt) and ``reasoning_tokens`` (of the completion) are
    the parts a provider reports separately, 0 where it does not."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )


@dataclass(frozen=True)
class ProviderItem:
    """Something a provider sent that it needs back, verbatim, for a tool-using answer to go on.

    Anthropic's ``thinking`` blocks (with their ``signature``) and
    ``redacted_thinking`` blocks, the Responses API's ``reasoning`` items
    (with ``encrypted_content`` when asked for): opaque to the engine, never
    shown nor mixed into the answer, sent back only on the ``wire`` that made
    them.  ``data`` is the JSON object as received; ``size`` its length as
    JSON in characters (computed when not given), counted against
    ``EngineConfig.max_reasoning_chars``: the whole item is kept, its
    thinking text included, so the text counts there as well as in
    ``reasoning``.
    """

    wire: str
    data: Mapping[str, Any]
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:  # an item made without its size still counts against the caps
            object.__setattr__(self, "size", len(json.dumps(self.data, ensure_ascii=False)))


def items_for(wire: str, items: Sequence[ProviderItem]) -> List[Dict[str, Any]]:
    """The ``data`` of the items ``wire`` made, as fresh dicts to send back (another wire's are dropped)."""
    return [dict(item.data) for item in items if item.wire == wire]


@dataclass(frozen=True)
class Message:
    """One message of a conversation.

    ``parts`` holds the content parts of a message sent as a list (text,
    images, audio, files: ``_parts``); ``content`` is then their text,
    joined, so whatever reads text reads it there.  Empty for a plain string.

    ``provider_items`` (assistant turns the engine builds) are what the
    provider must get back with this turn (:class:`ProviderItem`); each wire
    sends its own and the Chat Completions wire none.
    """

    role: str
    content: str = ""
    tool_calls: Tuple[ToolCall, ...] = ()
    tool_call_id: Optional[str] = None
    name: Optional[str] = None
    parts: Tuple[Part, ...] = ()
    provider_items: Tuple[ProviderItem, ...] = ()

    @property
    def has_media(self) -> bool:
        """Whether the message carries more than text (an image, audio, a file)."""
        return has_media(self.parts)

    def to_openai(self) -> Dict[str, Any]:
        """The wire form; ``content`` is null only for an assistant turn made of tool calls."""
        content: Any = [part.to_openai() for part in self.parts] if self.parts else self.content
        out: Dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
            if not self.content:
                out["content"] = None
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


MessageLike = Union[Message, Mapping[str, Any]]


def _tool_call_from_dict(raw: Mapping[str, Any]) -> ToolCall:
    function = raw.get("function") or {}
    return ToolCall(
        id=str(raw.get("id", "")),
        name=str(function.get("name", raw.get("name", ""))),
        arguments=function.get("arguments", raw.get("arguments", "{}")) or "{}",
    )


def as_message(value: MessageLike) -> Message:
    """Accept a :class:`Message` or an OpenAI-style dict; reject anything else clearly."""
    if isinstance(value, Message):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"a message must be a Message or a dict like {{'role': 'user', 'content': '...'}}, "
            f"got {type(value).__name__}"
        )
    role = value.get("role")
    if not isinstance(role, str) or not role:
        raise ConfigError(f"message {dict(value)!r} has no 'role'; use 'system', 'user', 'assistant' or 'tool'")
    content, parts = message_content(value.get("content"), role)
    calls = tuple(
        c if isinstance(c, ToolCall) else _tool_call_from_dict(c) for c in (value.get("tool_calls") or ())
    )
    return Message(role=role, content=content, tool_calls=calls,
                   tool_call_id=value.get("tool_call_id"), name=value.get("name"), parts=parts)


def message_content(content: Any, role: str, where: str = "") -> Tuple[str, Tuple[Part, ...]]:
    """A message's text and parts: a string, None, or a list of OpenAI content parts (user messages: any kind).

    ``where`` names the content in errors (``messages[2].content``).
    """
    if content is None:
        return "", ()
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, (list, tuple)):
        raise ConfigError(f"message content must be a string or a list of content parts "
                          f"([{{'type': 'text', 'text': '...'}}, {{'type': 'image_url', ...}}]), "
                          f"got {type(content).__name__}")
    parts = parse_parts(content, where or f"{role} message content")
    media = next((p for p in parts if p.kind != "text"), None)
    if media is not None and role != "user":
        raise ConfigError(f"{role!r} messages may hold only text parts ({media.describe()} found); "
                          f"images, audio and files go in a user message")
    return text_of(parts), parts


def as_messages(values: Iterable[MessageLike]) -> List[Message]:
    if isinstance(values, (str, bytes, Mapping)):
        raise ConfigError(
            "messages must be a list of messages, e.g. [{'role': 'user', 'content': 'hi'}], "
            f"got a single {type(values).__name__}"
        )
    return [as_message(v) for v in values]


#: The program's name, as the command line, the server and their messages say it.
PROG = "streamengine"

#: How the engine starts the visible warning it puts into an answer when the
#: model fails before any text: one home, read by the engine, the CLI, the web
#: layer and (through a data attribute) the page.
LLM_WARNING = "\u26a0\ufe0f LLM error: "


@dataclass(frozen=True)
class Chunk:
    """One parsed provider frame.  Only a meaningful chunk resets the idle timer.

    ``is_meaningful`` (content, reasoning, a refusal, a tool-call delta, or
    completion: anything the model produced) is computed once, here, because
    every layer above asks it per chunk.  ``refusal`` is the text of a
    refusal (OpenAI's ``delta.refusal``): not the answer, but model output.
    ``text_only`` (answer text and at most the model's name, nothing else:
    nearly every frame) is computed here too, so the layers above take such
    a chunk with one test instead of one per field.  ``response_id`` is the
    provider's id for the whole answer (``chatcmpl-...``, ``msg_...``,
    ``resp_...``), on whichever chunk the wire carries it: not model output.
    ``provider_items`` are what the provider needs back (:class:`ProviderItem`),
    each on the chunk that completes it.
    """

    content: Optional[str] = None
    reasoning: Optional[str] = None
    tool_calls: Tuple[ToolCallDelta, ...] = ()
    is_completed: bool = False
    usage: Optional[Usage] = None
    finish_reason: Optional[str] = None
    model: Optional[str] = None
    refusal: Optional[str] = None
    response_id: Optional[str] = None
    provider_items: Tuple[ProviderItem, ...] = ()

    # Written by hand, not generated: one chunk is built per provider frame
    # (100k+/s), and the generated frozen __init__ pays an object.__setattr__
    # call per field (~1.1 us a chunk); storing into __dict__ costs a third.
    # Same signature and defaults as the generated one; @dataclass keeps it.
    def __init__(self, content: Optional[str] = None, reasoning: Optional[str] = None,
                 tool_calls: Tuple[ToolCallDelta, ...] = (), is_completed: bool = False,
                 usage: Optional[Usage] = None, finish_reason: Optional[str] = None,
                 model: Optional[str] = None, refusal: Optional[str] = None,
                 response_id: Optional[str] = None, provider_items: Tuple[ProviderItem, ...] = ()) -> None:
        d = self.__dict__
        d["content"] = content
        d["reasoning"] = reasoning
        d["tool_calls"] = tool_calls
        d["is_completed"] = is_completed
        d["usage"] = usage
        d["finish_reason"] = finish_reason
        d["model"] = model
        d["refusal"] = refusal
        d["response_id"] = response_id
        d["provider_items"] = provider_items
        rest = reasoning or tool_calls or is_completed or refusal or provider_items
        d["is_meaningful"] = bool(content or rest)
        d["text_only"] = bool(content) and not (rest or usage is not None or finish_reason or response_id)

    if TYPE_CHECKING:  # read-only attributes set by __init__ (frozen like the fields), not __init__'s parameters
        is_meaningful: bool = field(init=False)
        text_only: bool = field(init=False)


_new_object = object.__new__
#: A text chunk's fields, in __init__'s order, as __init__ itself sets them (content and model replaced per chunk).
_TEXT_FIELDS = dict(Chunk("text").__dict__)


def text_chunk(content: str, model: Optional[str]) -> Chunk:
    """``Chunk(content, model=model)`` for a non-empty ``content``: the chunk of nearly every frame.

    Built from a template in one dict update, without ``__init__``'s ten
    stores and its ``is_meaningful`` test (text is meaningful): a third less
    work per frame, and an equal chunk.
    """
    chunk = _new_object(Chunk)
    fields = chunk.__dict__
    fields.update(_TEXT_FIELDS)
    fields["content"] = content
    fields["model"] = model
    return chunk


class StopReason(str, enum.Enum):
    """Why a model round ended, or why a run stopped early: one name for each reason the package reports.

    ``Response.finish_reason`` and ``Telemetry.finish_reasons`` hold a round's
    reason (OpenAI's names; each wire's own are mapped onto them, and one the
    engine does not know is passed on as the provider's string);
    ``Telemetry.stop_reason`` holds the run's.  A ``str`` enum whose ``str()``
    and ``format()`` are its value: a member equals, prints, and is written to
    JSON and SSE as the plain string it replaced (``"cancelled"``).
    """

    # How a model round ended.
    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    # Why a run stopped before a normal answer.
    CANCELLED = "cancelled"
    LLM_ERROR = "llm_error"
    LLM_ERROR_AFTER_TOKENS = "llm_error_after_tokens"
    MAX_CONTINUATIONS_REACHED = "max_continuations_reached"
    OUTPUT_LIMIT = "output_limit"
    INTERNAL_ERROR = "internal_error"

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)

    @classmethod
    def known(cls, reason: Optional[str]) -> Optional[str]:
        """``reason`` as a member when it names one, else as given (a provider's own reason, or None)."""
        return _STOP_REASONS.get(reason, reason) if reason else reason


_STOP_REASONS: Dict[Optional[str], StopReason] = {member.value: member for member in StopReason}


@dataclass(frozen=True)
class Response:
    """One whole answer of the model.

    ``refusal`` is the model's refusal text (None when it did not refuse):
    kept apart from ``content`` because it is not an answer to show as one.
    ``reasoning`` is what a thinking model thought (None without any).
    ``id`` is the provider's id for this answer (None when it sent none).
    ``provider_items`` are what the provider needs back with this answer to
    continue after its tool calls (:class:`ProviderItem`).
    """

    content: str = ""
    tool_calls: Tuple[ToolCall, ...] = ()
    usage: Optional[Usage] = None
    model: Optional[str] = None
    finish_reason: Optional[str] = None
    refusal: Optional[str] = None
    reasoning: Optional[str] = None
    id: Optional[str] = None
    provider_items: Tuple[ProviderItem, ...] = ()


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool: name, description, JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> Dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class CompletionOptions:
    """Per-call settings; ``extra`` is merged into the request JSON as is (and wins over a field).

    ``top_p`` comes after ``extra`` so that options built by position before it existed mean what they meant.
    """

    model: Optional[str] = None
    temperature: Optional[float] = None
    max_tokens: Optional[int] = None
    stop: Optional[Sequence[str]] = None
    extra: Optional[Mapping[str, Any]] = None
    top_p: Optional[float] = None

    def with_model(self, model: str) -> CompletionOptions:
        return dataclasses.replace(self, model=model)

    def merged(self, override: Optional[CompletionOptions]) -> CompletionOptions:
        """These options with ``override``'s set fields on top (``extra`` merged key by key)."""
        if override is None:
            return self
        extra = {**(self.extra or {}), **(override.extra or {})}
        return CompletionOptions(_pick(self.model, override.model), _pick(self.temperature, override.temperature),
                                 _pick(self.max_tokens, override.max_tokens), _pick(self.stop, override.stop),
                                 extra or None, _pick(self.top_p, override.top_p))

    def to_body(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if self.model is not None:
            body["model"] = self.model
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.stop is not None:
            body["stop"] = list(self.stop)
        if self.extra:
            body.update(self.extra)
        return body


def _pick(mine: Optional[_T], theirs: Optional[_T]) -> Optional[_T]:
    """The override's value when it set one, else ours."""
    return mine if theirs is None else theirs


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one call; errors (invalid, skipped, timed out, raised) have ``ok=False``.

    ``text`` is the tool's output (empty for errors); ``error`` says what went
    wrong.  ``started_at``/``ended_at`` are ``time.monotonic()`` values, 0.0
    when the function never ran.  ``timed_out`` lets telemetry count timeouts
    without parsing messages.
    """

    call_id: str
    name: str
    ok: bool
    text: str
    error: Optional[str] = None
    duration_s: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    timed_out: bool = False
    queue_wait_s: float = 0.0

    @classmethod
    def error_result(
        cls,
        call: ToolCall,
        message: str,
        *,
        duration_s: float = 0.0,
        started_at: float = 0.0,
        ended_at: float = 0.0,
        timed_out: bool = False,
        queue_wait_s: float = 0.0,
    ) -> ToolResult:
        """An error result for ``call`` (skips, refusals, failures) carrying ``message``."""
        return cls(call.id, call.name, False, "", message, duration_s, started_at, ended_at, timed_out, queue_wait_s)


@dataclass(frozen=True)
class ToolContext:
    """What a running tool may look at to stop early.

    Declare a parameter annotated ``ToolContext`` (any name) to receive it; it
    is injected, never shown to the model.  ``cancelled`` turns true when the
    call is cancelled *or* its deadline has passed, so a polling loop stops on
    time even before anyone has noticed the timeout.
    """

    cancel_event: threading.Event = field(default_factory=threading.Event)
    deadline: Optional[float] = None  # time.monotonic() value; None = no deadline

    def __reduce__(self) -> Tuple[Any, Tuple[Optional[float]]]:
        """Pickle for a tool in another process: the deadline as wall-clock time, no cancel event.

        Monotonic clocks of two processes (or machines) share no origin; the
        epoch does.  An Event cannot cross processes: the remote side gets a
        fresh one, so there ``cancelled`` turns true at the deadline only.
        """
        return _context_at_wall_clock, (self.deadline_epoch,)

    @property
    def deadline_epoch(self) -> Optional[float]:
        """The deadline as ``time.time()`` seconds (None without one)."""
        if self.deadline is None:
            return None
        return time.time() + (self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative; ``inf`` without one)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise :class:`ToolError` if the tool should stop now."""
        if self.cancel_event.is_set():
            raise ToolError("cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise ToolError("cancelled: deadline passed")

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return False at once if cancelled or past the deadline."""
        wait_s = min(max(0.0, seconds), self.remaining())
        if self.cancel_event.wait(wait_s if wait_s != math.inf else None):
            return False
        return not self.cancelled


def _context_at_wall_clock(deadline_epoch: Optional[float]) -> ToolContext:
    """Unpickle a :class:`ToolContext`: the wall-clock deadline back on this process's monotonic clock."""
    if deadline_epoch is None:
        return ToolContext()
    return ToolContext(threading.Event(), time.monotonic() + (deadline_epoch - time.time()))
