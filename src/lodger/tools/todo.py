"""A todo list the model keeps for its session, guarded by compare-and-swap.

``todo_read`` shows the list and its revision; ``todo_write`` replaces it and must name
the revision it was based on. Two writes based on the same revision (two calls in one
batch, say) cannot both win: the second is refused with an error result that tells the
model to read again and redo its change (``lodger.authority.RevisionStore``). No lock is
held, so reads and writes never wait.

>>> store = todo_store()
>>> agent = Agent(model=..., tools=[*workspace_tools(), *todo_tools(store)],
...               services=Services(authorities=Authorities(revisions=[store])))

The list lives in the process (one per session id); every version of it is also in the
log, as the arguments of the ``todo_write`` calls that wrote it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from lodger.authority.revisions import Revision, RevisionStore
from lodger.tools.spec import Tool, ToolContext, tool

__all__ = ["TodoItem", "todo_store", "todo_tools"]

TodoList = tuple["TodoItem", ...]


class TodoItem(BaseModel):
    """One entry of the list."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: Annotated[str, Field(min_length=1, description="what to do")]
    status: Literal["pending", "in_progress", "done"] = "pending"


def todo_store() -> RevisionStore[TodoList]:
    """An empty store of todo lists, keyed by session id."""
    return RevisionStore(initial=tuple, what="the todo list")


def _show(current: Revision[TodoList]) -> str:
    items = [item.model_dump() for item in current.value]
    return json.dumps({"revision": current.revision, "items": items}, ensure_ascii=False)


def todo_tools(store: RevisionStore[TodoList] | None = None) -> list[Tool]:
    """``todo_read`` and ``todo_write`` over ``store`` (a fresh one when None).

    Both are async on purpose: they run on the event loop, where a compare-and-swap is
    atomic, never on a worker thread.
    """
    todos = store if store is not None else todo_store()

    @tool(group="planning", recovery="idempotent", nestable=True)
    async def todo_read(ctx: ToolContext) -> str:
        """Show this session's todo list and its revision.

        Returns {"revision": N, "items": [{"text": ..., "status": ...}]}. Pass N as
        expected_revision to todo_write.
        """
        return _show(todos.read(ctx.session_id))

    # A re-run after a crash is safe: if the first run had written, the revision moved on
    # and the compare-and-swap refuses the repeat.
    @tool(group="planning", recovery="idempotent", nestable=True)
    async def todo_write(
        ctx: ToolContext,
        items: Annotated[list[TodoItem], Field(description="the complete new list")],
        expected_revision: Annotated[
            int, Field(ge=0, description="the revision todo_read showed (0 for a new list)")
        ],
    ) -> str:
        """Replace this session's todo list with `items`.

        The write succeeds only if the list is still at `expected_revision`; if another
        call changed it since you read it, nothing is written and you get an error: call
        todo_read again and redo your change on top of the new revision.
        """
        written = todos.write(
            ctx.session_id, tuple(items), expected_revision=expected_revision, owner=ctx.call_id
        )
        return _show(written)

    return [todo_read, todo_write]
