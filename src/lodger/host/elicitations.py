"""The host's inbox of MCP servers' questions to a person, asked by hosted runs.

A call of a hosted run whose MCP server asks the user something (an elicitation) waits
here, in this process, while its turn runs: ``GET /v1/sessions/{id}/elicitations`` lists
the open questions, ``POST .../elicitations/{elicitation_id}`` answers one (the first
answer wins; a later one is a conflict). A form answer is checked against the server's
schema before it is taken: a wrong one is refused with the problems and the question
stays open. The question ends by itself when the server's ``elicitation_timeout_s``
passes, or when its call or turn ends; its ``elicitation_answered`` fact says how.

Turns that workers run (``lodger worker``) have no one to ask: their elicitations are
declined by policy at once (``by="policy"``), and the fact says so. A question lives in
the process that runs the call (a call cannot outlive its process), so it is not kept in
the control plane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lodger.errors import HostConflictError, UsageError
from lodger.tools._mcp_requests import form_problems
from lodger.tools.spec import Elicitation, ElicitationReply, Elicitor

__all__ = ["ElicitationInbox", "Pending"]


@dataclass(eq=False)
class Pending:
    """One open question and the future its call waits on."""

    question: Elicitation
    future: asyncio.Future[ElicitationReply] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def to_dict(self) -> dict[str, Any]:
        q = self.question
        return {
            "elicitation_id": q.elicitation_id,
            "session_id": q.session_id,
            "call_id": q.call_id,
            "server": q.server,
            "mode": q.mode,
            "message": q.message,
            "requested_schema": dict(q.requested_schema),
            "url": q.url,
        }


class ElicitationInbox:
    """Open questions of this host's runs, by session and elicitation id."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], Pending] = {}

    def elicitor(self, session_id: str) -> Elicitor:
        """The ``Elicitor`` of one session's hosted runs: holds each question here."""

        async def elicit(question: Elicitation) -> ElicitationReply:
            key = (session_id, question.elicitation_id)
            pending = self._open[key] = Pending(question)
            try:
                return await pending.future
            finally:
                self._open.pop(key, None)

        return elicit

    def pending(self, *, session_id: str | None = None) -> list[Pending]:
        return [p for (sid, _), p in self._open.items() if session_id is None or sid == session_id]

    def answer(
        self,
        session_id: str,
        elicitation_id: str,
        *,
        action: Literal["accept", "decline", "cancel"],
        content: Mapping[str, Any],
        by: str,
    ) -> Pending:
        """Answer an open question once; a form answer must match its schema."""
        pending = self._open.get((session_id, elicitation_id))
        if pending is None:
            raise UsageError(
                f"no open elicitation {elicitation_id!r} in session {session_id!r}",
                hint="list the open ones: GET /v1/sessions/{id}/elicitations (it may have "
                "been answered, timed out, or ended with its call)",
                code="not_found",
                session_id=session_id,
            )
        if pending.future.done():
            raise HostConflictError(
                f"elicitation {elicitation_id!r} is answered already",
                code="already_answered",
                session_id=session_id,
            )
        question = pending.question
        if action == "accept" and question.mode == "form":
            problems = form_problems(question.requested_schema, content)
            if problems:
                raise UsageError(
                    f"the answer to {elicitation_id!r} does not match its form: "
                    + "; ".join(problems),
                    hint="send content that matches requested_schema, or decline",
                    code="invalid_answer",
                    session_id=session_id,
                )
        kept = dict(content) if action == "accept" and question.mode == "form" else {}
        pending.future.set_result(ElicitationReply(action=action, content=kept, who=by))
        return pending
