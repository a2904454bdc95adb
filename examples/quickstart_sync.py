"""Run a turn from plain (non-async) code, and read what it cost.

python examples/quickstart_sync.py
"""

import tempfile

from lodger import Agent, ScriptedModel, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


model = ScriptedModel([{"calls": [{"name": "add", "args": {"a": 1, "b": 2}}]}, {"text": "3"}])
with (
    tempfile.TemporaryDirectory() as state,
    Agent(model=model, tools=[add], storage=state) as agent,
):
    result = agent.run_sync("what is 1 + 2?")
    print(result.status, result.output)
    print("model calls:", len(result.usage.requests), "durable commits:", result.commits)
    # the same session takes a second turn; the script plays again from its first step
    again = agent.run_sync("and again?", session=result.session_id)
    assert result.output == again.output == "3"
