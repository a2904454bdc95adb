"""The translation-model experiment (``bench/tool_search_translation.py``) learns what it
is given and ranks as the shipped lexical ranker does: its negative result is about the
idea, not a broken harness. Nothing of it ships (the README says why, with figures)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lodger.tools.ranking import ServerIndex, ToolIndex, query_terms, tokenize
from lodger.tools.spec import Tool, ToolContext

sys.path.insert(0, str(Path(__file__).parent.parent.parent / "bench"))
import tool_search_translation as tm


async def _nothing(arguments: dict[str, Any], ctx: ToolContext) -> str:
    return ""


def make(name: str, group: str, description: str) -> Tool:
    return Tool(
        name=f"{group}__{name}",
        description=description,
        parameters={"type": "object", "properties": {}},
        handler=_nothing,
        group=group,
        deferred=True,
    )


CATALOG = [
    make("create_issue", "tracker", "Create an issue in a project."),
    make("list_issues", "tracker", "List the issues of a project."),
    make("get_project", "tracker", "Get a project by its id."),
    make("send_message", "chat", "Send a message to a channel."),
    make("list_channels", "chat", "List the channels of a workspace."),
    make("get_invoice", "billing", "Get an invoice by its id."),
    make("refund_payment", "billing", "Refund a payment, wholly or in part."),
]


def request(index: ToolIndex, text: str, *names: str) -> tm.Query:
    return tm.Query(
        text=text,
        own=list(dict.fromkeys(tokenize(text))),
        expected={index.doc(n) for n in names},
        terms=query_terms(text, related=0.0),
        cosine=np.zeros(len(index.tools), dtype=np.float32),
    )


@pytest.fixture
def index() -> ToolIndex:
    return ToolIndex(CATALOG, weights=tm.replace(tm.FITTED, related=0.0))


@pytest.fixture
def train(index: ToolIndex) -> list[tm.Query]:
    # "gripe" is said only in requests whose right tool is about issues; "issue" is rarer
    # in the catalog than "tracker" and "project", which those tools also say.
    return [
        request(index, "log a gripe about the login page", "tracker__create_issue"),
        request(index, "show every gripe from last week", "tracker__list_issues"),
        request(index, "post hello to the team", "chat__send_message"),
    ]


@pytest.mark.parametrize("method", ["cooc", "model1"])
def test_a_planted_association_is_learned(
    index: ToolIndex, train: list[tm.Query], method: str
) -> None:
    learner = tm.Learner.of(index, "short")
    table = learner.cooc(train) if method == "cooc" else learner.model1(train)
    kept = tm.expansions(table, top=3, minimum=2)
    assert [w for w, _ in kept["gripe"]][:1] == ["issu"]
    # Seen once only, "hello" -> "messag" is dropped at a minimum of two requests.
    assert "hello" not in kept
    assert "hello" in tm.expansions(table, top=3, minimum=1)


def test_the_learned_words_rank_the_tool_a_request_shares_no_word_with(
    index: ToolIndex, train: list[tm.Query]
) -> None:
    ranker = tm.Ranker(index, ServerIndex(CATALOG))
    table = tm.expansions(tm.Learner.of(index, "short").cooc(train), top=3, minimum=2)
    q = request(index, "any gripe open", "tracker__list_issues", "tracker__create_issue")
    assert ranker.rank(q, q.terms, hybrid=False) == []
    ranked = ranker.rank(q, tm.expanded(q, table, 0.4), hybrid=False)
    assert {index.tools[d].name for d in ranked[:2]} == {
        "tracker__create_issue",
        "tracker__list_issues",
    }


def test_a_request_of_unknown_words_is_unchanged(index: ToolIndex, train: list[tm.Query]) -> None:
    table = tm.expansions(tm.Learner.of(index, "all").model1(train), top=5, minimum=1)
    q = request(index, "zorblax quuxify", "billing__get_invoice")
    assert tm.expanded(q, table, 0.7) == q.terms


def test_the_replica_ranks_as_the_shipped_lexical_ranker(index: ToolIndex) -> None:
    ranker = tm.Ranker(index, ServerIndex(CATALOG))
    for text in ("list the issues", "refund that payment", "message the channel", "create"):
        q = request(index, text, "billing__get_invoice")
        assert ranker.rank(q, q.terms, hybrid=False)[:5] == [
            index.doc(h.name) for h in index.search(text, limit=5)
        ]


def test_the_translation_score_favours_the_tools_saying_the_translations(
    index: ToolIndex, train: list[tm.Query]
) -> None:
    learner = tm.Learner.of(index, "short")
    table = tm.expansions(learner.model1(train), top=1, minimum=2)
    q = request(index, "any gripe open", "tracker__list_issues")
    score = tm.translation_score(q, table, learner)
    assert {index.tools[d].name for d in np.flatnonzero(score == 1.0)} == {
        "tracker__create_issue",
        "tracker__list_issues",
    }
    assert score[index.doc("chat__send_message")] == 0.0
    unknown = request(index, "zorblax quuxify", "billing__get_invoice")
    assert not tm.translation_score(unknown, table, learner).any()
    ranker = tm.Ranker(index, ServerIndex(CATALOG))
    extra = 0.2 * score
    assert {index.tools[d].name for d in ranker.rank(q, q.terms, False, extra=extra)} == {
        "tracker__create_issue",
        "tracker__list_issues",
    }
