"""The call path under hostile calls and tools: every one ends as a fact the model can act
on, never a crash of the turn; a resume re-checks what it re-runs (DESIGN L10)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from lodger.engine.settings import Limits, Services
from lodger.errors import CommitFailedError, ResumeBlockedError, StorageError
from lodger.events import CallRejected, Event, RecoveryDecided, ToolDispatched, ToolResponded
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, MemoryArtifactStore, Record, SqliteLogStore, Storage
from lodger.testing import FaultyLogStore
from lodger.tools import tool
from lodger.tools.spec import Tool


def agent_for(tmp_path: Path, script: list[dict[str, Any]], tools: list[Tool], **kw: Any) -> Agent:
    return Agent(
        model=ScriptedModel(script),
        tools=tools,
        storage=Storage(
            log=kw.pop("log", None) or EventLog(SqliteLogStore(tmp_path / "state")),
            artifacts=kw.pop("artifacts", None) or MemoryArtifactStore(),
        ),
        services=Services(
            clock=ManualClock(tick_us=5), ids=SequentialIds(kw.pop("ids_prefix", "a"))
        ),
        **kw,
    )


def of(events: list[Event], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


async def run_one(
    tmp_path: Path, call: dict[str, Any], tools: list[Tool], **kw: Any
) -> list[Event]:
    agent = agent_for(tmp_path, [{"calls": [call]}, {"text": "ok"}], tools, **kw)
    result = await agent.run("go", session="s1")
    assert result.status == "completed", result
    events = await agent.session("s1").events()
    await agent.close()
    return events


async def test_a_call_past_its_time_limit_settles_timed_out(tmp_path: Path) -> None:
    @tool(timeout=0.05)
    async def slow() -> str:
        """Sleep for a long time."""
        await asyncio.sleep(3600)
        return "never"

    events = await run_one(tmp_path, {"name": "slow", "args": {}}, [slow])
    (t2,) = of(events, ToolResponded)
    assert t2.status == "timed_out" and "0.05 s" in t2.content


async def test_the_run_default_time_limit_applies_to_every_tool(tmp_path: Path) -> None:
    @tool
    async def slow() -> str:
        """Sleep for a long time."""
        await asyncio.sleep(3600)
        return "never"

    events = await run_one(
        tmp_path, {"name": "slow", "args": {}}, [slow], limits=Limits(default_timeout=0.05)
    )
    assert [t2.status for t2 in of(events, ToolResponded)] == ["timed_out"]


async def test_a_tool_calling_sys_exit_is_an_error_result(tmp_path: Path) -> None:
    @tool
    def quitter() -> str:
        """Exit the process."""
        sys.exit(3)

    events = await run_one(tmp_path, {"name": "quitter", "args": {}}, [quitter])
    (t2,) = of(events, ToolResponded)
    assert t2.status == "error" and "tried to exit" in t2.content


@tool
def echo(value: Any) -> str:
    """Echo a value."""
    return "echoed"


async def test_arguments_nested_a_thousand_deep_are_rejected(tmp_path: Path) -> None:
    deep = '{"value": ' + "[" * 1000 + "]" * 1000 + "}"
    events = await run_one(tmp_path, {"name": "echo", "arguments": deep}, [echo])
    (rejected,) = of(events, CallRejected)
    assert rejected.reason == "invalid_arguments" and "nested" in rejected.message
    assert of(events, ToolDispatched) == []


async def test_a_failing_expectations_hook_rejects_the_call(tmp_path: Path) -> None:
    async def broken(arguments: dict[str, Any], ctx: Any) -> Any:
        raise KeyError("boom")

    events = await run_one(
        tmp_path, {"name": "echo", "args": {"value": 1}}, [echo.with_options(expectations=broken)]
    )
    (rejected,) = of(events, CallRejected)
    assert rejected.reason == "precondition" and "KeyError" in rejected.message


async def test_a_full_artifact_store_still_records_the_result(tmp_path: Path) -> None:
    class FullStore(MemoryArtifactStore):
        async def put(self, data: bytes, media_type: str = "text/plain") -> Any:
            raise StorageError("no space left on device", code="storage_full")

    @tool
    def big() -> str:
        """Return a lot."""
        return "x" * 100_000

    events = await run_one(tmp_path, {"name": "big", "args": {}}, [big], artifacts=FullStore())
    (t2,) = of(events, ToolResponded)
    assert t2.status == "ok" and t2.truncated and "could not be stored" in t2.content


def fail_first_t2(records: list[Record]) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)


async def crash_after_effect(tmp_path: Path, tools: list[Tool], call: dict[str, Any]) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=fail_first_t2)
    agent = agent_for(tmp_path, [{"calls": [call]}, {"text": "ok"}], tools, log=EventLog(store))
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s1")
    await agent.close()


async def test_resume_takes_the_policy_from_the_bound_tool_not_the_log(tmp_path: Path) -> None:
    """A log that says "idempotent" (as a forger would write it) does not make a
    never-retry tool run again: the bound tool's policy decides, and it parks."""
    effects: list[str] = []

    @tool(recovery="idempotent")
    def charge(amount: int) -> str:
        """Charge money."""
        effects.append(f"charge:{amount}")
        return "charged"

    await crash_after_effect(tmp_path, [charge], {"name": "charge", "args": {"amount": 5}})
    assert effects == ["charge:5"]
    never_retry = charge.with_options(recovery="never_retry")
    agent = agent_for(tmp_path, [{"text": "ok"}], [never_retry], ids_prefix="b")
    with pytest.raises(ResumeBlockedError):
        await agent.resume("s1")
    events = await agent.session("s1").events()
    await agent.close()
    assert effects == ["charge:5"]  # never run twice
    (parked,) = of(events, RecoveryDecided)
    assert parked.action == "park" and parked.reason.startswith("never_retry")


async def test_a_re_run_asks_permission_again(tmp_path: Path) -> None:
    """An idempotent tool that now needs approval is not re-run without it."""
    effects: list[str] = []

    @tool(recovery="idempotent")
    def deploy(target: str) -> str:
        """Deploy."""
        effects.append(target)
        return "deployed"

    await crash_after_effect(tmp_path, [deploy], {"name": "deploy", "args": {"target": "prod"}})
    gated = deploy.with_options(approval=True)
    agent = agent_for(tmp_path, [{"text": "ok"}], [gated], ids_prefix="b")
    with pytest.raises(ResumeBlockedError) as blocked:
        await agent.resume("s1")
    await agent.close()
    assert effects == ["prod"]
    assert [s.action for s in blocked.value.next_steps] == ["decide", "abandon"]


async def test_a_second_turn_reads_only_the_new_events(tmp_path: Path) -> None:
    class Counting(FaultyLogStore):
        read = 0

        async def read_records(self, *, session_id: str, start: int, end: int | None) -> Any:
            records = await super().read_records(session_id=session_id, start=start, end=end)
            Counting.read += len(records)
            return records

    store = Counting(SqliteLogStore(tmp_path / "state"))
    script = [{"calls": [{"name": "echo", "args": {"value": i}}]} for i in range(20)]
    agent = agent_for(
        tmp_path,
        [*script, {"text": "one"}, {"text": "two"}],
        [echo],
        log=EventLog(store),
        limits=Limits(max_steps=30),
    )
    assert (await agent.run("first", session="s1")).status == "completed"
    first_len = len(await agent.session("s1").events())
    Counting.read = 0
    assert (await agent.run("second", session="s1")).status == "completed"
    await agent.close()
    assert first_len > 60
    assert Counting.read == 1  # the last known event, to check the chain continues


async def test_the_state_directory_inside_the_workspace_is_out_of_every_tools_reach(
    tmp_path: Path,
) -> None:
    """End to end: the agent hands its state directory to the tools as hidden."""
    from lodger.runtime.builtin import workspace_tools

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    script = [
        {
            "calls": [
                {"name": "write_file", "args": {"path": ".lodger/log.sqlite3", "content": "x"}},
                {"name": "read_file", "args": {"path": ".lodger/log.sqlite3"}},
                {"name": "list_files", "args": {}},
            ]
        },
        {"text": "done"},
    ]
    agent = Agent(
        model=ScriptedModel(script),
        tools=workspace_tools(),
        storage=ws / ".lodger",
        workspace=ws,
        services=Services(clock=ManualClock(tick_us=5), ids=SequentialIds("a")),
    )
    assert (await agent.run("try it", session="s1")).status == "completed"
    events = await agent.session("s1").events()
    await agent.close()
    rejected = {e.call_id: e.body for e in events if isinstance(e.body, CallRejected)}
    results = {e.call_id: e.body for e in events if isinstance(e.body, ToolResponded)}
    outcomes = {**rejected, **results}
    write, read, listing = (outcomes[f"call-0-{i}"] for i in range(1, 4))
    assert "state directory" in getattr(write, "message", getattr(write, "content", ""))
    assert "state directory" in getattr(read, "message", getattr(read, "content", ""))
    assert isinstance(listing, ToolResponded) and ".lodger" not in listing.content
    assert "notes.txt" in listing.content
