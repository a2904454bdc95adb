"""The registry of tools bound to a run, and what each step may see.

Bound is the ceiling: a run can only ever call what is bound here. Direct tools are
visible in every step, in declaration order (a stable prefix for prompt caching);
deferred tools become visible only once activated, appended in activation order.

A live source (``add_source``: MCP servers) may change one group's tools while a run
goes on: ``refresh`` (the engine calls it before each step) rebinds the groups whose
source says they changed, and says what each gained and lost (the engine logs it as
``tools_changed``). A step's visible tools are fixed when it starts, so a change lands
between steps, never inside one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from lodger.errors import UsageError
from lodger.events import ProposedCall
from lodger.tools.spec import Tool

__all__ = ["GroupChange", "ToolRegistry", "ToolSource", "ToolsReplaced"]

_log = logging.getLogger("lodger.tools")


@dataclass(frozen=True, kw_only=True)
class ToolsReplaced:
    """A source's new tools for one group (all of them), and which cannot be called."""

    group: str
    tools: Sequence[Tool]
    unusable: Sequence[str] = ()


@dataclass(frozen=True, kw_only=True)
class GroupChange:
    """What a refresh did to one group: names bound anew (or rebound with a new
    definition), names no longer bound, and listed names that cannot be called."""

    group: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    unusable: tuple[str, ...]


class ToolSource(Protocol):
    """Tools that may change while a run goes on (an MCP server's listing)."""

    def stale(self) -> bool:
        """Whether a group changed since the last ``refresh`` (cheap: asked every step)."""
        ...

    async def refresh(self) -> Sequence[ToolsReplaced]: ...


class ToolRegistry:
    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._first: set[str] = set()
        self._prompt_sections: list[Callable[[], str]] = []
        self._sources: list[ToolSource] = []
        #: counts the changes to the bound tools (a bind, a refresh that changed a group)
        self.version = 0
        for t in tools:
            self.bind(t)

    def copy(self, *, without: Sequence[str] = ()) -> ToolRegistry:
        """A registry with the same tools (less ``without``), batches and prompt sections:
        what one run binds when it adds or replaces a tool for itself."""
        other = ToolRegistry()
        other._tools = {name: t for name, t in self._tools.items() if name not in without}
        other._first = set(self._first)
        other._prompt_sections = list(self._prompt_sections)
        other._sources = self._sources  # shared: a refresh of one run is every run's
        other.version = self.version
        return other

    def add_source(self, source: ToolSource) -> None:
        """Rebind the groups ``source`` changes whenever ``refresh`` is called."""
        self._sources.append(source)

    async def refresh(self) -> list[GroupChange]:
        """Rebind what the sources changed (between steps); what changed, per group."""
        changes: list[GroupChange] = []
        for source in self._sources:
            if source.stale():
                for replaced in await source.refresh():
                    changes.append(self._replace(replaced))
        return changes

    def _replace(self, replaced: ToolsReplaced) -> GroupChange:
        group = replaced.group
        old = {name: t for name, t in self._tools.items() if t.group == group}
        new = {t.name: t for t in replaced.tools}
        removed = tuple(name for name in old if name not in new)
        for name in removed:
            del self._tools[name]
        added: list[str] = []
        for name, t in new.items():
            was = old.get(name)
            if was is not None and (was.schema_digest(), was.description) == (
                t.schema_digest(),
                t.description,
            ):
                continue  # the same definition: the bound tool stays
            if was is None and name in self._tools:
                _log.warning("tool %r of %r is not bound: another tool has its name", name, group)
                continue
            self._tools[name] = t
            added.append(name)
        unusable = tuple(n for n in replaced.unusable if n in self._tools)
        if added or removed:
            self.version += 1
        return GroupChange(group=group, added=tuple(added), removed=removed, unusable=unusable)

    def bind(self, t: Tool) -> None:
        if t.name in self._tools:
            raise UsageError(
                f"two tools are named {t.name!r}",
                hint="rename one of them (tool names must be unique in a run)",
                code="duplicate_tool",
            )
        self._tools[t.name] = t
        self.version += 1

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
