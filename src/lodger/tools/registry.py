"""The registry of tools bound to a run, and what each step may see.

Bound is the ceiling: a run can only ever call what is bound here. Direct tools are
visible in every step, in declaration order (a stable prefix for prompt caching);
deferred tools become visible only once activated, appended in activation order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from lodger.errors import UsageError
from lodger.events import ProposedCall
from lodger.tools.spec import Tool

__all__ = ["ToolRegistry"]


class ToolRegistry:
    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._first: set[str] = set()
        self._prompt_sections: list[Callable[[], str]] = []
        for t in tools:
            self.bind(t)

    def copy(self, *, without: Sequence[str] = ()) -> ToolRegistry:
        """A registry with the same tools (less ``without``), batches and prompt sections:
        what one run binds when it adds or replaces a tool for itself."""
        other = ToolRegistry()
        other._tools = {name: t for name, t in self._tools.items() if name not in without}
        other._first = set(self._first)
        other._prompt_sections = list(self._prompt_sections)
        return other

    def bind(self, t: Tool) -> None:
        if t.name in self._tools:
            raise UsageError(
                f"two tools are named {t.name!r}",
                hint="rename one of them (tool names must be unique in a run)",
                code="duplicate_tool",
            )
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def direct(self) -> list[Tool]:
        return [t for t in self._tools.values() if not t.deferred]

    def deferred(self) -> list[Tool]:
        return [t for t in self._tools.values() if t.deferred]

    def visible(self, activated: Iterable[str] = ()) -> list[Tool]:
        """Direct tools first, then activated deferred tools in activation order."""
        out = self.direct()
        seen = {t.name for t in out}
        for name in activated:
            t = self._tools.get(name)
            if t is not None and name not in seen:
                out.append(t)
                seen.add(name)
        return out

    def run_first(self, name: str) -> None:
        """Run calls to ``name`` in a batch of their own before a step's other calls."""
        self._first.add(name)

    def batches(self, calls: Sequence[ProposedCall]) -> list[Sequence[ProposedCall]]:
        """A step's calls as the batches to run in turn (see ``run_first``)."""
        first = [c for c in calls if c.name in self._first]
        if not first or len(first) == len(calls):
            return [calls]
        return [first, [c for c in calls if c.name not in self._first]]

    def add_prompt_section(self, section: Callable[[], str]) -> None:
        """Text appended to the system prompt (the deferred tools' inventory)."""
        self._prompt_sections.append(section)

    def system_prompt(self, base: str) -> str:
        parts = [base, *(text for text in (s() for s in self._prompt_sections) if text)]
        return "\n\n".join(parts)
