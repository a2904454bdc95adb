"""The cell substrate interface: one fresh, isolated interpreter per cell.

A substrate runs a cell's source with nothing of the host in reach but ``tools`` (every
call goes to the ``CellHost``) and says how it ended as a ``CellOutcome``: a JSON value,
or a diagnostic the model can act on (``parse_error``, ``runtime_error`` with a stack that
names only the cell's own lines, ``limit_exceeded`` naming the limit ...). Output the cell
prints is captured, bounded, and returned with either.

Two substrates implement it: ``JavaScriptSubstrate`` (V8 through mini-racer) and
``PythonSubstrate`` (the Monty interpreter through pydantic-monty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from lodger.substrates.codemode._host import CellHost
from lodger.substrates.codemode.limits import CellLimits, LimitName

__all__ = ["CellOutcome", "CellSubstrate", "Diagnostic", "LogBuffer"]


@dataclass(frozen=True, kw_only=True)
class Diagnostic:
    """Why a cell produced no value; ``kind`` is a stable code."""

    kind: str  # parse_error, runtime_error, limit_exceeded, unknown_tool, not_nestable ...
    message: str
    limit: LimitName | None = None
    stack: str | None = None
    tool: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Clipped: a message or stack quotes the cell's source (a traceback quotes a 60 KB
        # line whole; a tool name is whatever the cell asked for), and a diagnostic too
        # large for the call's result limit would be cut by the pipeline mid-JSON.
        out: dict[str, Any] = {"kind": self.kind, "message": _clip(self.message, 2000)}
        for key in ("limit", "stack", "tool"):
            value = getattr(self, key)
            if value:
                out[key] = _clip(value, {"stack": 4000, "tool": 200}.get(key, len(value)))
        return out


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... ({len(text) - limit} more characters)"


@dataclass(frozen=True, kw_only=True)
class CellOutcome:
    value: Any = None
    diagnostic: Diagnostic | None = None
    logs: tuple[str, ...] = ()
    logs_dropped: int = 0


@dataclass
class LogBuffer:
    """console.log / print lines, kept up to ``limit`` bytes; the rest are counted."""

    limit: int
    lines: list[str] = field(default_factory=list)
    size: int = 0
    dropped: int = 0

    def add(self, line: str) -> None:
        cost = len(line.encode("utf-8", "replace")) + 1
        if self.size + cost > self.limit:
            self.dropped += 1
            return
        self.size += cost
        self.lines.append(line)


class CellSubstrate(Protocol):
    """Runs one cell in a fresh interpreter; never raises for the cell's faults."""

    language: str

    async def run(self, source: str, host: CellHost, limits: CellLimits) -> CellOutcome: ...

    async def aclose(self) -> None:
        """Release what the substrate keeps between cells (a worker pool)."""
        ...
