"""The tool boundary and the agent loop, end to end, over a real SQLite log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lodger.engine.settings import Hooks, Limits, Retries, Services
from lodger.errors import CommitFailedError
from lodger.events import (
    CallRejected,
    Event,
    ModelOutput,
    ProposedCall,
    RunEnded,
    ToolDispatched,
    ToolResponded,
    TurnEnded,
)
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
)
from lodger.providers.scripted import FunctionModel, ScriptedModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import FaultyLogStore, MemoryArtifactStore
from lodger.tools import Tool, tool
from lodger.tools.policy import PermissionPolicy, Rule


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


class Effects:
    """Counts side effects outside the log."""

    def __init__(self) -> None:
        self.calls: list[str] = []


@pytest.fixture
def effects() -> Effects:
    return Effects()


def make_tools(effects: Effects) -> list[Tool]:
    @tool
    def echo(text: str) -> str:
        """Echo the text back."""
        effects.calls.append(f"echo:{text}")
        return f"echo: {text}"

    @tool(approval=True)
    def launch(target: str) -> str:
        """Launch something risky."""
        effects.calls.append(f"launch:{target}")
        return "launched"

    return [echo, launch]


def agent_for(tmp_path: Path, model: object, tools: list[Tool], **kw: object) -> Agent:
    store = kw.pop("store", None) or SqliteLogStore(tmp_path / "state")
    return Agent(
        model=model,  # type: ignore[arg-type]
        tools=tools,
        storage=Storage(log=EventLog(store), artifacts=MemoryArtifactStore()),
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        **kw,  # type: ignore[arg-type]
    )


async def test_text_answer_ends_turn(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, ScriptedModel([{"text": "hello"}]), [])
    result = await agent.run("say hello", session="s1")
    assert (result.status, result.answer) == ("completed", "hello")
    events = await agent.session("s1").events()
    assert kinds(events) == [
        "session_started",
        "turn_started",
        "run_started",
        "step_started",
        "model_output",
        "run_ended",
        "turn_ended",
    ]
    await agent.close()


async def test_call_then_answer_records_t1_t2(tmp_path: Path, effects: Effects) -> None:
    script = [
        {"calls": [{"name": "echo", "args": {"text": "hi"}}]},
        {"text": "done"},
    ]
    agent = agent_for(tmp_path, ScriptedModel(script), make_tools(effects))
    result = await agent.run("go", session="s1")
    assert result.answer == "done"
    events = await agent.session("s1").events()
    t1 = [e for e in events if isinstance(e.body, ToolDispatched)]
    t2 = [e for e in events if isinstance(e.body, ToolResponded)]
    assert len(t1) == len(t2) == 1
    assert t1[0].offset < t2[0].offset
    assert t1[0].call_id == t2[0].call_id == "call-0-1"
    assert t2[0].body.content == "echo: hi"  # type: ignore[union-attr]
    assert effects.calls == ["echo:hi"]
    await agent.close()


async def test_bad_calls_become_error_results_the_next_step_sees(
    tmp_path: Path, effects: Effects
) -> None:
    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                calls=(
                    ProposedCall(call_id="a", name="nope", arguments="{}"),
                    ProposedCall(call_id="b", name="hidden_tool", arguments="{}"),
                    ProposedCall(call_id="c", name="echo", arguments='{"text": 5}'),
                    ProposedCall(call_id="d", name="echo", arguments="{not json"),
                    ProposedCall(call_id="e", name="launch", arguments='{"target": "x"}'),
                    ProposedCall(call_id="f", name="echo", arguments='{"text": "fine"}'),
                )
            )
        return ModelResponse(text="ok")

    @tool(deferred=True)
    def hidden_tool() -> str:
        """Not visible until activated."""
        effects.calls.append("hidden")
        return "x"

    agent = agent_for(tmp_path, FunctionModel(model), [*make_tools(effects), hidden_tool])
    result = await agent.run("go", session="s1")
    assert result.status == "completed"
    results = [m for m in seen[1].messages if isinstance(m, ToolResultMessage)]
    by_id = {r.call_id: r for r in results}
    assert [r.call_id for r in results] == ["a", "b", "c", "d", "e", "f"]
    assert by_id["a"].is_error and "unknown tool 'nope'" in by_id["a"].content
    assert by_id["b"].is_error and "not visible" in by_id["b"].content
    assert by_id["c"].is_error and "is not of type 'string'" in by_id["c"].content
    assert by_id["d"].is_error and "not valid JSON" in by_id["d"].content
    assert by_id["e"].is_error and "needs approval" in by_id["e"].content
    assert not by_id["f"].is_error and by_id["f"].content == "echo: fine"
    assert effects.calls == ["echo:fine"]
    events = await agent.session("s1").events()
    reasons = {e.call_id: e.body.reason for e in events if isinstance(e.body, CallRejected)}
    assert reasons == {
        "a": "unbound",
        "b": "invisible",
        "c": "invalid_arguments",
        "d": "invalid_arguments",
        "e": "denied",
    }
    await agent.close()


async def test_policy_deny_and_interactive_approval(tmp_path: Path, effects: Effects) -> None:
    asked: list[str] = []

    async def approver(t: Tool, args: dict[str, object]) -> bool:
        asked.append(t.name)
        return args["target"] == "ok"

    script = [
        {
            "calls": [
                {"name": "launch", "args": {"target": "ok"}},
                {"name": "launch", "args": {"target": "bad"}},
                {"name": "echo", "args": {"text": "x"}},
            ]
        },
        {"text": "done"},
    ]
    agent = agent_for(
        tmp_path,
        ScriptedModel(script),
        make_tools(effects),
        hooks=Hooks(approver=approver),
        permissions=PermissionPolicy([Rule(pattern="echo", decision="deny")]),
    )
    await agent.run("go", session="s1")
    assert sorted(asked) == ["launch", "launch"]
    assert effects.calls == ["launch:ok"]
    events = await agent.session("s1").events()
    decided = [e.body for e in events if e.kind == "permission_decided"]
    assert sorted((d.by, d.decision) for d in decided) == [  # type: ignore[union-attr]
        ("policy", "deny"),
        ("user", "allow"),
        ("user", "deny"),
    ]
    await agent.close()


async def test_parallel_results_return_in_call_order(tmp_path: Path) -> None:
    order: list[str] = []
    first_may_finish = asyncio.Event()

    @tool
    async def slow(name: str) -> str:
        """Finishes only after the fast one."""
        await first_may_finish.wait()
        order.append(name)
        return f"slow {name}"

    @tool
    async def fast(name: str) -> str:
        """Finishes first."""
        order.append(name)
        first_may_finish.set()
        return f"fast {name}"

    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                calls=(
                    ProposedCall(call_id="1", name="slow", arguments='{"name": "a"}'),
                    ProposedCall(call_id="2", name="fast", arguments='{"name": "b"}'),
                )
            )
        return ModelResponse(text="ok")

    agent = agent_for(tmp_path, FunctionModel(model), [slow, fast])
    await agent.run("go", session="s1")
    assert order == ["b", "a"]  # completion order: fast first
    events = await agent.session("s1").events()
    t2_order = [e.call_id for e in events if isinstance(e.body, ToolResponded)]
    assert t2_order == ["2", "1"]  # the log keeps completion order
    assistant = next(m for m in seen[1].messages if isinstance(m, AssistantMessage))
    assert [c.call_id for c in assistant.calls] == ["1", "2"]
    results = [m.call_id for m in seen[1].messages if isinstance(m, ToolResultMessage)]
    assert results == ["1", "2"]  # the model gets emission order
    await agent.close()


def _is_t1(records: object) -> bool:
    return any(b'"kind":"tool_dispatched"' in r.data for r in records)  # type: ignore[attr-defined]


def _is_t2(records: object) -> bool:
    return any(b'"kind":"tool_responded"' in r.data for r in records)  # type: ignore[attr-defined]


async def test_t1_commit_failure_means_the_tool_never_runs(
    tmp_path: Path, effects: Effects
) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=_is_t1)
    script = [{"calls": [{"name": "echo", "args": {"text": "hi"}}]}, {"text": "done"}]
    agent = agent_for(tmp_path, ScriptedModel(script), make_tools(effects), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s1")
    assert effects.calls == []
    events = await agent.session("s1").events()
    assert not any(isinstance(e.body, ToolDispatched | RunEnded) for e in events)
    await agent.close()


async def test_t2_commit_failure_keeps_result_from_model_and_leaves_indeterminate(
    tmp_path: Path, effects: Effects
) -> None:
    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=_is_t2)
    requests: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        return ModelResponse(
            calls=(ProposedCall(call_id="c1", name="echo", arguments='{"text": "hi"}'),)
        )

    agent = agent_for(tmp_path, FunctionModel(model), make_tools(effects), store=store)
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s1")
    assert effects.calls == ["echo:hi"]  # the effect happened ...
    assert len(requests) == 1  # ... but the model was never asked again
    events = await agent.session("s1").events()
    assert [e.kind for e in events if e.call_id == "c1"] == ["tool_dispatched"]
    assert not any(isinstance(e.body, TurnEnded) for e in events)  # turn left open
    await agent.close()


async def test_t1_failure_mid_batch_freezes_the_rest(tmp_path: Path, effects: Effects) -> None:
    # T1s that arrive together are group-committed, so the failing T1 commit must come
    # after a first call was dispatched: the three launches wait for approval until echo
    # has run, then reach T1 together, and that commit fails
    dispatches = 0

    def second_t1(records: object) -> bool:
        nonlocal dispatches
        if _is_t1(records):
            dispatches += 1
            return dispatches == 2
        return False

    echoed = asyncio.Event()

    def note(event: object) -> None:
        if isinstance(getattr(event, "body", None), ToolDispatched):
            echoed.set()

    async def approve_after_echo(t: Tool, arguments: dict[str, object]) -> bool:
        await echoed.wait()  # echo's T1 is committed: the launches' T1s come after it
        return True

    store = FaultyLogStore(SqliteLogStore(tmp_path / "state"), fail_when=second_t1)
    calls = [{"name": "echo", "args": {"text": "0"}}] + [
        {"name": "launch", "args": {"target": str(i)}} for i in range(1, 4)
    ]
    agent = agent_for(
        tmp_path,
        ScriptedModel([{"calls": calls}, {"text": "x"}]),
        make_tools(effects),
        store=store,
        hooks=Hooks(approver=approve_after_echo, on_event=note),
    )
    with pytest.raises(CommitFailedError):
        await agent.run("go", session="s1")
    assert echoed.is_set()
    events = await agent.session("s1").events()
    dispatched = [e.call_id for e in events if isinstance(e.body, ToolDispatched)]
    assert len(dispatched) == 1 and effects.calls == ["echo:0"]
    assert dispatches == 2  # the launches' T1s were the second T1 commit, which failed
    await agent.close()


async def test_cancel_settles_running_calls_and_records_the_turn(tmp_path: Path) -> None:
    started = asyncio.Event()
    finished: list[str] = []

    @tool
    async def wait_forever() -> str:
        """Runs until cancelled."""
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            finished.append("cleaned up")
        return "never"

    script = [{"calls": [{"name": "wait_forever", "args": {}}]}, {"text": "x"}]
    agent = agent_for(tmp_path, ScriptedModel(script), [wait_forever])
    task = asyncio.create_task(agent.run("go", session="s1"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["cleaned up"]
    events = await agent.session("s1").events()
    t2 = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert len(t2) == 1 and t2[0].status == "cancelled"
    # the run ends interrupted; the turn stays open, and a resume finishes it
    assert events[-1].kind == "run_ended" and events[-1].body.status == "interrupted"  # type: ignore[union-attr]
    assert not any(e.kind == "turn_ended" for e in events)
    result = await agent.resume("s1")
    assert result.status == "completed" and result.answer == "x"
    assert finished == ["cleaned up"]  # the stopped call was not run again
    await agent.close()


async def test_large_results_go_to_artifacts_with_a_preview(tmp_path: Path) -> None:
    @tool
    def big() -> str:
        """A large result."""
        return "x" * 100_000

    artifacts = MemoryArtifactStore()
    agent = Agent(
        model=ScriptedModel([{"calls": [{"name": "big", "args": {}}]}, {"text": "ok"}]),
        tools=[big],
        storage=Storage(log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=artifacts),
    )
    await agent.run("go", session="s1")
    events = await agent.session("s1").events()
    t2 = next(e.body for e in events if isinstance(e.body, ToolResponded))
    assert t2.truncated and len(t2.content) < 5_000
    ref = t2.artifacts[0]
    assert ref.size == 100_000 and (await artifacts.get(ref.sha256)) == b"x" * 100_000
    await agent.close()


async def test_transient_provider_errors_are_retried_and_logged(tmp_path: Path) -> None:
    from lodger.errors import ProviderError

    attempts = 0

    def flaky(request: ModelRequest) -> ModelResponse:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ProviderError("rate limited", retryable=True, status=429)
        return ModelResponse(text="fine")

    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    # the largest jitter: each wait is the whole backoff step
    agent = agent_for(
        tmp_path,
        FunctionModel(flaky),
        [],
        retries=Retries(sleep=fake_sleep, jitter=lambda: 1.0),
    )
    result = await agent.run("go", session="s1")
    assert result.answer == "fine" and sleeps == [0.5, 1.0]
    events = await agent.session("s1").events()
    assert kinds(events).count("provider_retried") == 2
    await agent.close()


async def test_step_limit_ends_the_turn(tmp_path: Path, effects: Effects) -> None:
    loop = [{"calls": [{"name": "echo", "args": {"text": "again"}}]}] * 10
    agent = agent_for(
        tmp_path, ScriptedModel(loop), make_tools(effects), limits=Limits(max_steps=3)
    )
    result = await agent.run("go", session="s1")
    assert result.status == "step_limit" and len(effects.calls) == 3
    await agent.close()


async def test_second_turn_sees_first_and_model_outputs_count(tmp_path: Path) -> None:
    agent = agent_for(
        tmp_path, ScriptedModel(turns=[[{"text": "first"}], [{"text": "second"}]]), []
    )
    assert (await agent.run("one", session="s1")).answer == "first"
    assert (await agent.run("two", session="s1")).answer == "second"
    events = await agent.session("s1").events()
    assert [e.body.text for e in events if isinstance(e.body, ModelOutput)] == ["first", "second"]
    assert json.loads(json.dumps([e.kind for e in events])).count("turn_started") == 2
    await agent.close()


async def test_reused_or_empty_call_ids_are_made_unique(tmp_path: Path, effects: Effects) -> None:
    from lodger.recovery import plan_recovery

    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) <= 2:  # a server that numbers calls per response
            return ModelResponse(
                calls=(
                    ProposedCall(call_id="call_0", name="echo", arguments='{"text": "a"}'),
                    ProposedCall(call_id="", name="echo", arguments='{"text": "b"}'),
                )
            )
        return ModelResponse(text="ok")

    agent = agent_for(tmp_path, FunctionModel(model), make_tools(effects))
    result = await agent.run("go", session="s1")
    assert result.status == "completed"
    events = await agent.session("s1").events()
    proposed = [c.call_id for e in events if isinstance(e.body, ModelOutput) for c in e.body.calls]
    assert len(proposed) == 4
    assert len(set(proposed)) == 4
    assert proposed[0] == "call_0"  # the first use keeps the model's own id
    plan_recovery(events)  # consistent: no duplicate call id
    results = [m for m in seen[2].messages if isinstance(m, ToolResultMessage)]
    assert [r.call_id for r in results] == proposed
    assert [r.content for r in results] == ["echo: a", "echo: b"] * 2
    await agent.close()


async def test_unstorable_model_output_never_fails_the_turn(
    tmp_path: Path, effects: Effects
) -> None:
    seen: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                text="odd \ud800 text",
                calls=(
                    ProposedCall(call_id="n", name="echo", arguments='{"text": NaN}'),
                    ProposedCall(call_id="s", name="echo", arguments='{"text": "\\ud800"}'),
                ),
            )
        return ModelResponse(text="ok")

    agent = agent_for(tmp_path, FunctionModel(model), make_tools(effects))
    result = await agent.run("go", session="s1")
    assert result.status == "completed"
    assert effects.calls == []
    results = {m.call_id: m for m in seen[1].messages if isinstance(m, ToolResultMessage)}
    assert "NaN is not a JSON value" in results["n"].content
    assert "not valid Unicode" in results["s"].content
    events = await agent.session("s1").events()
    output = next(e.body for e in events if isinstance(e.body, ModelOutput))
    assert output.text == "odd \ufffd text"
    await agent.close()


async def test_provider_state_is_logged_and_replayed_to_the_model(
    tmp_path: Path, effects: Effects
) -> None:
    seen: list[ModelRequest] = []
    state = {"anthropic": {"thinking": [{"type": "thinking", "thinking": "x", "signature": "s"}]}}

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        if len(seen) == 1:
            return ModelResponse(
                calls=(ProposedCall(call_id="c", name="echo", arguments='{"text": "a"}'),),
                provider_state=state,
            )
        return ModelResponse(text="ok")

    agent = agent_for(tmp_path, FunctionModel(model), make_tools(effects))
    await agent.run("go", session="s1")
    events = await agent.session("s1").events()
    outputs = [e.body for e in events if isinstance(e.body, ModelOutput)]
    assert outputs[0].provider_state == state
    assert outputs[1].provider_state is None
    replayed = next(m for m in seen[1].messages if isinstance(m, AssistantMessage))
    assert replayed.provider_state == state
    await agent.close()
