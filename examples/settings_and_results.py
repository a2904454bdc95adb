"""Model settings, output modes and JSON tool results: what reaches the model.

The model here is a FunctionModel that prints what each request carried: the settings
(the agent's, with the run's over them), the output mode and schema, and the tool's
pydantic result as JSON. The log keeps the settings each step asked with.

    python examples/settings_and_results.py
"""

import asyncio
import json
import tempfile

from pydantic import BaseModel

from lodger import (
    Agent,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    ToolResultMessage,
    tool,
    tool_call,
)
from lodger.events import StepStarted


class Book(BaseModel):
    isbn: str
    title: str


class Review(BaseModel):
    title: str
    stars: int


@tool
def lookup(isbn: str) -> Book:
    """Look a book up by ISBN."""
    return Book(isbn=isbn, title="Dune")


def model(request: ModelRequest) -> ModelResponse:
    print("asked with", request.settings.record(), "in mode", request.output_mode)
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if not results:
        return ModelResponse(calls=(tool_call("lookup", isbn="0441013597"),))
    book = json.loads(results[-1].content)  # JSON, not a Python repr
    print("the tool said", book)
    assert request.output_schema is not None and "stars" in request.output_schema["properties"]
    # tool mode: the answer comes as a call of the output tool
    return ModelResponse(calls=(tool_call("final_result", title=book["title"], stars=5),))


async def main() -> None:
    with tempfile.TemporaryDirectory() as state:
        async with Agent(
            model=FunctionModel(model),
            tools=[lookup],
            storage=state,
            output_type=Review,
            output_mode="tool",
            model_settings=ModelSettings(temperature=0.2, max_tokens=400),
        ) as agent:
            result = await agent.run(
                "review ISBN 0441013597", model_settings=ModelSettings(temperature=0.0)
            )
            assert result.output == Review(title="Dune", stars=5), result
            print(result.output)
            events = await agent.session(result.session_id).events()
            asked = [e.body.settings for e in events if isinstance(e.body, StepStarted)]
            assert asked == [{"temperature": 0.0, "max_tokens": 400}] * 2, asked
            print("logged settings:", asked[0])


asyncio.run(main())
