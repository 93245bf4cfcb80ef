"""Which messages a request may bring: the trust boundary between a browser and the provider.

A request body is written by whoever can reach the endpoint.  Forwarding it
as is would let that person speak as ``system`` or ``developer``, forge an
assistant's ``tool_calls`` and the ``tool`` results that answer them, and put
their own instructions ahead of the application's.  So by default a request
may carry only ``user`` and ``assistant`` messages with plain text, the last
one the user's; the system prompt is the application's, set on the server.
Trusted callers (a backend of your own) can widen that with ``trusted=True``.

:func:`messages_from_request` is public so a Flask or Django view builds its
messages with exactly the rules this package's own endpoint uses.
"""
from __future__ import annotations

from typing import Any, List, Optional

from .._errors import ConfigError
from .._messages import Message, as_message
from .._validation import json_type

SEND = 'send {"messages": [{"role": "user", "content": "..."}]}'
_PUBLIC_ROLES = ("user", "assistant")
_PUBLIC_KEYS = frozenset({"role", "content"})


class RequestRejected(ValueError):
    """The request's messages break the policy; ``field`` names where (``messages[1].role``)."""

    def __init__(self, message: str, field: str = "messages") -> None:
        super().__init__(message)
        self.field = field


def messages_from_request(payload: Any, *, system_prompt: Optional[str] = None,
                          trusted: bool = False) -> List[Message]:
    """The conversation to run for a decoded JSON request body ``{"messages": [...]}``.

    Untrusted (the default): only ``{"role": "user"|"assistant", "content": str}``
    messages, ending with a user message; anything else raises
    :class:`RequestRejected` naming the field.  ``system_prompt`` (yours, not the
    caller's) goes first.  ``trusted=True`` accepts every role and tool-call
    field :func:`~streamengine._messages.as_message` understands, still after
    ``system_prompt``.
    """
    raw = _raw_messages(payload)
    parsed = [_trusted_message(i, m) if trusted else _public_message(i, m) for i, m in enumerate(raw)]
    try:
        require_unicode("messages", raw)
    except RecursionError as exc:
        raise RequestRejected(f"messages are nested too deeply; {SEND}") from exc
    if not trusted and parsed[-1].role != "user":
        raise RequestRejected(f"messages[{len(raw) - 1}].role: the last message must be the user's question, "
                              f"got {parsed[-1].role!r}; "
                              f"end with {{\"role\": \"user\", \"content\": \"...\"}}", f"messages[{len(raw) - 1}].role")
    return with_system_prompt(parsed, system_prompt)


def with_system_prompt(messages: List[Message], system_prompt: Optional[str]) -> List[Message]:
    return ([Message(role="system", content=system_prompt)] if system_prompt else []) + messages


def _raw_messages(payload: Any) -> List[Any]:
    if not isinstance(payload, dict):
        raise RequestRejected(f"body must be a JSON object, got {json_type(payload)}; {SEND}", "body")
    if "messages" not in payload:
        raise RequestRejected(f"body has no \"messages\" field; {SEND}")
    messages = payload["messages"]
    if not isinstance(messages, list):
        raise RequestRejected(f"\"messages\" must be a list, got {json_type(messages)}; {SEND}")
    if not messages:
        raise RequestRejected(f"\"messages\" is empty; {SEND}")
    return messages


def _public_message(i: int, message: Any) -> Message:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be an object, got {json_type(message)}; {SEND}", where)
    role = message.get("role")
    if role not in _PUBLIC_ROLES:
        shown = repr(role) if isinstance(role, str) else json_type(role)
        raise RequestRejected(
            f"{where}.role {shown} is not accepted from a request; send \"user\" or \"assistant\" "
            "(the system prompt is the application's: make_wsgi_app(engine, system_prompt=...); "
            "tool messages come from the server's own runs)", f"{where}.role")
    extra = sorted(set(message) - _PUBLIC_KEYS)
    if extra:
        raise RequestRejected(
            f"{where}.{extra[0]} is not accepted from a request; send only "
            "{\"role\": \"user\"|\"assistant\", \"content\": \"text\"} (tool calls and their results "
            "are made by the server)", f"{where}.{extra[0]}")
    content = message.get("content")
    if not isinstance(content, str):
        raise RequestRejected(f"{where}.content must be a string, got {json_type(content)}; {SEND}",
                              f"{where}.content")
    return Message(role=role, content=content)


def _trusted_message(i: int, message: Any) -> Message:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestRejected(f"{where} must be an object, got {json_type(message)}; {SEND}", where)
    missing = [key for key in ("role", "content") if key not in message]
    if missing:
        raise RequestRejected(f"{where} has no {' or '.join(repr(k) for k in missing)}; each message "
                              "needs \"role\" (system, user, assistant or tool) and \"content\"", where)
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise RequestRejected(f"{where}.tool_calls must be a list of objects; send null or "
                              '[{"id": "...", "function": {"name": "...", "arguments": "{}"}}]',
                              f"{where}.tool_calls")
    try:
        return as_message(message)
    except (ConfigError, TypeError, ValueError, AttributeError) as exc:  # the last three: odd tool_calls
        raise RequestRejected(f"{where} is invalid: {clip(str(exc), 300)}; {SEND}", where) from exc


def require_unicode(where: str, value: Any) -> None:
    """Refuse unpaired surrogates anywhere in the messages.

    JSON may carry ``\\ud83d`` alone; that is not text, has no UTF-8 form, and
    would only fail the provider request mid-run instead of here.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestRejected(f"{where} contains an unpaired surrogate (\\u{ord(value[exc.start]):04x} at "
                                  f"position {exc.start}); send valid Unicode text", where) from exc
    elif isinstance(value, list):
        for i, item in enumerate(value):
            require_unicode(f"{where}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            require_unicode(f"{where} key", key)
            require_unicode(f"{where}.{key}", item)


def clip(text: str, limit: int) -> str:
    """Errors quote what was sent; a megabyte of it helps nobody."""
    return text if len(text) <= limit else text[:limit - 1] + "…"
