"""A money budget over a subagent tree: the root and every child it delegated to count
together, read from their logs; a child that reaches it parks, and so does its parent."""

from __future__ import annotations

from pathlib import Path

from subagent_world import routed

from lodger import Agent, tool
from lodger.engine.budgets import Budgets
from lodger.engine.prices import ModelPrice, PriceTable
from lodger.engine.settings import Limits
from lodger.events import BudgetReached, Event, ToolResponded, Usage
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.subagents import SubagentPolicy, child_session_id

PRICES = PriceTable.defaults().with_prices({"function:tree": ModelPrice.of(2, "0.5", 8)})
USAGE = Usage(input_tokens=1000, cache_read_tokens=200, output_tokens=100)  # 2500 micro-USD


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def parent(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolResultMessage) for m in request.messages):
        return ModelResponse(text="parent done", usage=USAGE)
    return ModelResponse(calls=(tool_call("delegate", task="child task"),), usage=USAGE)


def child(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolResultMessage) for m in request.messages):
        return ModelResponse(text="4", usage=USAGE)
    return ModelResponse(calls=(tool_call("add", a=2, b=2),), usage=USAGE)


def tree_agent(state: Path, budgets: Budgets) -> Agent:
    return Agent(
        model=routed({"parent task": parent, "child task": child}, name="tree"),
        tools=[add],
        storage=state,
        subagents=SubagentPolicy(max_depth=1),
        limits=Limits(budgets=budgets),
    )


async def test_the_tree_budget_counts_the_children_and_parks_the_parent(tmp_path: Path) -> None:
    # parent 1 request, child 2: 7500 spent when the parent would ask again; the parent's
    # own 2500 are under its session budget, so only the tree's sum can park it
    budgets = Budgets(tree_usd="0.007", session_usd="0.004", prices=PRICES)
    async with tree_agent(tmp_path, budgets) as agent:
        result = await agent.run("parent task", session="p")
    assert result.status == "parked"
    assert result.budget == BudgetReached(
        budget="tree_cost", limit=7000, spent=7500, unit="micro_usd", scope="tree"
    )
    raised = Budgets(tree_usd="1", session_usd="0.004", prices=PRICES)
    async with tree_agent(tmp_path, raised) as agent:
        done = await agent.resume("p")
    assert done.status == "completed" and done.answer == "parent done"


async def test_a_child_reaching_the_tree_budget_parks_and_its_parent_too(tmp_path: Path) -> None:
    budgets = Budgets(tree_usd="0.005", prices=PRICES)  # the parent's 2500 + the child's first
    async with tree_agent(tmp_path, budgets) as agent:
        result = await agent.run("parent task", session="p")
        events = await agent.session("p").events()
        child_events = await agent.session(child_session_id("p", _delegate_id(events))).events()
    assert result.status == "parked" and result.budget is not None
    assert (result.budget.budget, result.budget.spent) == ("tree_cost", 5000)
    child_parks = [e.body for e in child_events if isinstance(e.body, BudgetReached)]
    assert child_parks == [
        BudgetReached(budget="tree_cost", limit=5000, spent=5000, unit="micro_usd", scope="tree")
    ]
    (answer,) = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert '"status": "open"' in answer.content and "tree_usd" in answer.content


def _delegate_id(events: list[Event]) -> str:
    return next(e.call_id or "" for e in events if isinstance(e.body, ToolResponded))
