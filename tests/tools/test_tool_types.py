"""Parameter types beyond plain JSON: Enum, dataclasses, datetime, Annotated Field, pydantic models, TypedDict.

Each kind is checked three ways: the schema the model reads, a valid call
that reaches the function as the Python type, and an invalid call whose
error names the argument path, what was expected and what was sent.
"""
from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from typing import Annotated, Any, Dict, List, Literal, Mapping, Optional, Union

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from streamengine import ToolError
from streamengine.tools import tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


@dataclasses.dataclass
class Point:
    """A point on the map."""

    x: int
    y: int = 0


class Filter(BaseModel):
    """Which rows to keep."""

    field: str = Field(description="column name")
    at_least: float = 0.0
    since: Optional[datetime.date] = None


class Span(TypedDict):
    start: int
    end: int


class Tree(BaseModel):
    label: str
    children: List[Tree] = []


def _all_objects(schema: Any) -> List[Mapping[str, Any]]:
    found = []
    if isinstance(schema, dict):
        if "properties" in schema:
            found.append(schema)
        for value in schema.values():
            found.extend(_all_objects(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(_all_objects(value))
    return found


def _no_titles(schema: Any) -> bool:
    if isinstance(schema, dict):
        if isinstance(schema.get("title"), str) and "type" in schema:
            return False
        return all(_no_titles(v) for k, v in schema.items() if k != "properties") and \
            all(_no_titles(v) for v in schema.get("properties", {}).values())
    if isinstance(schema, list):
        return all(_no_titles(v) for v in schema)
    return True


@pytest.fixture
def calls() -> List[Dict[str, Any]]:
    return []


@pytest.fixture
def plot(calls):
    @tool
    def plot(point: Point, color: Color = Color.RED, size: Size = Size.SMALL,
             when: Optional[datetime.datetime] = None, day: Optional[datetime.date] = None,
             rows: Optional[Filter] = None, span: Optional[Span] = None,
             zoom: Annotated[float, Field(description="magnification", ge=1, le=10)] = 1.0) -> str:
        """Plot a point.

        Args:
            point: where to plot.
            color: the pen.
        """
        calls.append({"point": point, "color": color, "size": size, "when": when, "day": day, "rows": rows,
                      "span": span, "zoom": zoom})
        return "plotted"

    return plot


def test_schema_of_the_new_kinds_is_inline_and_strict_shaped(plot):
    schema = plot.spec.parameters
    props = schema["properties"]
    assert props["point"] == {
        "type": "object", "description": "where to plot.", "additionalProperties": False, "required": ["x"],
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}}}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "the pen.", "default": "red"}
    assert props["size"] == {"type": "integer", "enum": [1, 2], "default": 1}
    assert props["when"] == {"type": ["string", "null"], "format": "date-time", "default": None}
    assert props["day"] == {"type": ["string", "null"], "format": "date", "default": None}
    assert props["rows"]["type"] == ["object", "null"]
    assert props["rows"]["properties"]["field"] == {"type": "string", "description": "column name"}
    assert props["span"]["properties"] == {"start": {"type": "integer"}, "end": {"type": "integer"}}
    assert props["zoom"] == {"type": "number", "description": "magnification", "minimum": 1, "maximum": 10,
                             "default": 1.0}
    assert schema["required"] == ["point"]
    assert "$defs" not in schema and "$ref" not in json.dumps(schema)
    assert all(obj["additionalProperties"] is False for obj in _all_objects(schema))
    assert _no_titles(schema)


def test_valid_arguments_arrive_as_python_types(plot, calls):
    args = {"point": {"x": 1, "y": 2.0}, "color": "blue", "size": 2, "when": "2024-05-06T07:08:09Z",
            "day": "2024-05-06", "rows": {"field": "price", "at_least": 3, "since": "2024-01-01"},
            "span": {"start": 1, "end": 4}, "zoom": 2}
    assert plot.run(args) == "plotted"
    got = calls[0]
    assert got["point"] == Point(1, 2)
    assert got["color"] is Color.BLUE and got["size"] is Size.LARGE
    assert got["when"] == datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    assert got["day"] == datetime.date(2024, 5, 6)
    assert got["rows"] == Filter(field="price", at_least=3.0, since=datetime.date(2024, 1, 1))
    assert got["span"] == {"start": 1, "end": 4} and got["zoom"] == 2.0


def test_defaults_are_the_python_defaults(plot, calls):
    plot.run({"point": {"x": 0}, "color": None})
    assert calls[0]["color"] is Color.RED and calls[0]["zoom"] == 1.0 and calls[0]["rows"] is None


@pytest.mark.parametrize("args, pattern", [
    ({"point": {"x": "1"}}, r"argument 'point\.x' must be integer, got string \"1\""),
    ({"point": {"y": 1}}, r"missing required argument 'point\.x' \(integer\)"),
    ({"point": {"x": 1, "z": 2}}, r"unknown field 'z' in argument 'point'; allowed fields: 'x', 'y'"),
    ({"point": [1, 2]}, r"argument 'point' must be object with fields 'x', 'y', got array \[1, 2\]"),
    ({"point": {"x": 1}, "color": "green"}, r"argument 'color' must be one of \"red\", \"blue\", got string \"green\""),
    ({"point": {"x": 1}, "size": 3}, r"argument 'size' must be one of 1, 2, got integer 3"),
    ({"point": {"x": 1}, "when": "yesterday"}, r"argument 'when' must be a valid datetime.*got string \"yesterday\""),
    ({"point": {"x": 1}, "rows": {"field": "a", "since": 5}}, r"argument 'rows\.since' must be .*got integer 5"),
    ({"point": {"x": 1}, "rows": {"field": 1}}, r"argument 'rows\.field' must be string, got integer 1"),
    ({"point": {"x": 1}, "span": {"start": 1}}, r"missing required argument 'span\.end' \(integer\)"),
    ({"point": {"x": 1}, "zoom": 11}, r"argument 'zoom' must be less than or equal to 10, got integer 11"),
])
def test_invalid_arguments_name_the_path_expected_and_got(plot, calls, args, pattern):
    with pytest.raises(ToolError, match=pattern) as info:
        plot.run(args)
    assert str(info.value).startswith("invalid arguments for tool 'plot': ")
    assert "\n" not in str(info.value)
    assert calls == []


def test_a_union_is_reported_once_with_all_its_members():
    @tool
    def f(either: Union[int, Point]) -> str:
        return ""

    with pytest.raises(ToolError) as info:
        f.validate({"either": "x"})
    assert str(info.value) == ("invalid arguments for tool 'f': argument 'either' must be integer or object with "
                               "fields 'x', 'y', got string \"x\"")


def test_recursive_models_keep_a_top_level_ref():
    @tool
    def grow(tree: Tree) -> int:
        def count(t: Tree) -> int:
            return 1 + sum(count(c) for c in t.children)
        return count(tree)

    schema = grow.spec.parameters
    assert set(schema["$defs"]) == {"Tree"}
    assert schema["properties"]["tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}
    assert schema["$defs"]["Tree"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Tree"}
    assert schema["$defs"]["Tree"]["additionalProperties"] is False
    assert grow.run({"tree": {"label": "a", "children": [{"label": "b"}, {"label": "c", "children": []}]}}) == "3"
    with pytest.raises(ToolError, match=r"argument 'tree\.children\[1\]\.label' must be string, got integer 2"):
        grow.validate({"tree": {"label": "a", "children": [{"label": "b"}, {"label": 2}]}})


def test_literal_of_mixed_values_and_dict_with_int_keys():
    @tool
    def f(level: Literal[1, "max"], weights: Dict[int, float]) -> str:
        return json.dumps({"level": level, "keys": sorted(weights)})

    assert f.spec.parameters["properties"]["level"] == {"enum": [1, "max"]}
    assert f.run({"level": "max", "weights": {"2": 0.5, "1": 1}}) == '{"level": "max", "keys": [1, 2]}'
    with pytest.raises(ToolError, match=r"argument 'level' must be one of 1, \"max\", got string \"min\""):
        f.validate({"level": "min", "weights": {}})


def test_any_parameter_name_works_even_ones_pydantic_reserves():
    @tool
    def f(model_config: str, _hidden: int = 1, json: bool = False) -> str:
        return f"{model_config}/{_hidden}/{json}"

    assert list(f.spec.parameters["properties"]) == ["model_config", "_hidden", "json"]
    assert f.run({"model_config": "m", "_hidden": 2, "json": True}) == "m/2/True"


def test_field_description_in_annotated_wins_over_the_docstring():
    @tool
    def f(q: Annotated[str, Field(description="from Field")], n: Annotated[int, "from note"] = 1) -> str:
        """Search.

        Args:
            q: from docstring
            n: from docstring
        """
        return q

    props = f.spec.parameters["properties"]
    assert props["q"]["description"] == "from Field"
    assert props["n"]["description"] == "from note"


def test_python_callers_may_pass_python_values():
    @tool
    def f(color: Color, point: Point) -> str:
        return f"{color.value}@{point.x}"

    assert f.run({"color": Color.BLUE, "point": Point(3)}) == "blue@3"
