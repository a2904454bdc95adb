"""The replay report: what a replay of a session did differently, as JSON.

``GET /v1/sessions/{id}/replay-report`` reads the replay's log (a session a replay made:
its log begins with ``replay_started``) and its source's, and answers the report
``lodger replay --json`` writes (:mod:`lodger.runtime.replay_report`): the first step where
the two trajectories diverge, the calls added and removed, the answers side by side,
tokens and cost, and how the replay answered its calls. A session that is not a replay
is 404 (``session_not_found``, saying it is no replay). The report shows the source's
calls and answers, so the token must reach the source session too.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from lodger.errors import SessionNotFoundError
from lodger.host.auth import require_session
from lodger.host.routes._deps import Grant, Parts, Session
from lodger.runtime.replay_report import replay_report, replay_started_of
from lodger.runtime.rewind import open_branch

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/sessions/{session_id}/replay-report", tags=["sessions"])
async def replay_report_of(session_id: Session, who: Grant, host: Parts) -> dict[str, Any]:
    """The report of the replay ``session_id`` against the session it replays."""
    storage = host.sessions.storage
    branch = await open_branch(storage, session_id)
    events = await storage.log.read_all(branch)
    started = replay_started_of(events)
    if started is None:
        raise SessionNotFoundError(
            f"session {session_id!r} is not a replay: no replay report",
            hint="run `lodger replay SESSION --model SPEC` (or lodger.runtime.replay) first",
            session_id=session_id,
        )
    require_session(who, started.source_session)
    source = await storage.log.read_all(started.source_session)
    return replay_report(source, events).to_dict()
