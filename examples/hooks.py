"""Before/after call hooks: a stage of the call path before T1. A veto is a logged
rejection the model reads; a rewrite is re-validated and is what T1 records; an after
hook may redact a result before T2 records it.

    python examples/hooks.py
"""

import asyncio
import tempfile

from lodger import Agent, CallInfo, CallResult, Hooks, Rewrite, ScriptedModel, Veto, tool
from lodger.events import CallRejected, ToolDispatched, ToolResponded


@tool
def transfer(to: str, cents: int) -> str:
    """Move money."""
    return f"sent {cents} to {to}; token=SECRET"


def limits(call: CallInfo) -> Veto | Rewrite | None:
    if call.arguments["to"] == "mallory":
        return Veto("transfers to mallory are blocked")
    if call.arguments["cents"] > 1000:
        return Rewrite({**call.arguments, "cents": 1000})  # cap it
    return None


def redact(call: CallInfo, result: CallResult) -> str | None:
    return result.content.replace("SECRET", "***")


model = ScriptedModel(
    [
        {
            "calls": [
                {"name": "transfer", "args": {"to": "bob", "cents": 5000}},
                {"name": "transfer", "args": {"to": "mallory", "cents": 1}},
            ]
        },
        {"text": "done"},
    ]
)


async def main() -> None:
    with tempfile.TemporaryDirectory() as state:
        async with Agent(
            model=model,
            tools=[transfer],
            storage=state,
            hooks=Hooks(before_call=[limits], after_call=[redact]),
        ) as agent:
            result = await agent.run("pay bob 50 and mallory 0.01")
            events = await agent.session(result.session_id).events()
    dispatched = [e.body for e in events if isinstance(e.body, ToolDispatched)]
    rejected = [e.body for e in events if isinstance(e.body, CallRejected)]
    responded = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert dispatched[0].arguments == {"to": "bob", "cents": 1000}
    assert rejected[0].reason == "vetoed"
    assert "***" in responded[0].content
    print("T1 recorded:", dispatched[0].arguments)
    print("rejected:", rejected[0].message)
    print("T2 recorded:", responded[0].content)


asyncio.run(main())
