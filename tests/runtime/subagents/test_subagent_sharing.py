"""What children share with their parent: the authorities (two concurrent children editing
one file never lose an update) and the log prefix (a forked child's prefix is the
parent's, byte for byte, and both verify)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from subagent_world import routed

from lodger import Agent, ToolContext, tool
from lodger.authority import ResourceClaim
from lodger.events import ModelOutput, SessionStarted, ToolResponded, canonical_bytes
from lodger.providers.base import ModelRequest
from lodger.runtime.subagents import SubagentPolicy, link_of
from lodger.storage.forks import read_lineage
from lodger.tools.spec import Tool


def _counter_tools(both_read: asyncio.Event, readers: list[str]) -> list[Tool]:
    """Read-modify-write of a counter file that waits (up to a bound) for another reader
    between its read and its write: two unserialized calls lose an update for sure."""

    async def bump(path: str, ctx: ToolContext) -> str:
        target = ctx.require_workspace() / path
        value = int(target.read_text())
        readers.append(ctx.session_id)
        if len(readers) >= 2:
            both_read.set()
        try:
            async with asyncio.timeout(0.5):
                await both_read.wait()
        except TimeoutError:
            pass  # serialized: the other caller cannot read before this write
        target.write_text(str(value + 1))
        return f"{value} -> {value + 1}"

    def claims(arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        root = ctx.require_workspace()
        return [ResourceClaim.file(root / arguments["path"], mode="write", root=root)]

    leased = tool(name="bump", claims=claims)(bump)
    unleased = tool(name="bump_unleased")(bump)
    return [leased, unleased]


async def _two_children_bump(tmp_path: Path, name: str) -> tuple[int, list[str], list[str]]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "counter.txt").write_text("0")
    readers: list[str] = []
    child = [{"calls": [{"name": name, "args": {"path": "counter.txt"}}]}, {"text": "bumped"}]
    model = routed(
        {
            "go": [
                {
                    "calls": [
                        {"name": "delegate", "args": {"task": "a", "tools": [name]}},
                        {"name": "delegate", "args": {"task": "b", "tools": [name]}},
                    ]
                },
                {"text": "done"},
            ],
            "a": child,
            "b": child,
        }
    )
    async with Agent(
        model=model,
        tools=_counter_tools(asyncio.Event(), readers),
        storage=tmp_path / "s",
        workspace=workspace,
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        # the order the children's models emitted their bump calls in (a model output is
        # stamped when it arrives; its calls reserve their leases before anything yields)
        emitted: list[tuple[int, str]] = []
        for sid in await agent.log.list_sessions():
            if sid == "p":
                continue
            outputs = [e for e in await agent.log.read_all(sid) if isinstance(e.body, ModelOutput)]
            emitted.append((outputs[0].ts, sid))
    order = [sid for _, sid in sorted(emitted)]
    return int((workspace / "counter.txt").read_text()), readers, order


@pytest.mark.slow
async def test_two_concurrent_children_editing_one_file_never_lose_an_update(
    tmp_path: Path,
) -> None:
    value, readers, emitted = await _two_children_bump(tmp_path, "bump")
    assert value == 2
    assert readers == emitted  # one after the other, in the order their calls were emitted


async def test_without_the_shared_lease_the_same_children_lose_an_update(
    tmp_path: Path,
) -> None:
    # the control: the same children, a tool that claims nothing; the test above can fail
    value, readers, _ = await _two_children_bump(tmp_path, "bump_unleased")
    assert len(set(readers)) == 2
    assert value == 1


async def test_a_forked_childs_prefix_is_the_parents_byte_for_byte_and_both_verify(
    tmp_path: Path,
) -> None:
    seen: list[ModelRequest] = []

    def child(request: ModelRequest) -> str:
        seen.append(request)
        return "forked child answer"

    model = routed(
        {
            "go": [
                {
                    "text": "looking",
                    "calls": [{"name": "delegate", "args": {"task": "c", "history": "fork"}}],
                },
                {"text": "done"},
            ],
            "c": child,
        }
    )
    async with Agent(model=model, storage=tmp_path / "s", subagents=SubagentPolicy()) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
        child_id = next(s for s in await agent.log.list_sessions() if s != "p")
        own = await agent.log.read_all(child_id)
        first = own[0]
        assert isinstance(first.body, SessionStarted) and first.body.parent is not None
        link = link_of(first)
        assert link is not None and link.history == "fork"
        at = first.body.parent.high_water
        assert at == link.parent_offset
        parent = await agent.log.read_all("p")
        assert parent[at - 1].kind == "model_output"  # the step that delegated
        assert first.body.parent.digest == parent[at - 1].digest == link.parent_digest
        # nothing copied: the child's log holds only its own events
        records = await agent.log.store.read_records(session_id=child_id, start=0, end=None)
        assert len(records) == len(own) and records[0].offset == 0
        # its history is the parent's stored bytes, then its own
        lineage = await read_lineage(agent.log, child_id)
        (shared_id, shared), (mine_id, mine) = lineage.parts
        assert shared_id == "p" and mine_id == child_id and len(mine) == len(own)
        stored = await agent.log.store.read_records(session_id="p", start=0, end=at)
        assert [canonical_bytes(e) for e in shared] == [r.data for r in stored]
        # both go on and both verify
        await agent.run("go", session="p")  # the parent's second turn
        await agent.log.verify("p")
        await agent.log.verify(child_id)
        assert len((await read_lineage(agent.log, child_id)).parts[0][1]) == at
        first_turn = [e.body for e in await agent.log.read_all("p")][: at + 2]
        (t2,) = [body for body in first_turn if isinstance(body, ToolResponded)]
        assert json.loads(t2.content)["answer"] == "forked child answer"
    assert seen  # the child's model was asked
    # a forked child's model sees the parent's history up to the delegation, then its task
    texts = [getattr(m, "text", None) for m in seen[0].messages]
    assert texts.index("go") < texts.index("looking") < texts.index("c"), texts


@pytest.mark.slow
async def test_a_childs_edit_waits_for_the_parents_edit_emitted_before_its_delegation(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "counter.txt").write_text("0")
    readers: list[str] = []
    model = routed(
        {
            "go": [
                {
                    "calls": [
                        {"name": "bump", "args": {"path": "counter.txt"}},
                        {"name": "delegate", "args": {"task": "a", "tools": ["bump"]}},
                        {"name": "bump", "args": {"path": "counter.txt"}},
                    ]
                },
                {"text": "done"},
            ],
            "a": [{"calls": [{"name": "bump", "args": {"path": "counter.txt"}}]}, {"text": "ok"}],
        }
    )
    async with Agent(
        model=model,
        tools=_counter_tools(asyncio.Event(), readers),
        storage=tmp_path / "s",
        workspace=workspace,
        subagents=SubagentPolicy(),
    ) as agent:
        result = await agent.run("go", session="p")
        assert result.status == "completed"
    # the parent's two bumps were reserved with its batch, before the child existed: the
    # child's bump comes after both, and no update is lost
    assert (workspace / "counter.txt").read_text() == "3"
    assert readers[:2] == ["p", "p"] and readers[2] != "p"
