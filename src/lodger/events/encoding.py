"""Precompiled canonical encoders: an event's canonical bytes straight from its fields.

``seal`` used to dump a draft with pydantic (a fresh tree of dicts and lists), add the
place fields, and hand the tree to the key-sorting JSON encoder. Both steps are generic:
they look up every field's serializer and sort every dict's keys again on every event.
The field set of each event kind is fixed, so this module writes, once per model class at
import, a Python function that emits the canonical JSON of an instance directly:

- keys are sorted when the function is generated, not per event;
- a ``str`` field is one call of the JSON string escaper, an ``int`` field its ``repr``;
- optional fields, tuples and nested models are inlined;
- free-form JSON values (tool arguments, provider state, metadata, structured output)
  still go through the key-sorting encoder, which is what they need.

The output must be byte-for-byte what ``canonical_json(model_dump(mode="json"))`` gives
(the digest chain is computed over it): ``tests/test_event_encoding.py`` seals random
events of every kind both ways and compares bytes and digests. Anything the generated
code does not expect (a value of the wrong type in an unvalidated model, a float that is
not finite) raises, and the caller then takes the generic path, which either gives the
same bytes or the error it always gave.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from pydantic import BaseModel

__all__ = ["compile_model_encoder", "tree_encoder"]


def _reject(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_c_encode_str: Any = getattr(json.encoder, "c_encode_basestring", None)
_encode_str: Callable[[str], str] = _c_encode_str or json.encoder.py_encode_basestring


def _build_tree_encoder() -> Callable[[Any], str]:
    """Compact, key-sorted JSON text of a value without cycles (no NaN, no infinities)."""
    if _c_make_encoder is not None and _c_encode_str is not None:
        c_encoder = _c_make_encoder(
            None, _reject, _c_encode_str, None, ":", ",", True, False, False
        )

        def encode(value: Any) -> str:
            return "".join(c_encoder(value, 0))

        return encode

    plain = json.JSONEncoder(
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        check_circular=True,
        default=_reject,
    )
    return plain.encode


tree_encoder: Callable[[Any], str] = _build_tree_encoder()


def _bad(value: Any) -> str:
    raise TypeError(f"unexpected {type(value).__name__} in a precompiled event encoder")


def _literal(text: str) -> str:
    """``text`` as literal text inside a generated f-string."""
    if "\\" in text or '"""' in text or text.endswith('"'):
        raise TypeError(f"cannot place {text!r} in a generated encoder")
    return text.replace("{", "{{").replace("}", "}}")


class _Compiler:
    """Writes one function per model class into a shared namespace."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {
            "_S": _encode_str,
            "_int_repr": int.__repr__,
            "_T": tree_encoder,
            "_bad": _bad,
        }
        self.done: dict[type[BaseModel], str] = {}
        self._unions = 0

    def model(
        self,
        cls: type[BaseModel],
        *,
        exclude: frozenset[str] = frozenset(),
        from_dict: bool = False,
    ) -> str:
        """The name of ``cls``'s encoder in the namespace (writing it if needed); with
        ``from_dict`` it takes the field values as a dict instead of an instance."""
        key = cls if not exclude and not from_dict else None
        if key is not None and key in self.done:
            return self.done[key]
        name = f"_enc_{cls.__name__}_{len(self.namespace)}"
        if key is not None:
            self.done[key] = name  # before the fields: a model may nest itself
        lines = [f"def {name}(o):", "    d = o" if from_dict else "    d = o.__dict__"]
        parts: list[str] = []
        fields = sorted(n for n in cls.model_fields if n not in exclude)
        for i, field in enumerate(fields):
            info = cls.model_fields[field]
            if info.alias not in (None, field) or info.serialization_alias not in (None, field):
                raise TypeError(f"{cls.__name__}.{field}: aliases are not supported")
            var = f"v{i}"
            lines.append(f"    {var} = d[{field!r}]")
            key_text = ("," if i else "{") + _encode_str(field) + ":"
            parts.append(_literal(key_text))
            parts.append("{" + self.value(info.annotation, var, depth=0) + "}")
        parts.append(_literal("}" if fields else "{}"))
        # one f-string: its pieces are joined by the interpreter at once (the keys are
        # identifiers and the expressions use single quotes only, so the quoting holds)
        lines.append('    return f"""' + "".join(parts) + '"""')
        exec("\n".join(lines), self.namespace)  # our own generated source
        return name

    def value(self, annotation: Any, var: str, *, depth: int) -> str:
        """A Python expression encoding ``var``, which holds a value of ``annotation``."""
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if annotation is str:
            return f"_S({var})"
        if annotation is bool:
            return f"('true' if {var} is True else 'false' if {var} is False else _bad({var}))"
        if annotation is int:
            # exactly int: a bool or an int subclass has another repr than its JSON
            return f"(_int_repr({var}) if type({var}) is int else _bad({var}))"
        if origin is Literal and all(type(a) is str for a in args):
            return f"_S({var})"
        if origin is typing.Annotated:
            return self.value(args[0], var, depth=depth)
        if origin in (Union, types.UnionType):
            members = [a for a in args if a is not type(None)]
            if len(members) < len(args):  # Optional
                inner = members[0] if len(members) == 1 else Union[tuple(members)]  # noqa: UP007
                return f"('null' if {var} is None else {self.value(inner, var, depth=depth)})"
            if all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
                return self._union(members, var)
            return f"_T({var})"
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            item = f"x{depth}"
            inner = self.value(args[0], item, depth=depth + 1)
            return f"('[' + ','.join([{inner} for {item} in {var}]) + ']')"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return f"{self.model(annotation)}({var})"
        # dict[str, str], JsonValue and the like: free-form JSON, keys sorted per value
        return f"_T({var})"

    def _union(self, members: list[type[BaseModel]], var: str) -> str:
        """A discriminated union of models: the encoder of the value's own class."""
        self._unions += 1
        table_name = f"_union_{self._unions}"
        table = {m: self.namespace[self.model(m)] for m in members}
        self.namespace[table_name] = table
        return f"{table_name}[type({var})]({var})"


_COMPILER = _Compiler()


def compile_model_encoder(
    cls: type[BaseModel], *, exclude: frozenset[str] = frozenset(), from_dict: bool = False
) -> Callable[[Any], str]:
    """A function giving the canonical JSON text of an instance of ``cls`` (its fields
    but ``exclude``, every key sorted), as ``canonical_json(model_dump(mode="json"))``
    would, or raising on a value the model's types do not allow. With ``from_dict`` it
    takes a dict of the field values (what ``__dict__`` would hold) instead."""
    name = _COMPILER.model(cls, exclude=exclude, from_dict=from_dict)
    encoder: Callable[[Any], str] = _COMPILER.namespace[name]
    return encoder
