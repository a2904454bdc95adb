"""Streaming: a turn as an async iterator of typed items. Text deltas are live display;
every ``FactCommitted`` is already durable in the log when you get it.

    python examples/streaming.py
"""

import asyncio
import tempfile

from lodger import Agent, FactCommitted, ScriptedModel, TextDelta, TurnFinished, tool


@tool
def shout(text: str) -> str:
    """Upper-case some text."""
    return text.upper()


async def main() -> None:
    model = ScriptedModel(
        [
            {"text": "Shouting.", "calls": [{"name": "shout", "args": {"text": "hi"}}]},
            {"text": "HI"},
        ]
    )
    with tempfile.TemporaryDirectory() as state:
        async with Agent(model=model, tools=[shout], storage=state) as agent:
            kinds, text = [], ""
            async with agent.stream("shout hi") as stream:
                async for item in stream:
                    if isinstance(item, TextDelta):
                        text += item.text
                    elif isinstance(item, FactCommitted):
                        kinds.append(item.event.kind)
                    elif isinstance(item, TurnFinished):
                        print("finished:", item.result.status, item.result.output)
            assert "tool_dispatched" in kinds and kinds[-1] == "turn_ended"
            print("streamed text:", text)
            print("facts:", " ".join(kinds))


asyncio.run(main())
