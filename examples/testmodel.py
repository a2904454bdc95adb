"""TestModel: exercise every tool with schema-valid arguments, with no script. Useful in
your own tests: each tool runs once through the whole durable path.

    python examples/testmodel.py
"""

import tempfile
from typing import Literal

from pydantic import BaseModel

from lodger import Agent, TestModel, tool


class Address(BaseModel):
    street: str
    zip_code: str


@tool
def ship(item: str, quantity: int, speed: Literal["slow", "fast"], to: Address) -> str:
    """Ship an item."""
    return f"{quantity} x {item} to {to.street} ({speed})"


@tool
def weigh(items: list[str]) -> float:
    """Weigh some items."""
    return 1.5 * len(items)


with (
    tempfile.TemporaryDirectory() as state,
    Agent(model=TestModel(), tools=[ship, weigh], storage=state) as agent,
):
    result = agent.run_sync("anything")
    print(result.output)
    assert result.status == "completed"
    assert '"weigh": "1.5"' in result.output and "ship" in result.output
    print(
        "tokens:",
        result.usage.total_tokens,
        "per call:",
        [u.input_tokens for u in result.usage.requests],
    )
