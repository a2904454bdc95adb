"""FallbackModel: when a model fails in a way that is not the request's fault (5xx, a rate
limit past the retries, a dropped connection), the next one takes the step, and the log
says so with a ``model_switched`` fact. Here the first "provider" is a function that is
always overloaded; with real providers write ``Agent(model="openai:gpt-4.1|anthropic:...")``.

    python examples/fallback.py
"""

import asyncio
import tempfile

from lodger import (
    Agent,
    FallbackModel,
    FunctionModel,
    ModelRequest,
    ProviderError,
    Retries,
    ScriptedModel,
)


def overloaded(request: ModelRequest) -> str:
    raise ProviderError("primary: HTTP 529: overloaded", retryable=True, status=529)


async def no_wait(seconds: float) -> None:
    """The example does not sit through the backoff between retries."""


async def main() -> None:
    model = FallbackModel(
        FunctionModel(overloaded, name="primary"), ScriptedModel([{"text": "the backup answered"}])
    )
    retries = Retries(max_retries=2, sleep=no_wait)  # each model is retried, then the next
    with tempfile.TemporaryDirectory() as state:
        async with Agent(model=model, storage=state, retries=retries) as agent:
            result = await agent.run("hello")
            assert result.output == "the backup answered", result
            print(result.output)
            for event in await agent.session(result.session_id).events():
                if event.kind in ("provider_retried", "model_switched"):
                    print(" ", event.kind, event.body.model_dump(exclude={"kind"}))


asyncio.run(main())
