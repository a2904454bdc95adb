"""FunctionModel: your own Python function is the model. Everything it needs is exported
from ``lodger``; ``tool_call`` builds a call from keyword arguments.

    python examples/function_model.py
"""

import tempfile

from lodger import (
    Agent,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    tool,
    tool_call,
)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def model(request: ModelRequest) -> ModelResponse | str:
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if not results:
        return ModelResponse(calls=(tool_call("add", a=20, b=22),))
    return f"the answer is {results[-1].content}"


with (
    tempfile.TemporaryDirectory() as state,
    Agent(model=FunctionModel(model), tools=[add], storage=state) as agent,
):
    result = agent.run_sync("add 20 and 22")
    assert result.output == "the answer is 42", result
    print(result.output)
