"""Settings and fixtures shared by every test module."""

import os
from collections.abc import Callable

import pytest
from hypothesis import settings

from lodger.events import (
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    TurnStarted,
)

# No per-example deadline: first calls into pydantic and shared CI runners are slow, and a
# flaky deadline says nothing about correctness.
settings.register_profile("lodger", deadline=None)
# The fast lane (`scripts/check.sh --fast` sets LODGER_FAST_LANE=1) tries fewer examples
# where a test does not set its own count; CI runs the full profile.
settings.register_profile("fast", deadline=None, max_examples=20)
settings.load_profile("fast" if os.environ.get("LODGER_FAST_LANE") == "1" else "lodger")


@pytest.fixture(autouse=True)
def _no_log_key_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's LODGER_LOG_KEY* must not change what the tests (and the processes
    they start) read and write; tests that want a key set it themselves."""
    for name in ("LODGER_LOG_KEY", "LODGER_LOG_KEY_FILE", "LODGER_LOG_KEY_REQUIRED"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _trust_records_of_the_test(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each test keeps its own lodger.toml trust records (``lodger trust``), never the
    user's ~/.config/lodger; subprocesses inherit the variable."""
    monkeypatch.setenv("LODGER_CONFIG_DIR", str(tmp_path_factory.mktemp("lodger-config")))


def _stopped_after_t1(tool: str, workspace: str) -> list[EventDraft]:
    """A session's first turn, stopped after T1 of its one call ``c1`` of ``tool`` (no T2,
    no run or turn end): offset 5 is the dispatch."""
    env = {"turn_id": "t1", "run_id": "r1", "step_id": "st0"}
    call = ProposedCall(call_id="c1", name=tool, arguments="{}")
    step = StepStarted(index=0, model="scripted:x", tools=(ToolRef(name=tool, schema_digest="d"),))
    bodies = [
        (SessionStarted(workspace=workspace), {}),
        (TurnStarted(input=tool), {"turn_id": "t1"}),
        (RunStarted(model="scripted:x"), {"turn_id": "t1", "run_id": "r1"}),
        (step, env),
        (ModelOutput(calls=(call,)), env),
        (ToolDispatched(operation_id="op1", tool=tool, arguments={}), {**env, "call_id": "c1"}),
    ]
    return [EventDraft(id=f"e{i}", ts=i + 1, body=b, **e) for i, (b, e) in enumerate(bodies)]


@pytest.fixture
def stopped_after_t1() -> Callable[[str, str], list[EventDraft]]:
    """``(tool, workspace) -> drafts`` of a first turn stopped after T1 of call ``c1``."""
    return _stopped_after_t1
