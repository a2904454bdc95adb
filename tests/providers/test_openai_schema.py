"""strict_schema: a strict structured-output copy only where it means the same."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from lodger.providers._openai_schema import strict_schema

POINT = {
    "type": "object",
    "title": "Point",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "minimum": 0}},
    "required": ["x", "y"],
}


def test_a_closed_object_with_every_property_required_goes_strict() -> None:
    closed = {**POINT, "additionalProperties": False}

    assert strict_schema(closed) == closed


def test_the_copy_closes_objects_and_drops_annotations_without_touching_the_input() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "x", "examples": ["a"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "where": {"$ref": "#/$defs/Spot"},
        },
        "required": ["name", "tags", "where"],
        "$defs": {
            "Spot": {
                "type": "object",
                "properties": {"lat": {"type": "number"}},
                "required": ["lat"],
            }
        },
    }
    before = repr(schema)

    strict = strict_schema(schema)

    assert strict == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "where": {"$ref": "#/$defs/Spot"},
        },
        "required": ["name", "tags", "where"],
        "$defs": {
            "Spot": {
                "type": "object",
                "properties": {"lat": {"type": "number"}},
                "required": ["lat"],
                "additionalProperties": False,
            }
        },
        "additionalProperties": False,
    }
    assert repr(schema) == before


@pytest.mark.parametrize(
    ("why", "schema"),
    [
        ("optional property", {**POINT, "required": ["x"]}),
        (
            "optional nested property",
            {
                "type": "object",
                "properties": {"p": {**POINT, "required": []}},
                "required": ["p"],
            },
        ),
        ("extra keys allowed", {**POINT, "additionalProperties": True}),
        ("typed extra keys", {**POINT, "additionalProperties": {"type": "string"}}),
        ("free-form map", {"type": "object"}),
        (
            "minLength",
            {
                "type": "object",
                "properties": {"s": {"type": "string", "minLength": 1}},
                "required": ["s"],
            },
        ),
        (
            "uniqueItems",
            {
                "type": "object",
                "properties": {"a": {"type": "array", "uniqueItems": True}},
                "required": ["a"],
            },
        ),
        ("allOf", {**POINT, "allOf": [{"required": ["x"]}]}),
        (
            "oneOf with overlapping branches",
            {
                "type": "object",
                "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}},
                "required": ["v"],
            },
        ),
        (
            "boolean schema",
            {"type": "object", "properties": {"any": True}, "required": ["any"]},
        ),
        ("root is not an object", {"type": "array", "items": {"type": "string"}}),
    ],
)
def test_schemas_outside_the_strict_subset_are_not_strict(why: str, schema: dict[str, Any]) -> None:
    assert strict_schema(schema) is None, why


def test_tagged_oneof_becomes_anyof() -> None:
    def branch(kind: str) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"kind": {"const": kind}, "size": {"type": "integer"}},
            "required": ["kind", "size"],
        }

    schema = {
        "type": "object",
        "properties": {"shape": {"oneOf": [branch("circle"), branch("square")]}},
        "required": ["shape"],
    }

    strict = strict_schema(schema)

    assert strict is not None
    shape = strict["properties"]["shape"]
    assert "oneOf" not in shape
    assert [b["properties"]["kind"] for b in shape["anyOf"]] == [
        {"const": "circle"},
        {"const": "square"},
    ]
    assert all(b["additionalProperties"] is False for b in shape["anyOf"])


def test_nullable_fields_that_are_required_stay_strict() -> None:
    schema = {
        "type": "object",
        "properties": {"note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["note"],
    }

    assert strict_schema(schema) == {**schema, "additionalProperties": False}


class Circle(BaseModel):
    kind: Literal["circle"]
    r: float


class Square(BaseModel):
    kind: Literal["square"]
    side: float


class Drawing(BaseModel):
    shape: Annotated[Circle | Square, Field(discriminator="kind")]
    note: str | None


class Sketch(BaseModel):
    shape: Circle | Square
    note: str | None = None


def test_a_pydantic_discriminated_union_goes_strict_through_its_refs() -> None:
    strict = strict_schema(Drawing.model_json_schema())

    assert strict is not None
    shape = strict["properties"]["shape"]
    assert shape == {
        "anyOf": [{"$ref": "#/$defs/Circle"}, {"$ref": "#/$defs/Square"}],
        "title": "Shape",
    }
    assert strict["$defs"]["Circle"]["additionalProperties"] is False
    assert strict["required"] == ["shape", "note"]


def test_a_pydantic_model_with_a_defaulted_field_is_not_strict() -> None:
    assert strict_schema(Sketch.model_json_schema()) is None
