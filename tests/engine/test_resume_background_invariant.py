"""The resume invariant "no unconverged background work", checked as such, on a real
SQLite log: a turn left open with a background process the log says is live resumes
only once that process is reconciled. When reconciling leaves it neither adopted nor
ended, the resume is refused naming the process, and no run starts (no ``run_started``
is committed); when it is ended ``unknown`` (gone), the run starts and records that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lodger import Agent, tool
from lodger.engine import resume as resume_module
from lodger.engine.settings import Hooks
from lodger.errors import ResumeBlockedError
from lodger.events import ProcessEnded, ProcessStarted
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel, tool_call
from lodger.substrates.background import unconverged
from lodger.tools.spec import ToolOutput


@tool
def start_server() -> ToolOutput:
    """Pretend to start a background server (its handle is a fact with T2)."""
    started = ProcessStarted(
        process_id="p1",
        operation_id="op",
        command="python -m http.server",
        pid=2**22 + 17,  # no such pid: reconciling finds it gone
        sandbox="bubblewrap start=1 boot=nowhere",
    )
    return ToolOutput(content="started p1", facts=(started,))


@tool(approval=True)
def deploy() -> str:
    """Needs approval: parking it leaves the turn open."""
    return "deployed"


async def _model(request: ModelRequest) -> ModelResponse:
    results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
    if not results:
        return ModelResponse(calls=(tool_call("start_server"),))
    if len(results) == 1:
        return ModelResponse(calls=(tool_call("deploy"),))
    return ModelResponse(text="done")


def _agent(tmp_path: Path, answer: Any) -> Agent:
    async def approver(t: Any, arguments: dict[str, Any]) -> Any:
        return answer

    return Agent(
        model=FunctionModel(_model),
        tools=[start_server, deploy],
        storage=tmp_path / "state",
        hooks=Hooks(approver=approver),
    )


async def _open_turn_with_a_live_handle(tmp_path: Path) -> int:
    async with _agent(tmp_path, "park") as a:
        assert (await a.run("serve, then deploy", session="s1")).status == "waiting"
        log = list(await a.session("s1").events())
    assert any(isinstance(e.body, ProcessStarted) for e in log)
    assert not any(isinstance(e.body, ProcessEnded) for e in log)
    return sum(e.kind == "run_started" for e in log)


async def test_an_unreconciled_handle_refuses_the_resume_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = await _open_turn_with_a_live_handle(tmp_path)
    # reconciling that converges nothing (a substrate that cannot tell)
    monkeypatch.setattr(resume_module, "reconcile", lambda session_id, events: [])
    async with _agent(tmp_path, "once") as a:
        before = len(await a.session("s1").events())
        with pytest.raises(ResumeBlockedError) as refused:
            await a.resume("s1")
        assert any("background: process p1" in line for line in refused.value.blockers)
        log = list(await a.session("s1").events())
    assert len(log) == before  # nothing committed: no run claimed the turn
    assert sum(e.kind == "run_started" for e in log) == runs


async def test_a_gone_handle_is_recorded_unknown_and_the_run_goes_on(tmp_path: Path) -> None:
    await _open_turn_with_a_live_handle(tmp_path)
    async with _agent(tmp_path, "once") as a:
        result = await a.resume("s1")
        assert result.status == "completed"
        log = list(await a.session("s1").events())
    ended = [e for e in log if isinstance(e.body, ProcessEnded)]
    assert [(e.body.process_id, e.body.status) for e in ended] == [("p1", "unknown")]
    claim = max(e.offset for e in log if e.kind == "run_started")
    assert ended[0].offset > claim  # recorded by the new run, after its claim
    assert unconverged("s1", log, ()) == ()  # converged: the log ends it


def test_unconverged_names_each_live_handle_left() -> None:
    from types import SimpleNamespace

    started = ProcessStarted(
        process_id="p9", operation_id="op", command="sleep 9", pid=1, sandbox="x"
    )
    events: Any = [SimpleNamespace(body=started)]
    (line,) = unconverged("nobody-here", events, ())
    assert "p9" in line and "sleep 9" in line
    gone = ProcessEnded(process_id="p9", status="unknown")
    assert unconverged("nobody-here", events, (gone,)) == ()
