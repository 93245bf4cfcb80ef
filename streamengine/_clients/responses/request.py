"""What the Responses client sends: our chat-shaped messages, tools and options as a Responses request.

Pure data, no I/O.  The translation follows what the API enforces:

* system messages become ``instructions`` (joined), the rest ``input`` items;
* an assistant turn is its text (a ``message`` item) followed by one
  ``function_call`` item per call, with the call's id as ``call_id``; a tool
  result is a ``function_call_output`` item with that ``call_id``.  The API
  answers 400 to an output whose call it has not seen, so the calls are
  always re-sent before their outputs -- the conversation order guarantees it;
* tools are ``function`` tools with ``strict: false``: the Responses API
  makes functions strict by default, and strict mode refuses every schema
  that does not list all properties as required;
* options the API refuses under their Chat Completions names are renamed
  (``max_tokens`` -> ``max_output_tokens``, ``reasoning_effort`` ->
  ``reasoning.effort``, a chat-shaped ``tool_choice``), ``stream_options``
  loses ``include_usage`` (usage always comes with ``response.completed``),
  and those with no equivalent (``stop``, ``n``...) are refused with a
  :class:`ConfigError` naming the option, before anything is sent.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..._errors import ConfigError
from ..._messages import CompletionOptions, Message, MessageLike, ToolSpec, as_messages

#: Chat Completions option names -> their Responses names.
RENAMED_OPTIONS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}

#: Chat Completions options the Responses API has no equivalent for, and what to do instead.
REFUSED_OPTIONS = {
    "stop": "the Responses API has no stop sequences; stop on the text yourself, or use the "
            "Chat Completions client (OpenAICompatibleClient)",
    "n": "the Responses API answers with one output; make several calls instead",
    "response_format": "the Responses API takes the format as text={'format': {...}} "
                       "(CompletionOptions(extra={'text': {'format': {'type': 'json_object'}}}))",
    "messages": "messages are passed as the conversation, not as an option",
}

# A tool result without the id of its call: text the model can still read.
_TOOL_RESULT_TEXT = "Tool result: {}"


def responses_body(messages: Sequence[MessageLike], tools: Optional[Sequence[ToolSpec]],
                   options: Optional[CompletionOptions], *, stream: bool) -> Dict[str, Any]:
    """The JSON body of ``POST {base_url}/responses``."""
    options = options or CompletionOptions()
    instructions, items = _input(as_messages(messages))
    body: Dict[str, Any] = {}
    if options.model is not None:
        body["model"] = options.model
    if instructions:
        body["instructions"] = instructions
    body["input"] = items
    if tools:
        body["tools"] = [_tool(spec) for spec in tools]
    if stream:
        body["stream"] = True
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.top_p is not None:
        body["top_p"] = options.top_p
    if options.max_tokens is not None:
        body["max_output_tokens"] = options.max_tokens
    if options.stop is not None:
        _refuse("stop", "CompletionOptions.stop")
    for name, value in (options.extra or {}).items():
        name, value = _translated_option(name, value)
        if name is not None:
            body[name] = value
    return body


def _input(messages: List[Message]) -> Tuple[str, List[Dict[str, Any]]]:
    system = [m.content for m in messages if m.role == "system" and m.content]
    items: List[Dict[str, Any]] = []
    for message in messages:
        if message.role != "system":
            items.extend(_items(message))
    return "\n\n".join(system), items


def _items(message: Message) -> List[Dict[str, Any]]:
    role = message.role
    if role == "user":
        return [{"type": "message", "role": "user", "content": message.content}]
    if role == "assistant":
        text = [{"type": "message", "role": "assistant", "content": message.content}] if message.content else []
        return text + [{"type": "function_call", "call_id": call.id, "name": call.name,
                        "arguments": call.arguments or "{}"} for call in message.tool_calls]
    if role == "tool":
        if not message.tool_call_id:  # nothing to attach it to: keep it as text the model can read
            return [{"type": "message", "role": "user", "content": _TOOL_RESULT_TEXT.format(message.content)}]
        return [{"type": "function_call_output", "call_id": message.tool_call_id, "output": message.content}]
    if role == "developer":
        return [{"type": "message", "role": "developer", "content": message.content}]
    raise ConfigError(f"message role {role!r} has no Responses form; use 'system', 'user', 'assistant' or 'tool'")


def _tool(spec: ToolSpec) -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": "function", "name": spec.name, "parameters": dict(spec.parameters),
                           "strict": False}
    if spec.description:
        out["description"] = spec.description
    return out


def _translated_option(name: str, value: Any) -> Tuple[Optional[str], Any]:
    """``(name, value)`` as the Responses API takes it; ``(None, _)`` to leave it out."""
    if name in REFUSED_OPTIONS:
        _refuse(name, f"the option {name!r}")
    if name in RENAMED_OPTIONS:
        return RENAMED_OPTIONS[name], value
    if name == "reasoning_effort":
        return "reasoning", {"effort": value}
    if name == "stream_options":
        kept = {k: v for k, v in value.items() if k != "include_usage"} if isinstance(value, Mapping) else value
        return ("stream_options", kept) if kept else (None, None)
    if name == "tool_choice":
        return name, _tool_choice(value)
    return name, value


def _tool_choice(value: Any) -> Any:
    """Chat's ``{"type": "function", "function": {"name": X}}`` is ``{"type": "function", "name": X}`` here."""
    if isinstance(value, Mapping) and isinstance(value.get("function"), Mapping):
        return {"type": "function", "name": value["function"].get("name")}
    return value


def _refuse(name: str, what: str) -> None:
    raise ConfigError(f"{what} cannot be sent to the Responses API: {REFUSED_OPTIONS[name]}")
