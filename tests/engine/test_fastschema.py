"""The quick schema check never accepts what the full validator refuses, and accepts
the common flat shapes it is meant for."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from lodger.engine.fastschema import quick_check

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
    if check is None:
        assert any(
            "minLength" in p
            or (
                ("minimum" in p or "exclusiveMaximum" in p)
                and p.get("type") not in ("integer", "number")
            )
            for p in schema["properties"].values()
        ), schema
        return
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
        {"type": "object", "properties": {"a": {"type": "string", "enum": ["x"]}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {}}},
        {"type": "array"},
        {"type": "object", "required": ["a", "a"]},
        {"type": "object", "properties": {"a": {"type": ["string", "null"]}}},
    ):
        assert quick_check(json.dumps(schema)) is None, schema
    assert quick_check("not json") is None


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
    from lodger.engine.checks import schema_problems
    from lodger.tools.spec import Tool

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
