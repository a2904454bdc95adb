"""The todo tools: compare-and-swap through the whole agent path; a stale write is a result."""

from __future__ import annotations

import json
from pathlib import Path

from lodger.authority import Authorities
from lodger.engine.settings import Services
from lodger.events import ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel, ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools.todo import todo_store, todo_tools


def agent_for(
    tmp_path: Path, model: object, authorities: Authorities | None = None, **kw: object
) -> Agent:
    return Agent(
        model=model,  # type: ignore[arg-type]
        storage=Storage(
            log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
        ),
        services=Services(
            clock=ManualClock(tick_us=10),
            ids=SequentialIds("id"),
            authorities=authorities or Authorities(),
        ),
        **kw,  # type: ignore[arg-type]
    )


def write(texts: list[str], revision: int) -> dict[str, object]:
    return {
        "name": "todo_write",
        "args": {"items": [{"text": t} for t in texts], "expected_revision": revision},
    }


async def test_two_writes_on_one_revision_cannot_both_win_and_the_model_can_retry(
    tmp_path: Path,
) -> None:
    store = todo_store()
    seen: list[ModelRequest] = []
    script = ScriptedModel(
        [
            {"calls": [write(["plan A"], 0), write(["plan B"], 0)]},
            {"calls": [{"name": "todo_read", "args": {}}]},
            {"calls": [write(["plan A", "plan B"], 1)]},
            {"text": "done"},
        ]
    )

    async def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return await script.complete(request)

    agent = agent_for(
        tmp_path,
        FunctionModel(model),
        tools=todo_tools(store),
        authorities=Authorities(revisions=[store]),
    )
    assert (await agent.run("plan", session="s1")).status == "completed"
    first = [m for m in seen[1].messages if isinstance(m, ToolResultMessage)]
    assert [r.is_error for r in first] == [False, True]  # emission order; one lost the race
    assert json.loads(first[0].content)["revision"] == 1
    assert "the todo list is at revision 1, not 0" in first[1].content
    assert "read it again" in first[1].content  # the hint reaches the model
    reread = [m for m in seen[2].messages if isinstance(m, ToolResultMessage)][-1]
    assert json.loads(reread.content) == {
        "revision": 1,
        "items": [{"text": "plan A", "status": "pending"}],
    }
    final = store.read("s1")
    assert final.revision == 2 and [i.text for i in final.value] == ["plan A", "plan B"]
    assert store.read("another session").revision == 0
    stats = next(s for s in agent.authorities.statistics() if s.authority == "revisions")
    assert (stats.acquisitions, stats.conflicts) == (2, 1)
    events = await agent.session("s1").events()
    statuses = [e.body.status for e in events if isinstance(e.body, ToolResponded)]
    assert statuses == ["ok", "error", "ok", "ok"]
    await agent.close()


async def test_invalid_items_are_rejected_before_dispatch(tmp_path: Path) -> None:
    script = ScriptedModel([{"calls": [write([""], 0)]}, {"text": "done"}])
    store = todo_store()
    agent = agent_for(tmp_path, script, tools=todo_tools(store))
    await agent.run("plan", session="s1")
    events = await agent.session("s1").events()
    assert [e.kind for e in events if e.call_id] == ["call_rejected"]
    assert store.read("s1").revision == 0
    await agent.close()
