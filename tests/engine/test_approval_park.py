"""An approver that answers "park" over a real SQLite log: the call is not dispatched
(no T1), the other calls of its batch run, the run ends waiting with the turn open, and
the log says the call waits (``permission_decided`` ``park``). The plan then asks for
its approval again (``ask_permission``), and a resume in a fresh agent asks the approver
again: an allow runs the call exactly once, a deny never runs it and the model reads
the denial, and a second park waits again. A park fact that contradicts the log fails
closed; inside a code cell a park is a denial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, tool
from lodger.engine.permissions import Asking, current_ask
from lodger.engine.settings import Hooks
from lodger.engine.state import SessionState
from lodger.errors import CorruptLogError
from lodger.events import (
    CallRejected,
    Event,
    PermissionDecided,
    RunEnded,
    ToolDispatched,
    ToolResponded,
)
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel, tool_call
from lodger.recovery import plan_recovery
from lodger.storage import EventLog, MemoryLogStore, Record
from lodger.tools.spec import Tool

RAN: list[str] = []


@tool(approval=True)
def deploy(target: str) -> str:
    """Deploy to a target (needs approval)."""
    RAN.append(f"deploy {target}")
    return f"deployed {target}"


@tool
def note(text: str) -> str:
    """Write a note (no approval)."""
    RAN.append(f"note {text}")
    return f"noted {text}"


class Approver:
    """Answers from a list; records which call (``current_ask``) each question was about."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[Asking | None] = []

    async def __call__(self, t: Tool, arguments: dict[str, Any]) -> Any:
        self.asked.append(current_ask())
        return self.answers.pop(0)


class Model:
    """Proposes ``first`` on the first step, then answers with what it read back."""

    def __init__(self, *first: Any) -> None:
        self.first = first
        self.results: list[ToolResultMessage] = []

    async def __call__(self, request: ModelRequest) -> ModelResponse:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            return ModelResponse(calls=self.first)
        self.results = results
        return ModelResponse(text="; ".join(m.content for m in results))


def agent(tmp_path: Path, model: Model, approver: Any) -> Agent:
    return Agent(
        model=FunctionModel(model),
        tools=[deploy, note],
        storage=tmp_path / "state",
        hooks=Hooks(approver=approver),
    )


async def events(a: Agent, session: str) -> list[Event]:
    return list(await a.session(session).events())


def kinds_for(events: list[Event], call_id: str) -> list[str]:
    return [e.kind for e in events if e.call_id == call_id]


async def park_first(tmp_path: Path, model: Model) -> tuple[str, str]:
    """Run a turn whose deploy call parks; the ids of the parked and of the noted call."""
    RAN.clear()
    async with agent(tmp_path, model, Approver("park")) as a:
        result = await a.run("ship it", session="s1")
        assert result.status == "waiting", result
        log = await events(a, "s1")
    parked = next(
        e for e in log if isinstance(e.body, PermissionDecided) and e.body.decision == "park"
    )
    assert parked.call_id is not None
    # not dispatched: no T1, no rejection; the run ended waiting, the turn is open
    assert kinds_for(log, parked.call_id) == ["permission_requested", "permission_decided"]
    ended = [e.body for e in log if isinstance(e.body, RunEnded)]
    assert [b.status for b in ended] == ["interrupted"]
    assert "turn_ended" not in [e.kind for e in log]
    plan = plan_recovery(log)
    (waits,) = [c for c in plan.calls if c.call_id == parked.call_id]
    assert (waits.status, waits.reason, waits.action) == (
        "not_dispatched", "awaiting_approval", "ask_permission",
    )  # fmt: skip
    assert plan_recovery(log) == plan  # a pure function of the prefix
    others = [c.call_id for c in plan.calls if c.call_id != parked.call_id]
    return parked.call_id, others[0] if others else ""


async def test_parked_then_allowed_runs_once_and_the_batch_runs_the_rest_once(
    tmp_path: Path,
) -> None:
    model = Model(tool_call("deploy", target="prod"), tool_call("note", text="hello"))
    call_id, noted = await park_first(tmp_path, model)
    assert RAN == ["note hello"]  # the allowed call of the batch ran; deploy did not
    asker = Approver("once")
    async with agent(tmp_path, model, asker) as a:
        result = await a.resume("s1")
        assert result.status == "completed", result
        log = await events(a, "s1")
    assert RAN == ["note hello", "deploy prod"]  # each exactly once
    assert [q.call_id if q else None for q in asker.asked] == [call_id]
    dispatched = [e for e in log if isinstance(e.body, ToolDispatched)]
    assert sorted(e.call_id or "" for e in dispatched) == sorted([call_id, noted])
    assert [r.content for r in model.results] == ["deployed prod", "noted hello"]
    assert plan_recovery(log).turn_id is None


async def test_parked_then_denied_never_runs_and_the_model_reads_the_denial(
    tmp_path: Path,
) -> None:
    model = Model(tool_call("deploy", target="prod"))
    call_id, _ = await park_first(tmp_path, model)
    async with agent(tmp_path, model, Approver("deny")) as a:
        result = await a.resume("s1")
        assert result.status == "completed", result
        log = await events(a, "s1")
    assert RAN == []
    decided = [e.body.decision for e in log if isinstance(e.body, PermissionDecided)]
    assert decided == ["park", "deny"]
    (rejected,) = [e.body for e in log if isinstance(e.body, CallRejected)]
    assert rejected.reason == "denied"
    assert not [e for e in log if isinstance(e.body, ToolDispatched | ToolResponded)]
    (seen,) = model.results
    assert (seen.call_id, seen.is_error) == (call_id, True)
    assert "denied" in seen.content


async def test_parked_again_waits_again_then_runs_once(tmp_path: Path) -> None:
    model = Model(tool_call("deploy", target="prod"))
    call_id, _ = await park_first(tmp_path, model)
    for answers in (("park",), ("once",)):
        async with agent(tmp_path, model, Approver(*answers)) as a:
            result = await a.resume("s1")
            log = await events(a, "s1")
        if answers == ("park",):
            assert result.status == "waiting"
            assert RAN == []
            assert plan_recovery(log).calls[0].action == "ask_permission"
    assert result.status == "completed"
    assert RAN == ["deploy prod"]
    decided = [e.body.decision for e in log if isinstance(e.body, PermissionDecided)]
    assert decided == ["park", "park", "allow"]
    assert [e.call_id for e in log if isinstance(e.body, ToolDispatched)] == [call_id]


async def test_a_resume_without_an_approver_denies_the_waiting_call(tmp_path: Path) -> None:
    model = Model(tool_call("deploy", target="prod"))
    await park_first(tmp_path, model)
    async with agent(tmp_path, model, None) as a:
        result = await a.resume("s1")
        log = await events(a, "s1")
    assert result.status == "completed"
    assert RAN == []
    assert [(e.body.decision, e.body.by) for e in log if isinstance(e.body, PermissionDecided)] == [
        ("park", "user"),
        ("deny", "default"),
    ]


async def test_a_park_fact_for_a_dispatched_call_fails_closed(tmp_path: Path) -> None:
    model = Model(tool_call("deploy", target="prod"))
    RAN.clear()
    async with agent(tmp_path, model, Approver("once")) as a:
        assert (await a.run("ship it", session="s1")).status == "completed"
        log = await events(a, "s1")
    responded = next(e for e in log if isinstance(e.body, ToolResponded))
    # the park claim lands where the call's T2 was: after its T1
    forged = responded.model_copy(
        update={"body": PermissionDecided(tool="deploy", decision="park", by="user")}
    )
    with pytest.raises(CorruptLogError) as refused:
        plan_recovery([*log[: responded.offset], forged])
    assert refused.value.code == "bad_permission_park"
    assert refused.value.offset == responded.offset


async def test_every_prefix_of_a_parked_log_folds_and_plans_alike(tmp_path: Path) -> None:
    """The fold fed one event at a time equals the fold of the whole prefix, and every
    prefix plans without error, through the park, the resume and the allowed run."""
    model = Model(tool_call("deploy", target="prod"), tool_call("note", text="hi"))
    await park_first(tmp_path, model)
    async with agent(tmp_path, model, Approver("once")) as a:
        assert (await a.resume("s1")).status == "completed"
        log = await events(a, "s1")
    incremental = SessionState("s1")
    actions: list[str] = []
    for cut in range(1, len(log) + 1):
        incremental.feed(log[cut - 1 : cut])
        whole = SessionState("s1", log[:cut])
        assert incremental.snapshot() == whole.snapshot(), cut
        actions += [c.action for c in whole.plan().calls if c.tool == "deploy"]
    assert "ask_permission" in actions and actions[-1:] != ["ask_permission"]


GOLDEN_V6 = Path(__file__).resolve().parents[1] / "data" / "golden" / "v6_parked_approval.jsonl"


async def test_a_crash_between_the_allow_and_t1_asks_again(tmp_path: Path) -> None:
    """Cut the golden v6 log (park, resume, allow, T1, T2) after the allow and before
    T1: the call never ran, so it is asked for again (and its answer stands in the
    control plane); cut after T1 it is an ordinary dispatched call, never asked again."""
    rows = [json.loads(line) for line in GOLDEN_V6.read_text(encoding="utf-8").splitlines()]
    records = [Record(r["offset"], r["data"].encode("utf-8"), r["digest"]) for r in rows]
    store = MemoryLogStore()
    await store.append_records(session_id="golden-v6", records=records, expected_offset=0)
    log = await EventLog(store).read("golden-v6")
    t1 = next(e.offset for e in log if isinstance(e.body, ToolDispatched))
    assert isinstance(log[t1 - 1].body, PermissionDecided) and log[t1 - 1].body.decision == "allow"
    (before,) = plan_recovery(log[:t1]).calls
    assert (before.status, before.action) == ("not_dispatched", "ask_permission")
    (after,) = plan_recovery(log[: t1 + 1]).calls
    assert (after.status, after.action) == ("indeterminate", "park")
