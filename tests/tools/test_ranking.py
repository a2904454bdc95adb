"""What the lexical and hybrid rankers read, and their quality on the held-out set.

The hybrid tests run the real packaged embedding model (``lodger[semantic]``, part of the
dev extra), loaded from the installed wheel with downloads disabled.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from lodger.runtime.config import load_catalog
from lodger.tools.ranking import (
    CURRENT,
    FITTED,
    ServerIndex,
    ToolIndex,
    action,
    query_terms,
    schema_words,
    summary,
    tokenize,
)
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import ToolSearch
from lodger.tools.semantic import HybridIndex, catalog_vectors, load_embedder
from lodger.tools.spec import Tool, ToolContext

HELD_OUT = Path(__file__).parent.parent.parent / "bench" / "data"


async def _nothing(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return ""


def make(name: str, description: str, properties: dict[str, Any] | None = None) -> Tool:
    return Tool(
        name=name,
        description=description,
        parameters={"type": "object", "properties": properties or {}},
        handler=_nothing,
        group="default",
        deferred=True,
    )


REPO_TOOLS = [
    make(
        "merge_pull_request",
        "Merge a pull request.",
        {"merge_method": {"type": "string", "enum": ["merge", "squash", "rebase"]}},
    ),
    make("create_pull_request", "Open a new pull request."),
    make("update_pull_request", "Update a pull request's title or body."),
    make(
        "list_commits",
        "List commits of a branch.",
        {"author": {"type": "string", "description": "Only commits by this GitHub login"}},
    ),
    make("delete_branch", "Delete a branch."),
]


def names(index: Any, query: str, limit: int = 3) -> list[str]:
    return [hit.name for hit in index.search(query, limit=limit)]


def test_schema_words_reads_nested_names_descriptions_and_enums() -> None:
    schema = {
        "type": "object",
        "description": "the arguments",  # the root's own description is not a parameter's
        "properties": {
            "merge_method": {"type": "string", "enum": ["merge", "squash"]},
            "files": {
                "type": "array",
                "items": {"type": "object", "properties": {"path": {"description": "Where"}}},
            },
            "mode": {"anyOf": [{"const": "x", "description": "Fast mode"}]},
        },
    }
    parameter_names, text = schema_words(schema)
    assert parameter_names.split() == ["merge_method", "files", "mode", "path"]
    assert set(text.split()) == {"merge", "squash", "Where", "Fast", "mode"}


def test_an_enum_value_finds_the_tool_that_has_it() -> None:
    # "squash" appears only in merge_pull_request's merge_method enum.
    assert names(ToolIndex(REPO_TOOLS), "land PR 77 with a squash")[0] == "merge_pull_request"
    # The ranker before parameters were read cannot see it.
    assert names(ToolIndex(REPO_TOOLS, weights=CURRENT), "squash") == []


def test_a_parameter_description_finds_the_tool() -> None:
    assert names(ToolIndex(REPO_TOOLS), "everything by one login") == ["list_commits"]


def test_user_words_also_search_the_words_definitions_use() -> None:
    terms = query_terms("open a PR")
    assert terms["pr"] == 1.0 and terms["pull"] == terms["request"] == FITTED.related
    assert query_terms("open a PR", related=0.0) == {"open": 1.0, "pr": 1.0}
    # A word said outright keeps its own weight.
    assert query_terms("pull PR")["pull"] == 1.0
    assert names(ToolIndex(REPO_TOOLS), "open a PR")[0] == "create_pull_request"


def test_the_first_sentence_is_read_as_a_field_of_its_own() -> None:
    assert summary("Merge a pull request. Use it only when checks pass.") == "Merge a pull request"
    assert summary("Bump v1.2 to v1.3 now") == "Bump v1.2 to v1.3 now"  # no sentence end
    assert summary("List pods\n\nNamespaces default to all.") == "List pods"
    assert summary("x" * 1000) == "x" * 300  # bounded
    tools = [
        make("a_tool", "Summarize a page. Never deletes anything or any branch."),
        make("b_tool", "Delete a branch. Then summarize what went away."),
    ]
    # Both descriptions say both words; the one whose first sentence says it wins.
    assert names(ToolIndex(tools), "delete")[0] == "b_tool"
    assert names(ToolIndex(tools), "summarize")[0] == "a_tool"


def test_function_words_are_dropped_and_inflections_stem_alike() -> None:
    assert tokenize("what is all this about, and would you just") == []
    # Snowball English: a doubled consonant undone, -ied as -y, -ions as the verb.
    assert tokenize("running mapped copied") == tokenize("runs maps copy") == ["run", "map", "copi"]
    assert tokenize("deletions associations") == tokenize("delete associate")
    assert tokenize("action region") == ["action", "region"]
    assert tokenize("PR 77 v2") == ["pr", "77", "v2"]  # short words and numbers as they are


def test_idf_counts_to_its_power() -> None:
    # "squash" is in one tool of five: its idf is log(1 + 4.5 / 1.5).
    idf = math.log(1 + 4.5 / 1.5)
    scores = {
        power: ToolIndex(REPO_TOOLS, weights=replace(FITTED, idf_power=power)).scores("squash")
        for power in (1.0, 0.5, FITTED.idf_power)
    }
    merge = ToolIndex(REPO_TOOLS).doc("merge_pull_request")
    assert list(scores[1.0]) == [merge]  # only it has squash (in its merge_method enum)
    for power in (0.5, FITTED.idf_power):
        assert scores[power][merge] == pytest.approx(scores[1.0][merge] * idf ** (power - 1))
    # Below 1, a rare term's lead over a common one shrinks (its idf counts less).
    assert FITTED.idf_power < 1


def test_a_group_named_in_the_query_raises_its_tools() -> None:
    def issue_tool(group: str) -> Tool:
        return Tool(
            name=f"{group}__create_issue",
            description="Create an issue.",
            parameters={"type": "object", "properties": {}},
            handler=_nothing,
            group=group,
            deferred=True,
        )

    tools = [issue_tool("github"), issue_tool("linear")]
    boosted = ToolIndex(tools)
    plain = ToolIndex(tools, weights=replace(FITTED, group_boost=0.0))
    # Ties break by name: github's first when no group is named.
    assert names(boosted, "create an issue") == ["github__create_issue", "linear__create_issue"]
    assert names(boosted, "create an issue in linear")[0] == "linear__create_issue"
    query = "create an issue in linear"
    with_boost = boosted.scores(query)[boosted.doc("linear__create_issue")]
    without = plain.scores(query)[plain.doc("linear__create_issue")]
    assert with_boost == pytest.approx(without * (1 + FITTED.group_boost))
    # github's score is not raised.
    github = boosted.doc("github__create_issue")
    assert boosted.scores(query)[github] == pytest.approx(plain.scores(query)[github])


def test_a_tool_whose_name_says_the_requested_kind_of_action_is_raised() -> None:
    assert action(tokenize("please file a bug, then list them")) == "create"
    assert action(tokenize("the weather")) is None
    tools = [
        make("list_issues", "Issues of a repository: open them, comment on them."),
        make("create_issue", "Issues of a repository."),
    ]
    query = "file an issue"  # "file" is a kind of create, and no word of create_issue
    boosted = ToolIndex(tools)
    plain = ToolIndex(tools, weights=replace(FITTED, action_boost=0.0))
    created = boosted.doc("create_issue")
    assert boosted.scores(query)[created] == pytest.approx(
        plain.scores(query)[created] * (1 + FITTED.action_boost)
    )
    listed = boosted.doc("list_issues")
    assert boosted.scores(query)[listed] == pytest.approx(plain.scores(query)[listed])


def test_words_said_apart_also_search_the_word_they_make_together() -> None:
    assert query_terms("roll back production")["rollback"] == FITTED.related
    assert query_terms("log in")["login"] == FITTED.related
    assert "rollback" not in query_terms("roll back", related=0.0)
    tools = [*REPO_TOOLS, make("run_rollback_pipeline", "Run a rollback pipeline.")]
    assert names(ToolIndex(tools), "roll back production")[0] == "run_rollback_pipeline"


def test_general_operation_words_find_the_api_word() -> None:
    index = ToolIndex(REPO_TOOLS)
    assert names(index, "erase the branch")[0] == "delete_branch"
    assert names(index, "tweak the PR title")[0] == "update_pull_request"
    assert names(ToolIndex(REPO_TOOLS, weights=CURRENT), "erase") == []


def test_a_tool_named_exactly_comes_first_in_both_rankers() -> None:
    lexical = ToolIndex(REPO_TOOLS)
    hybrid = HybridIndex(REPO_TOOLS, embedder=embedder())
    for index in (lexical, hybrid):
        assert names(index, "pull request delete_branch")[0] == "delete_branch"


def embedder() -> Any:
    model = load_embedder()
    assert model is not None, "the dev extra installs lodger[semantic]"
    return model


def test_the_hybrid_ranker_finds_a_tool_sharing_no_word_with_the_request() -> None:
    tools = [
        make("browser_take_screenshot", "Take a screenshot of the current page."),
        make("browser_resize", "Resize the browser window."),
        make("browser_click", "Perform a click on a web page."),
        make("list_commits", "List commits of a branch."),
    ]
    query = "photograph the browser window"  # "photograph" is in no definition
    assert "browser_take_screenshot" not in names(ToolIndex(tools), query, limit=2)
    assert "browser_take_screenshot" in names(HybridIndex(tools, embedder=embedder()), query, 2)


def test_the_hybrid_ranker_finds_nothing_for_words_it_does_not_know() -> None:
    hybrid = HybridIndex(REPO_TOOLS, embedder=embedder())
    assert names(hybrid, "zzzz qqqq") == []
    assert names(hybrid, "") == []


def grouped(name: str, description: str, group: str) -> Tool:
    return Tool(
        name=f"{group}__{name}",
        description=description,
        parameters={"type": "object", "properties": {}},
        handler=_nothing,
        group=group,
        deferred=True,
    )


SERVERS = [
    grouped(
        "create_engagement", "Create an engagement: a call, an email or a meeting note.", "crm"
    ),
    grouped("list_contacts", "List the contacts of a customer account.", "crm"),
    grouped("get_deal", "Get a deal of a customer.", "crm"),
    grouped("search_companies", "Search customer companies.", "crm"),
    grouped("create_event", "Create a meeting in a calendar.", "calendar"),
    grouped("list_events", "List events of a calendar.", "calendar"),
    grouped("create_issue", "Create an issue.", "tracker"),
]


def test_a_server_whose_definitions_say_the_request_scores_first() -> None:
    servers = ServerIndex(SERVERS)
    assert servers.groups == ["calendar", "crm", "tracker"]
    scores = servers.scores(query_terms("note the customer meeting"))
    by_group = dict(zip(servers.groups, scores, strict=True))
    # "customer" is said by three crm tools and by no calendar one; "meeting" by one of each.
    assert by_group["crm"] == 1.0 and 0 < by_group["calendar"] < 0.5
    assert by_group["tracker"] == 0.0
    assert servers.scores(query_terms("zzzz qqqq")) == [0.0, 0.0, 0.0]
    assert servers.scores({}) == [0.0, 0.0, 0.0]
    assert ServerIndex([]).scores(query_terms("customer")) == []
    # A tool with no description and no parameters still belongs to its server.
    bare = ServerIndex([grouped("ping", "", "bare"), *SERVERS])
    assert dict(zip(bare.groups, bare.scores(query_terms("ping")), strict=True)) == {
        "bare": 1.0,
        "calendar": 0.0,
        "crm": 0.0,
        "tracker": 0.0,
    }


def test_the_hybrid_ranker_raises_the_tools_of_the_server_a_request_is_about() -> None:
    query = "note the meeting with the customer"
    without = names(HybridIndex(SERVERS, embedder=embedder(), server_weight=0.0), query)
    assert without[:2] == ["crm__create_engagement", "calendar__create_event"]
    ranked = names(HybridIndex(SERVERS, embedder=embedder()), query)
    assert ranked[0] == "crm__create_engagement"
    assert all(name.startswith("crm__") for name in ranked)


def test_a_catalogs_embeddings_are_computed_once_per_digest() -> None:
    model = embedder()
    digest, vectors = catalog_vectors(REPO_TOOLS, model)
    again, same = catalog_vectors(list(REPO_TOOLS), model)
    assert (again, same) == (digest, vectors) and same is vectors
    changed = [*REPO_TOOLS[:-1], make("delete_branch", "Remove a branch.")]
    other, _ = catalog_vectors(changed, model)
    assert other != digest
    assert vectors.shape == (len(REPO_TOOLS), 256)


def test_tool_search_picks_the_ranker_and_builds_it_once_per_tool_set() -> None:
    registry = ToolRegistry(REPO_TOOLS)
    auto = ToolSearch(registry)
    assert isinstance(auto.index(), HybridIndex)  # the semantic extra is installed
    assert auto.index() is auto.index()
    assert auto.inventory().startswith("Deferred tools")
    assert type(ToolSearch(registry, ranker="lexical").index()) is ToolIndex
    registry.bind(make("fork_repository", "Fork a repository."))
    assert auto.index().get("fork_repository") is not None  # rebuilt for the new tool set


@pytest.mark.slow
def test_the_model_loads_from_the_package_with_no_cache_and_no_network(tmp_path: Path) -> None:
    # An empty home (no model cache) and proxies that lead nowhere: a download would fail.
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    code = (
        "from lodger.tools.semantic import load_embedder\n"
        "m = load_embedder()\n"
        "v = m.embed(['merge the pull request'])\n"
        "print(v.shape[1], round(float((v * v).sum()), 3))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["256", "1.0"]
    assert not (tmp_path / ".cache").exists()


def _quality(index: Any, split: str) -> float:
    requests = json.loads((HELD_OUT / "tool_search_requests.json").read_text())
    half = [q for q in requests if q["split"] == split]
    hits = sum(any(n in q["expected"] for n in names(index, q["query"], 5)) for q in half)
    return hits / len(half)


@pytest.mark.slow
def test_held_out_recall_does_not_regress() -> None:
    """Floors just under what bench/tool_search.py measured on the test half (lexical
    0.868, hybrid 0.887, the ranker before issue 17 0.723)."""
    catalog = load_catalog(HELD_OUT / "mcp_catalog_real.json")
    assert len(catalog) >= 600
    assert _quality(ToolIndex(catalog, weights=CURRENT), "test") < 0.75
    assert _quality(ToolIndex(catalog), "test") >= 0.86
    assert _quality(HybridIndex(catalog, embedder=embedder()), "test") >= 0.88
