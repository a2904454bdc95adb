"""The quick schema check never accepts what the full validator refuses, and accepts
the shapes it is meant for: flat ones, and the nested ones pydantic writes for list,
dict, model, optional, literal and tuple parameters."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from lodger.engine.checks import schema_problems
from lodger.engine.fastschema import quick_check
from lodger.tools import Tool, tool

TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
names = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(
        st.dictionaries(
            names,
            st.fixed_dictionaries(
                {},
                optional={
                    "type": st.sampled_from([*TYPES, "integer"]),
                    "title": st.text(max_size=3),
                    # not understood by the quick check: it must then say None
                    "minLength": st.integers(0, 3),
                    # understood on an integer or a number only
                    "minimum": st.integers(-3, 3) | st.floats(-3, 3),
                    "exclusiveMaximum": st.integers(-3, 3) | st.floats(-3, 3),
                },
            ),
        )
    )
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(names, unique=True, max_size=4))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans())
    return schema


@settings(max_examples=400, deadline=None)
@given(schemas(), st.dictionaries(names, json_values, max_size=4))
def test_quick_accept_means_the_full_validator_accepts(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    check = quick_check(json.dumps(schema))
    full_ok = not list(Draft202012Validator(schema).iter_errors(arguments))
    assert check is not None, schema  # every flat shape compiles now
    if check(arguments):
        assert full_ok, (schema, arguments)
    elif full_ok:
        # the only "not sure" on valid arguments: a whole float given for an integer
        assert any(
            schema["properties"].get(k, {}).get("type") == "integer" and isinstance(v, float)
            for k, v in arguments.items()
        ), (schema, arguments)


def test_common_shapes_are_quick_and_strict() -> None:
    check = quick_check(
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "title": "Path"},
                    "n": {"type": "integer"},
                },
                "required": ["path"],
                "additionalProperties": False,
            }
        )
    )
    assert check is not None
    assert check({"path": "a", "n": 3})
    assert not check({"n": 3})  # missing required
    assert not check({"path": 1})  # wrong type
    assert not check({"path": "a", "n": True})  # a bool is not an integer
    assert not check({"path": "a", "x": 1})  # extra property refused


def test_other_shapes_are_left_to_the_full_validator() -> None:
    for schema in (
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}},
        {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}},
        {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
        {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
        {"type": "object", "properties": {"a": {"enum": [[1]]}}},  # a list member
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/y"}}, "$defs": {"x": {}}},
        {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
        {"type": "object", "properties": {"a": {"$ref": "#"}}},
        {"type": "object", "$id": "urn:x"},
        {"type": "object", "properties": {"a": {"$defs": {}, "type": "string"}}},
        {"type": "array"},
        {"type": "object", "required": ["a", "a"]},
        {"type": "object", "properties": {"a": {"type": ["string", "string"]}}},
        {"type": "object", "properties": {"a": {"type": "array", "prefixItems": []}}},
        {"type": "object", "properties": {"a": {"anyOf": []}}},
        {"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}},
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 1.0}}},
    ):
        assert quick_check(json.dumps(schema)) is None, schema
    assert quick_check("not json") is None


class Inner(BaseModel):
    x: int
    tags: list[str] = []
    kids: list[Inner] = []


@tool
def nested(
    items: list[str],
    opts: dict[str, int],
    inner: Inner,
    mode: Literal["a", "b"] = "a",
    note: str | None = None,
    pair: tuple[int, str] = (1, "a"),
    ratio: Annotated[float, Field(ge=0, lt=1)] = 0.5,
    name: Annotated[str, Field(min_length=1, max_length=8)] = "n",
) -> str:
    """A tool whose parameters need every nested shape pydantic writes."""
    return ""


def test_the_shapes_pydantic_writes_are_quick_and_strict() -> None:
    check = quick_check(nested.parameters_json)
    assert check is not None, nested.parameters_json
    good: dict[str, Any] = {
        "items": ["a", "b"],
        "opts": {"k": 1},
        "inner": {"x": 1, "kids": [{"x": 2, "tags": ["t"], "kids": [{"x": 3}]}]},
        "mode": "b",
        "note": None,
        "pair": [2, "z"],
        "ratio": 0.25,
        "name": "abc",
    }
    assert check(good)
    full = Draft202012Validator(json.loads(nested.parameters_json))
    for key, bad in (
        ("items", ["a", 1]),
        ("opts", {"k": "v"}),
        ("inner", {"kids": []}),  # x is required
        ("inner", {"x": 1, "kids": [{"x": "deep"}]}),  # through the recursive $ref
        ("mode", "c"),
        ("note", 5),
        ("pair", ["2", "z"]),
        ("pair", [1, "a", 3]),  # maxItems
        ("ratio", 1),  # exclusive maximum
        ("name", ""),  # minLength
        ("extra", 1),  # additionalProperties: false
    ):
        arguments = {**good, key: bad}
        assert not check(arguments), (key, bad)
        assert list(full.iter_errors(arguments)), (key, bad)  # the full one refuses too


def test_enum_and_const_accept_a_member_of_the_same_type_only() -> None:
    """JSON Schema tells True from 1 but not 1.0 from 1: the check takes neither."""
    check = quick_check(
        json.dumps(
            {
                "type": "object",
                "properties": {"e": {"enum": [1, "a", None]}, "c": {"const": False}},
            }
        )
    )
    assert check is not None
    assert check({"e": 1, "c": False}) and check({"e": None})
    for e, c in ((True, False), (1.0, False), ("b", False), (1, 0), (1, None)):
        assert not check({"e": e, "c": c}), (e, c)


#: JSON Schema shapes the compiler takes (and a few it does not), nested to any depth
_leaf = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1),
            "title": st.text(max_size=2) | st.integers(),
            "format": st.sampled_from(["date-time", "uri", "email"]),
            "minLength": st.integers(-1, 3),
            "maxLength": st.integers(0, 3),
            "minItems": st.integers(0, 2),
            "maxProperties": st.integers(0, 2),
            "minimum": st.integers(-3, 3) | st.floats(-3, 3),
            "exclusiveMaximum": st.integers(-3, 3) | st.floats(-3, 3),
            "enum": st.lists(
                st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from([0.0, 1.0, "a"]),
                max_size=3,
            ),
            "const": st.sampled_from([0, 1, 1.0, True, "a", None]),
        },
    ),
    st.booleans(),
    st.just({"$ref": "#/$defs/D"}),
)


def _compound(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(
            lambda props, required, extra, typed: {
                **({"type": "object"} if typed else {}),
                "properties": props,
                "required": required,
                **({} if extra is None else {"additionalProperties": extra}),
            },
            st.dictionaries(names, inner, max_size=3),
            st.lists(names, unique=True, max_size=2),
            st.none() | inner,
            st.booleans(),
        ),
        st.builds(
            lambda items, prefix, typed: {
                **({"type": "array"} if typed else {}),
                "items": items,
                **({"prefixItems": prefix} if prefix else {}),
            },
            inner,
            st.lists(inner, max_size=2),
            st.booleans(),
        ),
        st.builds(lambda branches: {"anyOf": branches}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda branches: {"allOf": branches}, st.lists(inner, min_size=1, max_size=2)),
    )


subschemas = st.recursive(_leaf, _compound, max_leaves=8)


@st.composite
def nested_schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": draw(st.dictionaries(names, subschemas, max_size=4)),
        "$defs": {"D": draw(subschemas)},
    }
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(names, unique=True, max_size=4))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans() | subschemas)
    return schema


#: values near the edges the schemas draw (1 and True, 1 and 1.0, short and empty)
edge_values = st.sampled_from([0, 1, 1.0, -3, 3.5, True, False, None, "", "a", "abcd", [], {}])
nested_values = st.recursive(
    edge_values | json_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=500, deadline=None)
@given(nested_schemas(), st.dictionaries(names, nested_values, max_size=4))
def test_a_nested_quick_accept_means_the_full_validator_accepts(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    check = quick_check(json.dumps(schema))
    errors = list(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
    if check is None:
        return
    assert errors == [], (schema, errors)  # it compiles valid schemas only
    if check(arguments):
        assert not list(Draft202012Validator(schema).iter_errors(arguments)), (schema, arguments)


def _problems_the_old_way(t: Tool, arguments: dict[str, Any]) -> list[str]:
    """What ``schema_problems`` answered before the quick check: the full validator's."""
    validator = Draft202012Validator(json.loads(t.parameters_json))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))[:5]
    return [
        f"{'/'.join(str(p) for p in e.path)}: {e.message}" if e.path else e.message for e in errors
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "items": st.lists(st.text(max_size=2) | st.integers(), max_size=3),
            "opts": st.dictionaries(st.text(max_size=2), st.integers() | st.text(max_size=1)),
            "inner": st.fixed_dictionaries(
                {}, optional={"x": st.integers() | st.text(max_size=1), "kids": st.just([])}
            ),
            "mode": st.sampled_from(["a", "b", "c"]),
            "note": st.none() | st.text(max_size=2) | st.integers(),
            "pair": st.lists(st.integers() | st.text(max_size=1), max_size=3),
            "ratio": st.floats(-1, 2) | st.integers(-1, 2),
            "name": st.text(max_size=10),
        },
    )
)
def test_the_compiled_check_gives_exactly_the_old_problems(arguments: dict[str, Any]) -> None:
    """``schema_problems`` with the compiled check in front says what the full validator
    alone said, on arguments valid and not for a tool with nested parameters."""
    assert schema_problems(nested, arguments) == _problems_the_old_way(nested, arguments)


annotation_values = st.one_of(json_values, st.text(max_size=3), st.lists(json_values, max_size=2))


@st.composite
def annotated_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Flat schemas whose annotations (and a number's bound) hold any JSON value, right
    type or not."""
    annotations = st.dictionaries(
        st.sampled_from(["title", "description", "default", "examples", "$comment"]),
        annotation_values,
        max_size=3,
    )
    props = {}
    for name in draw(st.lists(names, unique=True, max_size=3)):
        sub = draw(annotations)
        if draw(st.booleans()):
            sub["type"] = draw(st.sampled_from(TYPES))
        if sub.get("type") == "number" and draw(st.booleans()):
            sub["minimum"] = draw(annotation_values)  # a number, or not
        props[name] = sub
    return {"type": "object", "properties": props, **draw(annotations)}


@settings(max_examples=400, deadline=None)
@given(annotated_schemas())
def test_a_schema_the_quick_check_takes_is_valid_under_the_metaschema(
    schema: dict[str, Any],
) -> None:
    """``schema_problems`` skips the metaschema check (and jsonschema's import) when the
    quick check accepts: that is sound only if every schema it takes is a valid one."""
    check = quick_check(json.dumps(schema))
    errors = list(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(schema))
    if check is not None:
        assert errors == [], (schema, errors)
    else:  # it declines exactly the schemas an annotation makes invalid
        assert errors, schema


def test_a_badly_typed_annotation_is_reported_not_skipped() -> None:
    """A title that is not a string makes the schema invalid: the call is refused with
    the schema's own problem, though the arguments fit the types."""

    async def echo(arguments: dict[str, Any]) -> str:
        return str(arguments)

    bad = Tool(
        name="echo",
        description="echo",
        parameters={"type": "object", "properties": {"text": {"type": "string", "title": 5}}},
        handler=echo,  # type: ignore[arg-type]
    )
    problems = schema_problems(bad, {"text": "hi"})
    assert len(problems) == 1 and "the tool's own schema is invalid" in problems[0], problems
