"""The operator console: its static pages, and the two summaries it reads.

``GET /console`` serves the console's page and ``/console/assets/...`` its scripts and
styles, shipped inside the package (``lodger/host/console``; no build step). They hold no
data and need no token: the page trades the token given in its URL fragment for the
HttpOnly cookie (``POST /v1/auth/cookie``), as the timeline page does, and then asks the
API. Every console answer carries a strict Content-Security-Policy: scripts and styles
from this origin only, no inline script, requests to this origin only.

``GET /v1/console/sessions`` lists the sessions a token sees with what a person filters
them by (``lodger.host.overview``); ``GET /v1/sessions/{id}/usage`` prices each turn.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel

from lodger.engine.prices import PriceTable
from lodger.errors import UsageError
from lodger.host.overview import Digest, SessionDigest, TurnUsage, turn_usage
from lodger.host.routes._deps import Grant, HostParts, Parts, Session

__all__ = ["CSP", "ConsoleSession", "ConsoleSessions", "SessionUsage", "TurnUsageOut", "router"]

#: what a console page may load and reach: its own origin's files and API, nothing else
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_MEDIA = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}

Status = Literal[
    "new", "running", "waiting_approval", "interrupted", "completed", "failed", "cancelled",
    "step_limit", "abandoned",
]  # fmt: skip


class ConsoleSession(BaseModel):
    session_id: str
    #: ``running``, ``waiting_approval`` (running, a call waits for a person),
    #: ``interrupted`` (an open turn nothing runs: recover it), else the last turn's end
    status: Status
    model: str | None = None
    workspace: str | None = None
    events: int
    turns: int
    open_turn: str | None = None
    last_input: str = ""
    #: the last fact's time, microseconds since the epoch (0: no log yet)
    last_activity_us: int
    created_us: int
    parked: int
    #: micro-USD the session's model requests cost (null: a model with no price)
    cost_micro_usd: int | None
    parent: str | None = None
    relation: Literal["fork", "subagent", "branch"] | None = None
    parent_call: str | None = None


class ConsoleSessions(BaseModel):
    sessions: list[ConsoleSession]
    #: how many sessions matched in all (``sessions`` holds at most ``limit``)
    total: int


class TurnUsageOut(BaseModel):
    turn_id: str | None
    index: int
    input: str
    status: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_micro_usd: int | None


class SessionUsage(BaseModel):
    session_id: str
    turns: list[TurnUsageOut]
    total: TurnUsageOut


router = APIRouter()


@router.get("/console", tags=["console"], response_class=Response)
async def console_page() -> Response:
    """The console's page (static; see the module docstring)."""
    return _asset("index.html")


@router.get("/console/assets/{name}", tags=["console"], response_class=Response)
async def console_asset(
    name: Annotated[
        str, Path(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*\.(js|css)$")
    ],
) -> Response:
    """A script or style of the console page."""
    return _asset(name)


def _asset(name: str) -> Response:
    file = resources.files("lodger.host").joinpath("console", name)
    if not file.is_file():
        raise UsageError(f"the console has no file {name!r}", code="not_found")
    media = _MEDIA[name[name.rindex(".") :]]
    return Response(file.read_bytes(), media_type=media, headers=_HEADERS)


@router.get("/v1/console/sessions", tags=["console"])
async def console_sessions(
    who: Grant,
    host: Parts,
    q: Annotated[str, Query(max_length=200, description="a part of the id or workspace")] = "",
    status: Annotated[Status | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> ConsoleSessions:
    """The sessions this token can see, most recently active first, with their status,
    workspace, last activity, parked calls, cost and parent (a fork's, a subagent's or a
    rewind branch's)."""
    pending: dict[str, int] = {}
    for approval in await host.hub.approvals():
        pending[approval.session_id] = pending.get(approval.session_id, 0) + 1
    rows = []
    for sid in await host.hub.list_sessions():
        if not who.allows(sid):
            continue
        row = await _row(host, sid, pending.get(sid, 0))
        needle = q.lower()
        if needle and needle not in sid.lower() and needle not in (row.workspace or "").lower():
            continue
        if status is None or row.status == status:
            rows.append(row)
    rows.sort(key=lambda r: r.last_activity_us, reverse=True)
    return ConsoleSessions(sessions=rows[:limit], total=len(rows))


@router.get("/v1/sessions/{session_id}/usage", tags=["console"])
async def usage(session_id: Session, host: Parts) -> SessionUsage:
    """Tokens and cost of each turn's model requests, and of the session (compaction
    requests count in the session's total)."""
    log = host.sessions.storage.log
    events = await log.read(session_id) if await log.exists(session_id) else []
    turns, total = turn_usage(events, _prices(host))
    return SessionUsage(
        session_id=session_id, turns=[_usage_out(t) for t in turns], total=_usage_out(total)
    )


def _prices(host: HostParts) -> PriceTable:
    budgets = host.hub.config.budgets
    return budgets.prices if budgets is not None else PriceTable.defaults()


async def _row(host: HostParts, sid: str, parked: int) -> ConsoleSession:
    log = host.sessions.storage.log
    digest = (
        await SessionDigest.for_log(log).digest(sid, _prices(host))
        if await log.exists(sid)
        else Digest(session_id=sid)
    )
    running = await host.hub.busy(sid)
    return ConsoleSession(
        session_id=sid,
        status=_status(digest, running=running, parked=parked),
        model=await host.control.session_model(sid),
        workspace=digest.workspace,
        events=digest.high_water,
        turns=digest.turns,
        open_turn=digest.open_turn,
        last_input=digest.last_input,
        last_activity_us=digest.last_us,
        created_us=digest.first_us,
        parked=parked,
        cost_micro_usd=digest.cost_micro_usd,
        parent=digest.parent,
        relation=digest.relation,
        parent_call=digest.parent_call,
    )


def _status(digest: Digest, *, running: bool, parked: int) -> Status:
    if parked and (running or digest.open_turn is not None):
        return "waiting_approval"  # parked in this process, or in a worker's control plane
    if running:
        return "running"
    if digest.open_turn is not None:
        return "interrupted"
    found = digest.last_turn_status
    if found in ("completed", "failed", "cancelled", "step_limit", "abandoned"):
        return found  # type: ignore[return-value]
    return "new"


def _usage_out(turn: TurnUsage) -> TurnUsageOut:
    return TurnUsageOut(
        turn_id=turn.turn_id,
        index=turn.index,
        input=turn.input,
        status=turn.status,
        requests=turn.requests,
        input_tokens=turn.input_tokens,
        output_tokens=turn.output_tokens,
        cache_read_tokens=turn.cache_read_tokens,
        cache_write_tokens=turn.cache_write_tokens,
        cost_micro_usd=turn.cost_micro_usd,
    )
