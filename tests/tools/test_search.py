"""Ranking, selection and the inventory of tool_search, and its recall on the shipped set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ToolCallError
from lodger.events import ProposedCall, ToolsActivated
from lodger.runtime.config import load_catalog
from lodger.tools.ranking import ToolIndex, tokenize
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import ToolSearch, attach_tool_search
from lodger.tools.spec import StepHandle, Tool, ToolContext

DATA = Path(__file__).parent.parent / "data"


async def _nothing(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return ""


def make(name: str, description: str, group: str = "default", **options: Any) -> Tool:
    return Tool(
        name=name,
        description=description,
        parameters={"type": "object", "properties": {}},
        handler=_nothing,
        group=group,
        deferred=True,
        **options,
    )


def ctx(step: StepHandle | None = None) -> ToolContext:
    return ToolContext(
        session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o", step=step
    )


class FakeStep:
    """A step handle that records activation facts in a list (the engine commits them)."""

    def __init__(self, visible: frozenset[str], record: Any) -> None:
        self.step_id = "step"
        self.visible = visible
        self.activated_here: set[str] = set()
        self.record = record

    def shown(self) -> frozenset[str]:
        return self.visible | self.activated_here

    async def activate(self, query: str, names: Any) -> None:
        await self.record(ToolsActivated(query=query, names=tuple(names)))
        self.activated_here.update(names)


def test_tokenize_splits_identifiers_stems_and_drops_stopwords() -> None:
    assert tokenize("getPullRequest list_files git-diff") == [
        "pull", "request", "list", "file", "git", "diff"
    ]  # fmt: skip
    # Inflections of one word meet on one stem, in queries and in descriptions alike.
    assert len({tokenize(w)[0] for w in ("create", "creates", "creating", "created")}) == 1
    assert tokenize("queries") == tokenize("query")
    assert tokenize("how do I use the browser") == ["browser"]


def test_the_name_weighs_more_than_the_description() -> None:
    index = ToolIndex(
        [
            make("notes", "Write a screenshot description into your notes."),
            make("screenshot", "Capture the page."),
        ]
    )
    assert [h.name for h in index.search("screenshot")] == ["screenshot", "notes"]


def test_the_group_ranks_its_tools_and_ties_break_by_name() -> None:
    index = ToolIndex(
        [
            make("b__list", "List things.", group="b"),
            make("a__list", "List things.", group="a"),
            make("c__delete", "Delete things.", group="c"),
        ]
    )
    assert [h.name for h in index.search("list")] == ["a__list", "b__list"]
    assert [h.name for h in index.search("list", limit=1)] == ["a__list"]
    assert index.search("list b")[0].name == "b__list"
    assert index.search("nothing matches") == []


def test_a_query_naming_a_tool_exactly_puts_it_first() -> None:
    index = ToolIndex(
        [make("git__git_log", "Shows the log", group="git"), make("logs", "Read logs of logs")]
    )
    assert index.search("logs")[0].name == "logs"
    assert index.search("git__git_log logs")[0].name == "git__git_log"


def test_recall_at_5_on_the_shipped_queries_stays_at_least_90_percent() -> None:
    catalog = load_catalog(DATA / "mcp_catalog.json")
    queries = json.loads((DATA / "tool_search_queries.json").read_text())
    assert len(catalog) >= 200 and len(queries) >= 60
    names = {t.name for t in catalog}
    assert all(e in names for q in queries for e in q["expected"])  # labels name real tools
    index = ToolIndex(catalog)
    hits = [
        any(e in [h.name for h in index.search(q["query"], limit=5)] for e in q["expected"])
        for q in queries
    ]
    assert sum(hits) / len(queries) >= 0.9


def search_over(*tools: Tool, **options: Any) -> ToolSearch:
    search = attach_tool_search(ToolRegistry(tools), **options)
    assert search is not None
    return search


def test_selection_is_bounded_by_count_and_schema_bytes_and_skips_shown_tools() -> None:
    tools = [make(f"mail__send_{i}", "Send an email message.", group="mail") for i in range(8)]
    # Lexical: equal scores, so the order is by name (the embeddings see the digits).
    search = search_over(*tools, max_results=3, ranker="lexical")
    chosen, skipped, over = search.choose("send email")
    assert [t.name for t in chosen] == ["mail__send_0", "mail__send_1", "mail__send_2"]
    assert over == ["mail__send_3", "mail__send_4", "mail__send_5"] and skipped == []
    chosen, skipped, over = search.choose("send email", shown=frozenset({"mail__send_0"}))
    assert skipped == ["mail__send_0"] and chosen[0].name == "mail__send_1"

    size = tools[0].schema_size()
    search = search_over(*tools, max_schema_bytes=2 * size + 1, ranker="lexical")
    chosen, _, over = search.choose("send email")
    assert len(chosen) == 2 and over[0] == "mail__send_2"
    search = search_over(*tools, max_schema_bytes=1)
    assert len(search.choose("send email")[0]) == 1  # the best match always fits


def test_select_loads_exact_names_and_refuses_unknown_ones() -> None:
    search = search_over(make("a__x", "X."), make("a__y", "Y."))
    chosen, skipped, _ = search.choose("select:a__y, a__x", shown=frozenset({"a__x"}))
    assert [t.name for t in chosen] == ["a__y"] and skipped == ["a__x"]
    with pytest.raises(ToolCallError, match="no deferred tool is named 'a__z'"):
        search.choose("select:a__y,a__z")
    with pytest.raises(ToolCallError, match="'tool_search'"):
        search.choose("select:tool_search")  # direct tools are not deferred


def test_inventory_is_sorted_names_by_group_and_degrades_to_counts() -> None:
    tools = [make("z__b", "B", group="z"), make("z__a", "A", group="z"), make("k__c", "C", "k")]
    search = search_over(make("direct", "D").with_options(deferred=False), *tools)
    assert search.inventory().splitlines()[1:] == ["- k: k__c", "- z: z__a, z__b"]
    assert search.registry.system_prompt("base").startswith("base\n\nDeferred tools")
    small = search_over(*tools, max_inventory_chars=10)
    assert small.inventory().splitlines()[1:] == ["- k: 1 tools", "- z: 2 tools"]


def test_no_tool_search_without_deferred_tools() -> None:
    registry = ToolRegistry([make("a", "A").with_options(deferred=False)])
    assert attach_tool_search(registry) is None
    assert registry.names() == ["a"]


async def test_the_tool_records_the_activation_before_the_step_sees_it() -> None:
    search = search_over(make("web__fetch", "Fetch a URL as markdown.", group="web"))
    tool_search = search.registry.get("tool_search")
    assert tool_search is not None
    order: list[str] = []

    async def record(fact: ToolsActivated) -> None:
        order.append(f"fact:{','.join(fact.names)}:{sorted(step.activated_here)}")

    step = FakeStep(frozenset({"tool_search"}), record)
    text = await tool_search.handler({"query": "fetch url"}, ctx(step))
    assert order == ["fact:web__fetch:[]"] and step.activated_here == {"web__fetch"}
    assert text.startswith("Loaded 1 tool(s); call them from your next step on:")
    assert "- web__fetch: Fetch a URL as markdown." in text
    again = await tool_search.handler({"query": "fetch url"}, ctx(step))
    assert again == "Already loaded: web__fetch" and len(order) == 1
    with pytest.raises(ToolCallError, match="runs only as a call of a model step"):
        await tool_search.handler({"query": "fetch"}, ctx())


def test_searches_run_before_the_other_calls_of_their_step() -> None:
    def call(n: int, name: str) -> ProposedCall:
        return ProposedCall(call_id=str(n), name=name, arguments="{}")

    registry = search_over(make("web__fetch", "Fetch a URL.")).registry
    mixed = [call(1, "a"), call(2, "tool_search"), call(3, "b")]
    assert [[c.call_id for c in b] for b in registry.batches(mixed)] == [["2"], ["1", "3"]]
    plain = [call(1, "a"), call(2, "b")]
    assert registry.batches(plain) == [plain]
