"""Writes ``v8_request.jsonl`` through the real writer (run once; never regenerate a
shipped golden): schema 8's facts. Turn 1 carries an image (``turn_started.attachments``),
asks with model settings (``step_started.settings``), has its first model fail with a 503
so the fallback answers (``model_switched``), and reports cached input tokens
(``usage.cache_read_tokens`` / ``cache_write_tokens``). Turn 2 meets a request limit of
zero and parks (``budget_reached``, ``run_ended`` parked).

    PYTHONPATH=src python tests/data/golden/make_v8_request.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lodger import Agent, BinaryContent, FallbackModel, FunctionModel, tool
from lodger.engine.budgets import UsageLimits
from lodger.engine.settings import Limits, Retries, Services
from lodger.errors import ProviderError
from lodger.events import Usage
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ModelSettings, ToolResultMessage
from lodger.providers.scripted import tool_call
from lodger.storage import EventLog, MemoryArtifactStore, MemoryLogStore, Storage

SESSION = "golden-v8"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(24))


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


def overloaded(request: ModelRequest) -> ModelResponse:
    raise ProviderError("overloaded (503)", retryable=True, status=503)


def answering(request: ModelRequest) -> ModelResponse:
    done = any(isinstance(m, ToolResultMessage) for m in request.messages)
    usage = Usage(input_tokens=120, output_tokens=12, cache_read_tokens=96, cache_write_tokens=8)
    if done:
        return ModelResponse(text="It is a small PNG.", usage=usage)
    return ModelResponse(calls=(tool_call("echo", text="looking"),), usage=usage)


async def main() -> None:
    store = MemoryLogStore()
    storage = Storage(log=EventLog(store), artifacts=MemoryArtifactStore())
    services = Services(
        clock=ManualClock(1_717_000_800_000_000, tick_us=1000), ids=SequentialIds("g8")
    )
    model = FallbackModel(
        FunctionModel(overloaded, name="primary"), FunctionModel(answering, name="backup")
    )

    async def no_wait(delay: float) -> None:
        return None

    agent = Agent(
        model=model,
        tools=[echo],
        storage=storage,
        services=services,
        retries=Retries(max_retries=0, sleep=no_wait),
        model_settings=ModelSettings(temperature=0.5, max_tokens=256),
    )
    async with agent:
        result = await agent.run(
            ["what is in this image?", BinaryContent(PNG, "image/png", name="dot.png")],
            session=SESSION,
        )
        assert result.status == "completed", result
    parked = Agent(
        model=model,
        tools=[echo],
        storage=storage,
        services=services,
        limits=Limits(usage=UsageLimits(request_limit=0)),
    )
    async with parked:
        second = await parked.run("and again?", session=SESSION)
        assert second.status == "parked", second
    records = await store.read_records(session_id=SESSION, start=0, end=None)
    kinds = [json.loads(r.data)["body"]["kind"] for r in records]
    for kind in ("model_switched", "budget_reached"):
        assert kind in kinds, kinds
    out = Path(__file__).with_name("v8_request.jsonl")
    out.write_text(
        "".join(
            json.dumps({"offset": r.offset, "data": r.data.decode("utf-8"), "digest": r.digest})
            + "\n"
            for r in records
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    asyncio.run(main())
