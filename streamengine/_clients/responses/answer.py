"""Responses answers and errors -> our Response, Usage, finish reasons and exceptions.

Shared by the stream parser (``response.completed`` / ``incomplete`` /
``failed`` carry a whole response object) and the buffered call (whose
answer is that object).  Errors are classified by the OpenAI wire's
in-band rule (``openai/errors.raise_in_band_error``), so failover sees the
same exception for the same error on either OpenAI wire.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional

from ..._errors import LlmProtocolError
from ..._messages import Response, ToolCall, Usage
from ..openai.errors import raise_in_band_error
from ..openai.parse import _usage

#: ``incomplete_details.reason`` -> the finish reasons the engine knows (Chat Completions' names).
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}

Redact = Callable[[str], str]


def usage_of(raw: Any) -> Optional[Usage]:
    """A Responses ``usage`` object as :class:`Usage` (cached and reasoning tokens from its ``*_details``);
    absurd counts (``-5``, ``"x"``) mean no usage."""
    return _usage(raw, "input_tokens", "output_tokens")


def finish_reason_of(response: Mapping[str, Any], made_calls: bool, incomplete: bool = False) -> str:
    """The finish reason of a finished response: ``length``, ``content_filter``, ``tool_calls`` or ``stop``.

    ``incomplete`` says it came with ``response.incomplete``: cut off even
    when the object does not say why (``length``, the usual reason).
    """
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    if incomplete or response.get("status") == "incomplete" or reason:
        return INCOMPLETE_REASONS.get(reason, reason) if isinstance(reason, str) and reason else "length"
    return "tool_calls" if made_calls else "stop"


def raise_error(error: Any, url: str, redact: Redact, after: Optional[int] = None) -> None:
    """Raise for a Responses error object: an ``error`` event (flat or nested) or ``response.error``.

    Flat: ``{"type": "error", "code": ..., "message": ...}``; nested:
    ``{"type": "error", "error": {"type": ..., "code": ..., "message": ...}}``;
    a failed response's ``error`` is ``{"code": ..., "message": ...}``.
    """
    if isinstance(error, Mapping) and isinstance(error.get("error"), Mapping):
        error = error["error"]
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    kind = error.get("type") if error.get("type") != "error" else None
    fields = {"message": error.get("message") or json.dumps(dict(error))[:300], "type": kind,
              "code": error.get("code")}
    fields.update((key, error[key]) for key in ("status", "status_code", "param") if error.get(key) is not None)
    raise_in_band_error({"error": {k: v for k, v in fields.items() if v is not None}}, url, redact, after=after)
    raise AssertionError("raise_in_band_error raises for every error")  # pragma: no cover


def response_from_json(payload: Any, url: str, redact: Redact) -> Response:
    """A non-streamed response object as a :class:`Response`; a failed one raises as the stream would."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("output"), list):
        raise LlmProtocolError(
            f"a Responses answer must be a JSON object with an 'output' list, got "
            f"{redact(json.dumps(payload)[:300])}; is base_url an API root that serves /responses (ending in /v1)?")
    if payload.get("status") == "failed" or payload.get("error"):
        raise_error(payload.get("error") or {"message": "the response failed"}, url, redact)
    found = output_of(payload["output"])
    return Response(content=found.text, tool_calls=tuple(found.calls), usage=usage_of(payload.get("usage")),
                    model=_text(payload.get("model")), finish_reason=finish_reason_of(payload, bool(found.calls)),
                    refusal=found.refusal or None, reasoning=found.reasoning or None, id=_text(payload.get("id")))


class Output(NamedTuple):
    """What a response's ``output`` items hold, by kind."""

    text: str
    refusal: str
    reasoning: str
    calls: List[ToolCall]


def output_of(items: List[Any]) -> Output:
    """The ``message`` items' text and refusals, the ``reasoning`` items' summaries (or text), the calls."""
    parts: Dict[str, List[str]] = {"output_text": [], "refusal": [], "reasoning": []}
    calls: List[ToolCall] = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, Mapping) and part.get("type") in ("output_text", "refusal"):
                    _add_text(parts[part["type"]], part.get("text" if part["type"] == "output_text" else "refusal"))
        elif kind == "reasoning":
            for part in (item.get("summary") or item.get("content") or ()):
                if isinstance(part, Mapping):
                    _add_text(parts["reasoning"], part.get("text"))
        elif kind == "function_call":
            calls.append(call_of(item, position))
    return Output("".join(parts["output_text"]), "".join(parts["refusal"]), "".join(parts["reasoning"]), calls)


def _add_text(into: List[str], value: Any) -> None:
    if isinstance(value, str):
        into.append(value)


def call_of(item: Mapping[str, Any], position: int) -> ToolCall:
    """A ``function_call`` item as a call: its ``call_id`` (not the ``fc_`` item id) is the call's id."""
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments) if isinstance(arguments, dict) else "{}"
    return ToolCall(id=_text(item.get("call_id")) or _text(item.get("id")) or f"call_{position}",
                    name=_text(item.get("name")) or "", arguments=arguments or "{}")


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None
