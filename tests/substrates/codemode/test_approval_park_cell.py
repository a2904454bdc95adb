"""A nested call of a code cell cannot park its approval (the cell runs in one isolate
and cannot be suspended): an approver's ``park`` there is a denial whose reason says so,
the tool never runs, the cell goes on with the error, and the turn ends normally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cell_harness import Cells, cell_result, make_agent

from lodger import tool
from lodger.engine.permissions import current_ask
from lodger.engine.settings import Hooks
from lodger.events import PermissionDecided, ToolDispatched
from lodger.tools import Tool


async def test_park_inside_a_cell_is_a_denial(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool(nestable=True, approval=True)
    async def deploy(target: str) -> str:
        """Deploy somewhere (asks first)."""
        ran.append(target)
        return f"deployed {target}"

    asked: list[Any] = []

    async def approver(t: Tool, arguments: dict[str, Any]) -> str:
        asked.append(current_ask())
        return "park"

    model = Cells(
        "try { return await tools.deploy({target: 'prod'}); }"
        " catch (e) { return 'refused: ' + e.message; }"
    )
    async with make_agent(tmp_path, model, [deploy], hooks=Hooks(approver=approver)) as agent:
        result = await agent.run("go", session="s")
        events = await agent.session("s").events()
    assert result.status == "completed"
    assert ran == []
    (ask,) = asked
    assert ask is not None and ask.parent_call_id == "cell0" and not ask.may_park
    (decided,) = [e for e in events if isinstance(e.body, PermissionDecided)]
    assert decided.parent_call_id == "cell0"
    assert (decided.body.decision, decided.body.reason) == (
        "deny", "the approval cannot wait inside a code cell",
    )  # fmt: skip
    assert not [e for e in events if isinstance(e.body, ToolDispatched) and e.parent_call_id]
    status, content = cell_result(events)
    assert status == "ok"
    assert "cannot wait inside a code cell" in str(content)
