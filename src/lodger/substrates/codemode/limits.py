"""The limits of one code cell: one frozen policy, replaced whole, never merged per field.

A run that wants other limits builds a new ``CellLimits`` (``dataclasses.replace`` on the
default is the easy way) and hands the whole value over; nothing downstream fills in
missing fields from another policy, so the limits a cell ran under are exactly one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CellLimits", "LimitName"]

LimitName = Literal[
    "wall_time",
    "memory",
    "source_bytes",
    "result_bytes",
    "nested_calls",
    "nested_in_flight",
    "argument_bytes",
]


@dataclass(frozen=True, kw_only=True)
class CellLimits:
    """What one cell may use. Exceeding any gives a ``limit_exceeded`` diagnostic that
    names the limit (``nested_in_flight`` is a bound on concurrency: further calls wait)."""

    #: seconds from the cell's start to its result, nested calls included
    wall_time: float = 30.0
    #: bytes of interpreter heap
    memory: int = 64 * 1024 * 1024
    #: bytes of UTF-8 source
    source_bytes: int = 64 * 1024
    #: bytes of the cell's JSON result
    result_bytes: int = 1024 * 1024
    #: nested tool calls one cell may make
    nested_calls: int = 32
    #: nested tool calls running at once (more wait their turn)
    nested_in_flight: int = 8
    #: bytes of console.log / print output kept (the rest is dropped and counted)
    log_bytes: int = 16 * 1024
    #: bytes of one nested call's JSON arguments (they are kept in the log, in its T1)
    argument_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "wall_time",
            "memory",
            "source_bytes",
            "result_bytes",
            "nested_in_flight",
            "argument_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"CellLimits.{name} must be positive")
        if self.nested_calls < 0 or self.log_bytes < 0:
            raise ValueError("CellLimits.nested_calls and log_bytes must not be negative")
