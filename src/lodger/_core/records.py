"""Frozen dataclass instances made without their generated ``__init__``.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``: about
0.2 us a field, 2 us for a ``ToolContext``. The call path makes several per call (the
tool's context, the call's outcome, the messages of the projection, the model request)
from values it already holds with the right types. ``record(cls, fields)`` gives the
instance the ``__init__`` would have given for those fields: the caller passes every
field, in declaration order, and the class must be one ``__init__`` does nothing more
for (no ``__post_init__``, no slots, no ``InitVar``); ``recordable`` checks that once per
class and a test holds each class used here equal to its constructor's instance.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["record", "recordable"]

_T = TypeVar("_T")

_new = object.__new__
_set = object.__setattr__
_checked: set[type] = set()


def recordable(cls: type) -> bool:
    """Whether ``record`` may build ``cls``: a dataclass whose ``__init__`` only stores
    its fields in the instance's ``__dict__``."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in cls.__dict__:
        return False
    if hasattr(cls, "__post_init__"):
        return False
    return all(f.init and f._field_type is dataclasses._FIELD for f in dataclasses.fields(cls))  # type: ignore[attr-defined]


def record(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of ``cls`` holding ``fields`` (every field of ``cls``, in order)."""
    if cls not in _checked:
        if not recordable(cls):
            raise TypeError(f"{cls.__name__} cannot be built without its __init__")
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        if list(fields) != names:
            raise TypeError(f"{cls.__name__} needs exactly the fields {names}, in order")
        _checked.add(cls)
    obj = _new(cls)
    _set(obj, "__dict__", fields)
    return obj
