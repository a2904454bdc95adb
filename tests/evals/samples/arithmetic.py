"""A sample eval file: 20 arithmetic cases run on two function models.

``v1`` always calls the ``add`` tool and answers its result; ``v2`` does too for small
sums, but answers sums of 10 or more from memory, one too high, without the tool. The
graders: the exact answer, the tool was called, the answer is a JSON integer, a closeness
score computed by a Python function, and a judge model (a function too) that passes an
answer made of digits.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from lodger.evals import (
    Case,
    Check,
    Dataset,
    EqualsExpected,
    EvalSuite,
    MatchesSchema,
    ModelJudge,
    ToolCalled,
)
from lodger.providers import register_function
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage, UserMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.sessions import Binding
from lodger.tools import tool

#: cases running at once, watched by the tool
RUNNING = {"now": 0, "most": 0}


@tool(recovery="idempotent")
async def add(a: int, b: int) -> int:
    "Add two integers."
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    try:
        await asyncio.sleep(0.02)  # long enough for other cases to be inside too
    finally:
        RUNNING["now"] -= 1
    return a + b


PAIRS = [(i, (i * 3) % 7) for i in range(20)]


def numbers(request: ModelRequest) -> tuple[int, int]:
    text = next(m.text for m in request.messages if isinstance(m, UserMessage))
    _, a, b = text.split()
    return int(a), int(b)


def model(shortcut: bool) -> Any:
    def respond(request: ModelRequest) -> ModelResponse | str:
        a, b = numbers(request)
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if results:
            return str(json.loads(results[-1].content))
        if shortcut and a + b >= 10:
            return str(a + b + 1)
        return ModelResponse(calls=(tool_call("add", a=a, b=b),))

    return respond


def judge(request: ModelRequest) -> str:
    answer = request.messages[-1].text.rsplit(":", 1)[-1].strip()  # type: ignore[union-attr]
    ok = answer.isdigit()
    return json.dumps({"pass": ok, "score": 1.0 if ok else 0.0, "reason": f"{answer!r}"})


register_function("arith-v1", model(shortcut=False))
register_function("arith-v2", model(shortcut=True))
register_function("arith-judge", judge)


def closeness(ctx: Any) -> float:
    return 1.0 / (1.0 + abs(int(ctx.output) - int(ctx.expected_output)))


def dataset() -> Dataset[Any, Any, Any]:
    return Dataset(
        name="arithmetic",
        cases=[
            Case(name=f"add-{a}-{b}", inputs=f"add {a} {b}", expected_output=str(a + b))
            for a, b in PAIRS
        ],
        evaluators=[
            EqualsExpected(),
            ToolCalled("add"),
            MatchesSchema({"type": "integer"}),
            Check(closeness),
            ModelJudge(rubric="the answer is a number", model="function:arith-judge"),
        ],
    )


v1 = EvalSuite(
    name="arith-v1",
    dataset=dataset(),
    binding=Binding(model="function:arith-v1", tools=[add]),
    concurrency=3,
)
v2 = EvalSuite(
    name="arith-v2",
    dataset=dataset(),
    binding=Binding(model="function:arith-v2", tools=[add]),
    concurrency=3,
)
