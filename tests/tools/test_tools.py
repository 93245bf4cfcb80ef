"""@tool, Tool, ToolContext, ToolResult, ToolRegistry: schema, validation, conversion (pure, in-memory)."""
from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import threading
import time
from typing import Annotated, Any, Callable, Dict, List, Literal, Optional, Sequence, Union

import pytest
from pydantic import BaseModel

from streamengine import ToolCall, ToolError, ToolSpec
from streamengine.tools import Tool, ToolContext, ToolRegistry, ToolResult, ToolReturnError, result_to_text, tool

# --------------------------------------------------------------------------- schema


def test_schema_covers_the_supported_types():
    @tool
    def everything(
        s: str,
        i: int,
        f: float,
        b: bool,
        plain_list: list,
        ints: List[int],
        plain_dict: dict,
        scores: Dict[str, float],
        maybe: Optional[int],
        mode: Literal["fast", "slow"],
        seq: Sequence[str] = (),
        either: Union[int, str] = 0,
        anything: Any = None,
    ) -> str:
        return ""

    props = everything.spec.parameters["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["f"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["plain_list"] == {"type": "array"}
    assert props["ints"] == {"type": "array", "items": {"type": "integer"}}
    assert props["plain_dict"] == {"type": "object"}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["maybe"] == {"type": ["integer", "null"]}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["seq"] == {"type": "array", "items": {"type": "string"}, "default": []}
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 0}
    assert props["anything"] == {"default": None}
    params = everything.spec.parameters
    assert params["required"] == ["s", "i", "f", "b", "plain_list", "ints", "plain_dict", "scores", "maybe", "mode"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    json.dumps(everything.spec.to_openai())  # the wire form is plain JSON


def test_spec_name_description_and_param_docs_from_docstring():
    @tool
    def search(query: str, limit: int = 5) -> str:
        """Search the knowledge base
        for passages.

        Longer explanation that the model does not need.

        Args:
            query: what to look for;
                several words are fine.
            limit (int): how many passages to return.
        """
        return ""

    spec = search.spec
    assert isinstance(spec, ToolSpec)
    assert spec.name == "search"
    assert spec.description == "Search the knowledge base for passages."
    assert spec.parameters["properties"]["query"]["description"] == "what to look for; several words are fine."
    assert spec.parameters["properties"]["limit"] == {
        "type": "integer", "description": "how many passages to return.", "default": 5}
    assert spec.parameters["required"] == ["query"]


def test_sphinx_param_docs_and_annotated_descriptions():
    @tool
    def f(a: str, b: int = 1) -> str:
        """Do it.

        :param a: the a
        :param int b: the b
        """
        return ""

    assert f.spec.parameters["properties"]["a"]["description"] == "the a"
    assert f.spec.parameters["properties"]["b"]["description"] == "the b"

    @tool
    def g(n: Annotated[int, "how many"]) -> str:
        return ""

    assert g.spec.parameters["properties"]["n"] == {"type": "integer", "description": "how many"}


def test_decorator_forms_and_options():
    def fn(x: int) -> int:
        return x * 2

    bare = tool(fn)
    assert bare.name == "fn" and bare(x=3) == 6 and bare(4) == 8  # callable passthrough
    named = tool(name="double", description="Doubles.", timeout=2, side_effects=True)(fn)
    assert (named.name, named.description, named.timeout, named.side_effects) == ("double", "Doubles.", 2.0, True)
    assert tool("twice")(fn).name == "twice"
    assert tool()(fn).name == "fn"
    assert Tool.from_function(bare) is bare
    assert Tool.from_function(bare, name="other").name == "other"
    assert bare.__wrapped__ is fn and bare.__name__ == "fn"


def test_tool_is_immutable():
    @tool
    def f() -> str:
        return ""

    with pytest.raises(AttributeError, match="immutable"):
        f.name = "g"  # type: ignore[misc]
    f.spec.parameters["properties"]["x"] = {}  # mutating a copy does not change validation
    with pytest.raises(ToolError, match="unknown argument 'x'"):
        f.validate({"x": 1})


@pytest.mark.parametrize("bad_name", ["", "has space", "x" * 65, "tool<", "naïve", "a\nb"])
def test_invalid_names_are_refused(bad_name):
    with pytest.raises(ToolError, match="tool name"):
        tool(lambda: "", name=bad_name)


def test_lambda_needs_a_name():
    with pytest.raises(ToolError, match="name="):
        tool(lambda: "")
    assert tool(lambda: "", name="ok.name-1_2").name == "ok.name-1_2"


def test_star_args_and_kwargs_are_refused_at_definition():
    with pytest.raises(ToolError, match=r"\*args"):
        @tool
        def a(*args: str) -> str:
            return ""
    with pytest.raises(ToolError, match=r"\*\*kwargs"):
        @tool
        def b(x: int, **kwargs: Any) -> str:
            return ""


class Thing:
    pass


def test_unsupported_types_fail_at_definition_with_the_supported_list():
    def t(x: Thing) -> str:
        return ""

    def u(n: int, callback: Callable[[int], int]) -> str:
        return ""

    with pytest.raises(ToolError, match=r"parameter 'x' of tool 't' has type Thing.*use str, int.*pydantic model"):
        tool(t, name="t")
    with pytest.raises(ToolError, match=r"parameter 'callback' of tool 'u' has type .*Callable"):
        tool(u)


def test_unresolvable_hint_is_a_clear_error():
    def f(x: NoSuchType) -> str:  # noqa: F821
        return ""

    with pytest.raises(ToolError, match=r"cannot read the type hints.*NoSuchType"):
        tool(f)


def test_methods_need_from_function_on_the_bound_method():
    class Service:
        def lookup(self, key: str) -> str:
            return key.upper()

    with pytest.raises(ToolError, match="bound method"):
        tool(Service.lookup)
    bound = Tool.from_function(Service().lookup)
    assert bound.spec.parameters["required"] == ["key"]
    assert bound.run({"key": "k"}) == "K"


def test_untyped_params_infer_from_defaults():
    @tool
    def f(a, b=3, c="x", d=None) -> str:
        return ""

    props = f.spec.parameters["properties"]
    assert props["a"] == {}
    assert props["b"] == {"type": "integer", "default": 3}
    assert props["c"] == {"type": "string", "default": "x"}
    assert props["d"] == {"default": None}


# --------------------------------------------------------------------------- validation


class _Recorder:
    def __init__(self) -> None:
        self.calls: List[Dict[str, Any]] = []

    def make(self) -> Tool:
        recorder = self

        @tool
        def lookup(key: str, limit: int = 3, ratio: float = 0.5, flags: Optional[List[bool]] = None,
                   mode: Literal["a", "b"] = "a") -> str:
            """Look a key up."""
            recorder.calls.append({"key": key, "limit": limit, "ratio": ratio, "flags": flags, "mode": mode})
            return "ran"

        return lookup


@pytest.mark.parametrize("args, pattern", [
    ({"key": "k", "bogus": 1},
     r"unknown argument 'bogus'; allowed arguments: 'key', 'limit', 'ratio', 'flags', 'mode'"),
    ({}, r"missing required argument 'key' \(string\)"),
    ({"key": 5}, r"argument 'key' must be string, got integer 5"),
    ({"key": "k", "limit": "3"}, r"argument 'limit' must be integer, got string \"3\""),
    ({"key": "k", "limit": True}, r"argument 'limit' must be integer, got boolean true"),
    ({"key": "k", "limit": 2.5}, r"argument 'limit' must be integer, got number 2.5"),
    ({"key": "k", "ratio": "high"}, r"argument 'ratio' must be number, got string"),
    ({"key": "k", "ratio": False}, r"argument 'ratio' must be number, got boolean"),
    ({"key": "k", "flags": [True, 1]}, r"argument 'flags\[1\]' must be boolean, got integer 1"),
    ({"key": "k", "flags": "yes"}, r"argument 'flags' must be array of boolean or null, got string"),
    ({"key": "k", "mode": "c"}, r"argument 'mode' must be one of \"a\", \"b\", got string \"c\""),
    ({"key": None}, r"argument 'key' must be string, got null"),
    (["key"], r"must be a JSON object, got array"),
])
def test_invalid_arguments_are_named_and_the_function_never_runs(args, pattern):
    recorder = _Recorder()
    fn = recorder.make()
    with pytest.raises(ToolError, match=pattern):
        fn.validate(args)
    with pytest.raises(ToolError, match=pattern):
        fn.run(args)
    assert recorder.calls == []


def test_every_problem_is_reported_at_once():
    fn = _Recorder().make()
    with pytest.raises(ToolError) as info:
        fn.validate({"limit": "x", "extra": 1})
    message = str(info.value)
    assert message.startswith("invalid arguments for tool 'lookup': ")
    assert "unknown argument 'extra'" in message
    assert "missing required argument 'key'" in message
    assert "argument 'limit' must be integer" in message


def test_valid_arguments_pass_and_are_normalised():
    fn = _Recorder().make()
    assert fn.validate({"key": "k", "limit": 2.0, "ratio": 1}) == {"key": "k", "limit": 2, "ratio": 1}
    # a null for an argument with a default means "use the default"
    assert fn.validate({"key": "k", "limit": None}) == {"key": "k"}
    assert fn.validate({"key": "k", "flags": None}) == {"key": "k"}


def test_no_argument_tool_lists_none_allowed():
    @tool
    def ping() -> str:
        return "pong"

    with pytest.raises(ToolError, match="allowed arguments: none"):
        ping.validate({"x": 1})
    assert "required" not in ping.spec.parameters
    assert ping.run({}) == "pong"


def test_nested_dict_values_and_nan_are_checked():
    @tool
    def f(scores: Dict[str, int]) -> str:
        return ""

    with pytest.raises(ToolError, match=r"argument \"scores\['b'\]\" must be integer"):
        f.validate({"scores": {"a": 1, "b": "2"}})

    @tool
    def g(x: float) -> str:
        return ""

    with pytest.raises(ToolError, match="must be number, got number NaN"):
        g.validate({"x": float("nan")})


# --------------------------------------------------------------------------- context


def test_context_is_injected_and_not_in_the_schema():
    seen = []

    @tool
    def slow(query: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return query

    assert slow.context_param == "ctx"
    assert list(slow.spec.parameters["properties"]) == ["query"]
    assert slow.spec.parameters["required"] == ["query"]
    with pytest.raises(ToolError, match="unknown argument 'ctx'"):
        slow.validate({"query": "q", "ctx": 1})
    context = ToolContext(threading.Event(), time.monotonic() + 60)
    assert slow.run({"query": "q"}, context) == "q"
    assert seen == [context]
    slow.run({"query": "q"})  # without one, a fresh never-cancelled context
    assert isinstance(seen[-1], ToolContext) and not seen[-1].cancelled


def test_optional_context_with_any_name():
    @tool
    def f(context: Optional[ToolContext] = None) -> str:
        return "cancelled" if context is not None and context.cancelled else "fine"

    assert f.spec.parameters["properties"] == {}
    event = threading.Event()
    event.set()
    assert f.run({}, ToolContext(event)) == "cancelled"


def test_two_context_parameters_are_refused():
    with pytest.raises(ToolError, match="two ToolContext"):
        @tool
        def f(a: ToolContext, b: ToolContext) -> str:
            return ""


def test_tool_context_flags_deadline_and_check():
    event = threading.Event()
    ctx = ToolContext(event, time.monotonic() + 60)
    assert not ctx.cancelled and 0 < ctx.remaining() <= 60
    ctx.check()
    event.set()
    assert ctx.cancelled
    with pytest.raises(ToolError, match=r"^cancelled$"):
        ctx.check()
    assert ctx.sleep(10) is False  # returns at once when cancelled
    past = ToolContext(threading.Event(), time.monotonic() - 1)
    assert past.cancelled and past.remaining() == 0.0
    with pytest.raises(ToolError, match="cancelled: deadline passed"):
        past.check()
    assert ToolContext().remaining() == float("inf")


# --------------------------------------------------------------------------- results


@dataclasses.dataclass
class _Point:
    x: int
    y: int


class _Color(enum.Enum):
    RED = "red"


class _Reading(BaseModel):
    at: datetime.datetime
    value: float


@pytest.mark.parametrize("value, text", [
    ("plain", "plain"),
    (None, ""),
    ({"city": "Zürich", "n": 2}, '{"city": "Zürich", "n": 2}'),
    ([1, "a", None], '[1, "a", null]'),
    ((1, 2), "[1, 2]"),
    (42, "42"),
    (2.5, "2.5"),
    (True, "true"),
    ("bytes \u00e9".encode(), "bytes \u00e9"),
    (_Point(1, 2), '{"x": 1, "y": 2}'),
    ([_Point(1, 2)], '[{"x": 1, "y": 2}]'),
    (_Reading(at=datetime.datetime(2024, 1, 2, 3, 4), value=1.5), '{"at": "2024-01-02T03:04:00", "value": 1.5}'),
    ({"day": datetime.date(2024, 1, 2), "color": _Color.RED}, '{"day": "2024-01-02", "color": "red"}'),
])
def test_return_values_become_text(value, text):
    assert result_to_text(value) == text


@pytest.mark.parametrize("value, pattern", [
    ({1, 2}, r"^tool 'x' returned a set; return str, a JSON value \(dict/list/number/bool/None\), a dataclass "
             r"or a pydantic model$"),
    (Thing(), r"^tool 'x' returned a Thing; return str"),
    ({"when": dataclasses}, r"^tool 'x' returned a dict containing a module; return str"),
    (b"bytes \xff", r"^tool 'x' returned bytes that are not UTF-8 text \(invalid start byte at byte 6\); decode"),
    (float("nan"), r"^tool 'x' returned a float that is not valid JSON \(Out of range float values"),
])
def test_values_without_a_json_form_are_refused_with_what_to_return(value, pattern):
    with pytest.raises(ToolReturnError, match=pattern):
        result_to_text(value, "x")


def test_run_converts_the_return_value():
    @tool
    def f(n: int) -> Dict[str, int]:
        return {"n": n}

    assert f.run({"n": 1}) == '{"n": 1}'


def test_tool_result_error_result():
    call = ToolCall("call_1", "search", '{"q": 1}')
    result = ToolResult.error_result(call, "tool 'search' is not allowed")
    assert result == ToolResult("call_1", "search", False, "", "tool 'search' is not allowed")
    assert result.duration_s == 0.0 and result.started_at == 0.0 and not result.timed_out
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = True  # type: ignore[misc]


# --------------------------------------------------------------------------- registry


def test_registry_accepts_tools_and_functions():
    @tool
    def a() -> str:
        return "a"

    def b(x: int) -> str:
        return str(x)

    registry = ToolRegistry([a, b])
    assert registry.names == ("a", "b")
    assert "a" in registry and "b" in registry and "c" not in registry
    assert registry.get("a") is a
    assert isinstance(registry.get("b"), Tool) and registry.get("b").run({"x": 2}) == "2"
    assert registry.get("c") is None
    assert [s.name for s in registry.specs()] == ["a", "b"]
    assert len(registry) == 2 and [t.name for t in registry] == ["a", "b"]
    registry.register(tool(b, name="c"))
    assert registry.names == ("a", "b", "c")


def test_registry_refuses_duplicates_and_non_callables():
    def a() -> str:
        return ""

    registry = ToolRegistry([a])
    with pytest.raises(ToolError, match="two tools are named 'a'"):
        registry.register(tool(a))
    with pytest.raises(ToolError, match="must wrap a function"):
        ToolRegistry(["not a function"])
