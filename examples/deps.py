"""Typed dependencies: what a tool needs (a client, a connection, settings) is passed
per run and reaches the tool as ``ctx.deps``. Deps are never logged.

    python examples/deps.py
"""

import tempfile
from dataclasses import dataclass

from lodger import Agent, ScriptedModel, ToolContext, ToolResultMessage, tool


@dataclass
class Bank:
    balances: dict[str, int]


@tool
def balance(account: str, ctx: ToolContext[Bank]) -> int:
    """The balance of an account."""
    return ctx.deps.balances[account]


model = ScriptedModel(
    [{"calls": [{"name": "balance", "args": {"account": "alice"}}]}, {"text": "done"}]
)
with (
    tempfile.TemporaryDirectory() as state,
    Agent(model=model, tools=[balance], storage=state) as agent,
):
    result = agent.run_sync("what does alice have?", deps=Bank({"alice": 42}))
    results = [m for m in result.messages if isinstance(m, ToolResultMessage)]
    assert results[-1].content == "42"
    print("balance tool returned", results[-1].content)
