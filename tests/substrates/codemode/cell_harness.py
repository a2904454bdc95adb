"""A harness for code mode: an agent whose model sends given cells, one per step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lodger.engine.settings import Services
from lodger.events import Event, ProposedCall
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.storage.logstore import LogStore
from lodger.substrates.codemode import CellLimits, CodeMode
from lodger.testing import MemoryArtifactStore
from lodger.tools import Tool


class Cells:
    """A model that sends one ``exec`` cell per step, then answers "done"."""

    def __init__(self, *cells: str) -> None:
        self.cells = cells
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        step = len(self.requests) - 1
        if step >= len(self.cells):
            return ModelResponse(text="done")
        return ModelResponse(
            calls=(
                ProposedCall(
                    call_id=f"cell{step}",
                    name="exec",
                    arguments=json.dumps({"code": self.cells[step]}),
                ),
            )
        )


def make_agent(
    tmp_path: Path,
    model: Cells,
    tools: Sequence[Tool],
    *,
    store: LogStore | None = None,
    language: str = "javascript",
    limits: CellLimits | None = None,
    **kw: Any,
) -> Agent:
    workspace = tmp_path / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    return Agent(
        model=FunctionModel(model),
        tools=tools,
        storage=Storage(
            log=EventLog(store or SqliteLogStore(tmp_path / "state")),
            artifacts=MemoryArtifactStore(),
        ),
        workspace=workspace,
        services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        code_mode=CodeMode(language=language, limits=limits),  # type: ignore[arg-type]
        **kw,
    )


def cell_result(events: Sequence[Event], call_id: str = "cell0") -> tuple[str, dict[str, Any]]:
    """The status and parsed content of a cell's T2."""
    for e in events:
        if e.kind == "tool_responded" and e.call_id == call_id:
            return e.body.status, json.loads(e.body.content)  # type: ignore[union-attr]
    raise AssertionError(f"no T2 for {call_id}")
