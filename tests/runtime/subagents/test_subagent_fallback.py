"""A subagent policy's model may be a fallback chain or a spec: the children's steps
switch models as a parent's do (per member retries, a ``model_switched`` fact in the
child's log), under the child's token budget."""

from __future__ import annotations

import json
from pathlib import Path

from lodger import Agent, FallbackModel, FunctionModel, Retries, ScriptedModel
from lodger.errors import ProviderError
from lodger.events import ModelSwitched, ProviderRetried, ToolResponded
from lodger.providers.base import ModelRequest
from lodger.runtime.subagents import SubagentPolicy


async def _no_wait(_: float) -> None:
    return None


def _down(request: ModelRequest) -> str:
    raise ProviderError("primary: HTTP 503: overloaded", retryable=True, status=503)


async def test_a_child_falls_back_to_the_next_model_of_its_policy(tmp_path: Path) -> None:
    parent = ScriptedModel(
        [{"calls": [{"name": "delegate", "args": {"task": "say hi"}}]}, {"text": "done"}]
    )
    children = FallbackModel(FunctionModel(_down, name="primary"), ScriptedModel([{"text": "hi"}]))
    async with Agent(
        model=parent,
        storage=tmp_path / "s",
        subagents=SubagentPolicy(model=children),
        retries=Retries(max_retries=1, sleep=_no_wait, jitter=lambda: 0.0),
    ) as agent:
        result = await agent.run("delegate it", session="p")
        assert result.status == "completed", result.error
        events = await agent.log.read_all("p")
        [responded] = [e.body for e in events if isinstance(e.body, ToolResponded)]
        body = json.loads(responded.content)
        assert body["answer"] == "hi"
        child = await agent.log.read_all(body["session"])
        await agent.log.verify(body["session"])
    kinds = [e.body.kind for e in child if isinstance(e.body, ProviderRetried | ModelSwitched)]
    assert kinds == ["provider_retried", "model_switched"]
    [switch] = [e.body for e in child if isinstance(e.body, ModelSwitched)]
    assert (switch.from_model, switch.to_model) == ("function:primary", "script:inline")


async def test_a_policy_model_by_name_is_made_and_closed_by_the_agent(tmp_path: Path) -> None:
    async with Agent(
        model=ScriptedModel([{"text": "no need"}]),
        storage=tmp_path / "s",
        subagents=SubagentPolicy(model="test"),
    ) as agent:
        assert agent.subagents is not None
        assert not isinstance(agent.subagents.model, str)
        assert agent.subagents.model.spec == "test:test"
