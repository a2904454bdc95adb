"""What a running call may ask of its run (``ToolContext.runtime``).

A tool that talks back to the session while it runs (an MCP server that asks the user a
question, or asks for a model completion) does it through this: ``commit`` appends a
fact in the call's envelope (between its T1 and its T2, in the order things happened),
``elicitor`` is whoever can answer a person's question in this run (the CLI's prompt,
the host's inbox; None: nobody can), and ``sample`` asks the session's own model with
the run's provider retries. What is asked and answered is the caller's to log: the
budgets read the usage it records (``sampling_answered``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lodger.engine.envelope import Envelope
from lodger.engine.journal import Journal
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.tools.spec import Elicitor

__all__ = ["RunCalls"]


@dataclass(frozen=True, kw_only=True)
class RunCalls:
    """The run's side of ``CallRuntime``: one per run, bound to a call by ``for_call``."""

    journal: Journal
    elicitor: Elicitor | None
    model_spec: str
    ask: Callable[[ModelRequest], Awaitable[ModelResponse]]

    def for_call(self, env: Envelope) -> _CallRuntime:
        return _CallRuntime(self, env)


@dataclass(frozen=True)
class _CallRuntime:
    run: RunCalls
    env: Envelope

    @property
    def elicitor(self) -> Elicitor | None:
        return self.run.elicitor

    @property
    def model_spec(self) -> str:
        return self.run.model_spec

    async def commit(self, body: Any) -> None:
        await self.run.journal.fact(body, self.env)

    async def sample(self, request: ModelRequest) -> ModelResponse:
        return await self.run.ask(request)
