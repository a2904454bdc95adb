"""Structured output: the final answer is validated against a pydantic model. A bad
answer is sent back to the model with what was wrong; the valid one is a logged fact.

    python examples/structured_output.py
"""

import asyncio
import tempfile

from pydantic import BaseModel, Field

from lodger import Agent, FunctionModel, ModelRequest, UserMessage
from lodger.events import TurnEnded


class Invoice(BaseModel):
    customer: str
    total_cents: int = Field(ge=0)


def model(request: ModelRequest) -> str:
    last = request.messages[-1]
    if isinstance(last, UserMessage) and last.source == "runtime":
        print("the runtime told the model:", last.text[:80], "...")
        return '{"customer": "ACME", "total_cents": 1250}'
    return '{"customer": "ACME", "total_cents": "twelve fifty"}'  # fails validation


async def main() -> None:
    with tempfile.TemporaryDirectory() as state:
        async with Agent(model=FunctionModel(model), output_type=Invoice, storage=state) as agent:
            result = await agent.run("bill ACME for the widgets")
            assert isinstance(result.output, Invoice) and result.output.total_cents == 1250
            print(result.output)
            events = await agent.session(result.session_id).events()
            print([e.kind for e in events if e.kind in ("output_rejected", "turn_ended")])
            ended = events[-1].body
            assert isinstance(ended, TurnEnded)
            print("logged output:", ended.output)


asyncio.run(main())
