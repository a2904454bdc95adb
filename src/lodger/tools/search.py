"""Deferred tools: the inventory and the ``tool_search`` tool (DESIGN section 6).

A deferred tool is bound but its schema is not sent: the system prompt carries only a
compact inventory (names by group), and ``tool_search(query)`` loads the best matches
(ranked by ``lodger.tools.ranking``), or exact names with ``select:a,b``, bounded by a
count and a total schema size, skipping tools already visible.

A search activates what it found: it logs a ``tools_activated`` fact, and the agent makes
those schemas visible from the *next* step (a call in the same step is rejected with a
message saying so). Activations last until the turn ends. Searching binds nothing new
and grants no permission: it only changes what the model is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from lodger.errors import ConfigError, ToolCallError
from lodger.tools.registry import ToolRegistry
from lodger.tools.spec import Tool, ToolContext

if TYPE_CHECKING:
    from lodger.tools.ranking import SearchHit, ToolIndex, tokenize

__all__ = [
    "TOOL_SEARCH",
    "Ranker",
    "RankerName",
    "SearchHit",
    "ToolIndex",
    "ToolSearch",
    "attach_tool_search",
    "tokenize",
]

TOOL_SEARCH = "tool_search"

RankerName = Literal["auto", "lexical", "hybrid"]


class Ranker(Protocol):
    """What ranks deferred tools: ``ToolIndex`` (lexical) or ``HybridIndex``."""

    tools: list[Tool]

    def __len__(self) -> int: ...

    def get(self, name: str) -> Tool | None: ...

    def search(self, query: str, *, limit: int = 5) -> list[SearchHit]: ...


def _ranker(tools: Sequence[Tool], name: RankerName) -> Ranker:
    """``auto`` is the hybrid ranker when the ``semantic`` extra is installed, else lexical."""
    from lodger.tools.ranking import ToolIndex  # imported here: see __getattr__

    if name == "lexical":
        return ToolIndex(tools)
    from lodger.tools.semantic import HybridIndex, load_embedder

    embedder = load_embedder()
    if embedder is None:
        if name == "hybrid":
            raise ConfigError(
                "the hybrid tool_search ranker needs an embedding model, and none is installed",
                hint="install lodger[semantic], or use the lexical ranker",
            )
        return ToolIndex(tools)
    return HybridIndex(tools, embedder=embedder)


# ---------------------------------------------------------------- the tool


_DESCRIPTION = (
    "Load deferred tools. The system prompt lists them by group and name only; their "
    "schemas are not loaded. Pass words describing what you need (ranked against tool "
    'names, descriptions and groups), or "select:NAME1,NAME2" for exact names. Found '
    "tools can be called from your NEXT step on, not in the step that searched."
)


def _parameters(max_results: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": 'What the tool should do, e.g. "create github issue", or '
                '"select:NAME1,NAME2"',
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": max_results,
                "description": "Load at most this many tools",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def _one_line(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class ToolSearch:
    """``tool_search`` over the deferred tools of one registry, and their inventory.

    ``max_results`` bounds how many tools one search activates and ``max_schema_bytes``
    the total size of their schemas (the best hit always fits, so any tool can be loaded).
    An inventory longer than ``max_inventory_chars`` lists groups with counts instead.
    ``ranker`` picks the ranking (``auto``: hybrid when ``lodger[semantic]`` is installed,
    else lexical); it is built once per bound tool set, on the first search.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        max_results: int = 5,
        max_schema_bytes: int = 24_000,
        max_inventory_chars: int = 16_000,
        ranker: RankerName = "auto",
    ) -> None:
        self.registry = registry
        self.ranker = ranker
        self.max_results = max_results
        self.max_schema_bytes = max_schema_bytes
        self.max_inventory_chars = max_inventory_chars
        self._built_for = -1
        self._deferred: list[Tool] = []
        self._index: Ranker | None = None
        self._inventory = ""

    def _current(self) -> None:
        # The registry's version says whether the tool set is current (it counts every
        # bind and every refresh that changed a group).
        if self._built_for != self.registry.version:
            self._deferred = sorted(self.registry.deferred(), key=lambda t: t.name)
            self._inventory = _inventory(self._deferred, self.max_inventory_chars)
            self._index = None
            self._built_for = self.registry.version

    def index(self) -> Ranker:
        """The ranker over the deferred tools, built on first use per bound tool set."""
        self._current()
        if self._index is None:
            self._index = _ranker(self._deferred, self.ranker)
        return self._index

    def inventory(self) -> str:
        """The deferred tools by group, sorted: a stable suffix for the system prompt."""
        self._current()
        return self._inventory

    def system(self, base: str) -> str:
        inventory = self.inventory()
        return f"{base}\n\n{inventory}" if inventory else base

    def tool(self) -> Tool:
        return Tool(
            name=TOOL_SEARCH,
            description=_DESCRIPTION,
            parameters=_parameters(self.max_results),
            handler=self._handle,
            group="lodger",
            recovery="idempotent",  # searching again activates the same names again
        )

    def choose(
        self, query: str, *, shown: frozenset[str] = frozenset(), limit: int | None = None
    ) -> tuple[list[Tool], list[str], list[str]]:
        """What a search for ``query`` activates, and the names it skipped as already
        shown and as over the budget."""
        index = self.index()
        count = min(limit or self.max_results, self.max_results)
        if query.strip().startswith("select:"):
            wanted = [n.strip() for n in query.strip()[len("select:") :].split(",") if n.strip()]
            found = [t for t in (index.get(n) for n in wanted) if t is not None]
            missing = [n for n in wanted if index.get(n) is None and n not in shown]
            if missing:
                raise ToolCallError(
                    f"no deferred tool is named {', '.join(map(repr, missing))}; "
                    "the inventory in the system prompt lists every name"
                )
        else:
            # A few more than fit, named in the result so the model can select them later.
            found = [hit.tool for hit in index.search(query, limit=count + len(shown) + 3)]
        chosen: list[Tool] = []
        skipped: list[str] = []
        over: list[str] = []
        size = 0
        for t in found:
            if t.name in shown:
                skipped.append(t.name)
            elif len(chosen) < count and (
                not chosen or size + t.schema_size() <= self.max_schema_bytes
            ):
                chosen.append(t)
                size += t.schema_size()
            else:
                over.append(t.name)
        return chosen, skipped, over

    async def _handle(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        step = ctx.step
        if step is None:
            raise ToolCallError(
                "tool_search runs only as a call of a model step (an interrupted search "
                "is not repeated by recovery); call tool_search again"
            )
        query = str(arguments["query"])
        limit = arguments.get("limit")
        chosen, skipped, over = self.choose(
            query, shown=step.shown(), limit=limit if isinstance(limit, int) else None
        )
        lines: list[str] = []
        if chosen:
            await step.activate(query, [t.name for t in chosen])
            lines.append(f"Loaded {len(chosen)} tool(s); call them from your next step on:")
            lines.extend(f"- {t.name}: {_one_line(t.description)}" for t in chosen)
        if skipped:
            lines.append("Already loaded: " + ", ".join(skipped))
        if over:
            lines.append("Also matched, not loaded (over the limit): " + ", ".join(over))
        if not lines:
            lines.append(
                f"No deferred tool matched {query!r}. Try other words, or select:NAME with "
                "a name from the inventory in the system prompt."
            )
        return "\n".join(lines)


def _inventory(tools: Sequence[Tool], max_chars: int) -> str:
    """Names by group; past ``max_chars`` (thousands of tools), groups and counts only."""
    if not tools:
        return ""
    groups: dict[str, list[str]] = {}
    for t in tools:
        groups.setdefault(t.group, []).append(t.name)
    head = (
        "Deferred tools (schemas not loaded; load them with tool_search, then call them "
        "from the next step):"
    )
    lines = [f"- {group}: {', '.join(sorted(names))}" for group, names in sorted(groups.items())]
    if sum(len(line) + 1 for line in lines) > max_chars:
        lines = [f"- {group}: {len(names)} tools" for group, names in sorted(groups.items())]
        head = head[:-2] + "; search by what you need, as names are not listed):"
    return "\n".join([head, *lines])


def attach_tool_search(registry: ToolRegistry, **options: Any) -> ToolSearch | None:
    """Bind ``tool_search`` to ``registry`` when it holds a deferred tool; the search.

    The registry then puts the inventory at the end of the system prompt, and runs a
    step's searches before its other calls: a search has no effect but its activation
    fact, so letting it settle first changes no outcome, and it makes the visibility check
    of a call to a tool the same step just activated deterministic ("call it on the next
    step", whatever the timing).
    """
    if not registry.deferred():
        return None
    search = ToolSearch(registry, **options)
    registry.bind(search.tool())
    registry.run_first(TOOL_SEARCH)
    registry.add_prompt_section(search.inventory)
    return search


def __getattr__(name: str) -> Any:
    # The ranking (its tables and the Snowball stemmer: about 40 ms of imports) loads when
    # a search first needs it, not with every agent that might defer tools.
    if name in ("SearchHit", "ToolIndex", "tokenize"):
        from lodger.tools import ranking

        return getattr(ranking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
