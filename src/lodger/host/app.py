"""The HTTP API of the host: sessions, messages, live event streams, approvals, recovery.

``create_app(sessions, control, config)`` builds a FastAPI app whose generated OpenAPI
document (``docs/openapi.json``) is the contract. Every route needs a bearer token
(``lodger.host.auth``) except the timeline page's static files (which hold no data) and
webhooks (authenticated by their HMAC signature). Every refusal is a 4xx whose body
carries the engine's error code and next steps (``lodger.host.errors``).

Streams (``GET /v1/sessions/{id}/stream``) are server-sent events: ``id`` is the fact's
offset, ``event`` its kind, ``data`` the fact as JSON. A client that reconnects with
``Last-Event-ID: N`` continues at offset ``N + 1`` with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from lodger.control.interface import ControlPlane
from lodger.errors import CorruptLogError, HostConflictError, LodgerError, UsageError
from lodger.events import ArtifactStored, Event, ToolResponded
from lodger.host.auth import COOKIE, Authenticator, bearer, require_admin, require_session
from lodger.host.control import HostControl, Message, TokenGrant, hash_token, token_id
from lodger.host.errors import ErrorBody, error_body, status_for
from lodger.host.feed import Feeds
from lodger.host.hub import EventObserver, HostConfig, Hub
from lodger.host.limits import BodyLimit
from lodger.host.metrics import HostMetrics
from lodger.host.webhooks import MAX_BODY, HookConfig, check_signature, delivery_id
from lodger.sessions import Sessions

__all__ = ["API_VERSION", "create_app"]

API_VERSION = "1"
#: the largest request body the host reads (a declared Content-Length over it is refused)
MAX_REQUEST = 1024 * 1024
#: the largest offset a request may name: storage keeps offsets as signed 64-bit integers
MAX_OFFSET = 2**62

SessionId = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
#: the prefix of the keys the host gives webhook deliveries (``hook:NAME:DELIVERY``): a
#: client's key may not take one, or it could claim a delivery before it arrives
HOOK_KEY = "hook:"


def _not_a_hook_key(key: str) -> str:
    if key.startswith(HOOK_KEY):
        raise ValueError(f"keys starting with {HOOK_KEY!r} are the host's own (webhooks)")
    return key


Key = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description=f"any printable ASCII, not starting with {HOOK_KEY!r}",
    ),
    AfterValidator(_not_a_hook_key),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for status, why in (
        (400, "bad input (the engine's error code says what)"),
        (401, "no token, or an unknown one"),
        (403, "the token's scope does not cover this"),
        (404, "no such session, call or artifact"),
        (409, "a conflict: answered already, key reused, session busy or blocked"),
        (413, "the request body is too large"),
        (422, "the request does not match the schema"),
    )
}


# ---------------------------------------------------------------- bodies


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_In):
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    model: str | None = Field(default=None, max_length=500)
    message: str | None = Field(default=None, max_length=200_000)
    idempotency_key: Key | None = None


class SendMessage(_In):
    text: str = Field(min_length=1, max_length=200_000)
    idempotency_key: Key | None = None


class Answer(_In):
    decision: Literal["allow", "deny"]


class DecideCall(_In):
    call_id: str = Field(min_length=1, max_length=200)
    decision: Literal["completed", "not_applied", "abandon"]
    result: str | None = Field(default=None, max_length=200_000)


class ResumeSession(_In):
    idempotency_key: Key | None = None


class AbandonTurn(_In):
    reason: str | None = Field(default=None, max_length=2000)


class ForkSession(_In):
    at: int | None = Field(default=None, ge=0)
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )


class MakeToken(_In):
    session_id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    label: str = Field(default="", max_length=200)


class MessageOut(BaseModel):
    id: int
    session_id: str
    idempotency_key: str
    kind: str
    status: str
    start_offset: int | None = None
    result: dict[str, Any] | None = None


class Accepted(BaseModel):
    message: MessageOut
    created: bool
    stream: str


class SessionOut(BaseModel):
    session_id: str
    model: str | None = None
    events: int
    turns: int
    open_turn: str | None = None
    last_turn_status: str | None = None
    workspace: str | None = None
    running: bool
    pending_approvals: int


class CreatedSession(BaseModel):
    session_id: str
    model: str
    message: MessageOut | None = None
    stream: str


class SessionList(BaseModel):
    sessions: list[str]


class EventPage(BaseModel):
    events: list[dict[str, Any]]
    next: int


class ApprovalOut(BaseModel):
    session_id: str
    call_id: str
    tool: str
    summary: str
    status: str
    answered_by: str | None = None


class ApprovalList(BaseModel):
    approvals: list[ApprovalOut]


class Facts(BaseModel):
    offsets: list[int]


class Forked(BaseModel):
    session_id: str
    parent: str
    high_water: int


class RevokeToken(_In):
    """Name the token itself, or (admin only) its ``id`` from ``GET /v1/tokens``."""

    token: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")
    id: str | None = Field(default=None, pattern=r"^tok_[0-9a-f]{16}$")

    @model_validator(mode="after")
    def _one_of(self) -> RevokeToken:
        if (self.token is None) == (self.id is None):
            raise ValueError("name exactly one of token and id")
        return self


class TokenRevoked(BaseModel):
    revoked: bool


class TokenOut(BaseModel):
    token: str
    id: str
    scope: str
    session_id: str | None = None


class TokenListed(BaseModel):
    id: str
    scope: str
    session_id: str | None
    label: str
    revoked: bool
    created_at: float | None


class TokenList(BaseModel):
    tokens: list[TokenListed]


class HookAccepted(BaseModel):
    session_id: str
    message: MessageOut
    created: bool


# ---------------------------------------------------------------- the app


async def _grant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> TokenGrant:
    authenticator: Authenticator = request.app.state.auth
    return await authenticator.grant(request, credentials)


Grant = Annotated[TokenGrant, Depends(_grant)]


async def _session(request: Request, session_id: SessionId, who: Grant) -> str:
    require_session(who, session_id)
    hub: Hub = request.app.state.hub
    await hub.require(session_id)
    return session_id


Session = Annotated[str, Depends(_session)]


def event_json(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = event.model_dump(mode="json")
    out["kind"] = event.kind
    return out


def _message(message: Message) -> MessageOut:
    return MessageOut(**message.to_dict())


def _stream_path(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/stream"


def create_app(
    sessions: Sessions,
    control: HostControl,
    config: HostConfig | None = None,
    *,
    hooks: dict[str, HookConfig] | None = None,
    observers: tuple[EventObserver, ...] = (),
    poll_s: float = 1.0,
    heartbeat_s: float = 15.0,
    on_started: Callable[[Hub], Awaitable[None]] | None = None,
    plane: ControlPlane | None = None,
) -> FastAPI:
    """The host's ASGI app over ``sessions`` (its storage) and ``control`` (its index).

    With ``plane`` (a started control plane) the host is distributed: it runs no turns,
    sends become wakes that ``lodger worker`` processes run, and approvals are answered
    in the control plane. The app owns none of them: the caller closes them after the
    app has stopped.
    """
    config = config or HostConfig()
    hooks = hooks or {}
    metrics = HostMetrics()
    feeds = Feeds(sessions.storage.log, poll_s=poll_s)
    hub: Hub
    if plane is None:
        hub = Hub(sessions, control, config, feeds=feeds, observers=(metrics.observe, *observers))
    else:  # distributed: workers run the turns (lodger.host.distributed)
        from lodger.host.distributed import ControlPlaneHub

        hub = ControlPlaneHub(
            sessions, control, plane, config, feeds=feeds, observers=(metrics.observe, *observers)
        )
    auth = Authenticator(control)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with asyncio.TaskGroup() as group:
            await hub.start(group)
            if on_started is not None:
                await on_started(hub)
            try:
                yield
            finally:
                await hub.stop()

    app = FastAPI(
        title="lodger host",
        version=API_VERSION,
        description="Durable agent sessions over HTTP: send messages, stream committed "
        "facts (resumable by offset), answer approvals, recover, decide, resume, fork.",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    app.state.hub = hub
    # a body without a Content-Length is read here, bounded, before any route sees it
    app.add_middleware(BodyLimit, limit=MAX_REQUEST)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            # every error body, on every route, whatever the route's own media type
            errors = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(errors.pop("$defs", {}))
            schemas["ErrorBody"] = errors
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.auth = auth
    app.state.metrics = metrics

    # ------------------------------------------------------------ errors

    @app.exception_handler(LodgerError)
    async def lodger_error(request: Request, exc: LodgerError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors()[:10]:
            where = ".".join(str(p) for p in err.get("loc", ()))
            problems.append(f"{where}: {err.get('msg', 'invalid')}")
        error = UsageError(
            "the request does not match the API: " + "; ".join(problems),
            hint="see /openapi.json for the request's schema",
            code="invalid_request",
        )
        return JSONResponse(error_body(error), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else "invalid_request"
        error = UsageError(str(exc.detail), code=code)
        return JSONResponse(error_body(error), status_code=exc.status_code)

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_REQUEST:
            error = UsageError(
                f"a request body may hold at most {MAX_REQUEST} bytes",
                hint="send large inputs as several messages",
                code="payload_too_large",
            )
            refused = JSONResponse(error_body(error), status_code=413)
            metrics.request(request.method, "unmatched", 413)
            return refused
        response: Response = await call_next(request)
        route = request.scope.get("route")
        name = getattr(route, "path", "unmatched")
        metrics.request(request.method, name, response.status_code)
        return response

    # ------------------------------------------------------------ auth

    @app.post("/v1/tokens", status_code=201, tags=["auth"])
    async def make_token(body: MakeToken, who: Grant) -> TokenOut:
        """Make a token (admin only): scoped to one session, or admin when no session is
        named. The token is shown once; only its hash is kept."""
        from lodger.host.auth import new_token

        require_admin(who)
        if body.session_id is not None:
            await hub.require(body.session_id)
        token = new_token()
        scope: Literal["admin", "session"] = "session" if body.session_id else "admin"
        await control.add_token(token, scope=scope, session_id=body.session_id, label=body.label)
        return TokenOut(
            token=token, id=token_id(hash_token(token)), scope=scope, session_id=body.session_id
        )

    @app.get("/v1/tokens", tags=["auth"])
    async def list_tokens(who: Grant) -> TokenList:
        """Every token this host's index records (admin only), revoked ones included: each
        by its public ``id``, never the token (only hashes are kept)."""
        require_admin(who)
        return TokenList(tokens=[TokenListed(**info.to_dict()) for info in await control.tokens()])

    @app.post("/v1/tokens/revoke", tags=["auth"])
    async def revoke_token(body: RevokeToken, request: Request, who: Grant) -> TokenRevoked:
        """Revoke a token for good (every host of a shared control plane refuses it within
        seconds). An admin token may revoke any token; any token may revoke itself.
        ``revoked`` is false when the token was unknown or revoked already."""
        if body.token is not None:
            digest = hash_token(body.token)
            if who.scope != "admin" and digest != auth.presented(request):
                require_admin(who)  # raises: a session token revokes only itself
        else:
            require_admin(who)  # by id: admin only
            named = [info for info in await control.tokens() if info.id == body.id]
            if not named:
                return TokenRevoked(revoked=False)
            if len(named) > 1:  # two hashes share 64 bits: name the token itself
                raise HostConflictError(
                    f"token id {body.id} names {len(named)} tokens",
                    hint="revoke with the token itself",
                    code="conflict",
                )
            digest = named[0].token_hash
        revoked = await control.revoke_hash(digest)
        auth.forget_hash(digest)
        return TokenRevoked(revoked=revoked)

    @app.post("/v1/auth/cookie", status_code=204, tags=["auth"])
    async def cookie(request: Request, who: Grant) -> Response:
        """Trade the bearer token for an HttpOnly cookie (for the timeline page, whose
        EventSource cannot send headers)."""
        # the token that authenticated: a bearer header's, else the cookie's (another
        # scheme's header, such as a proxy's Basic auth, is not a token of ours)
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else ""
        token = token or request.cookies.get(COOKIE, "")
        response = Response(status_code=204)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    # ------------------------------------------------------------ sessions

    @app.post("/v1/sessions", status_code=201, tags=["sessions"])
    async def create_session(body: CreateSession, who: Grant) -> CreatedSession:
        """Create a session (admin only), optionally with its first message."""
        require_admin(who)
        sid = await hub.create(session_id=body.session_id, model=body.model)
        spec = await control.session_model(sid) or hub.resolve_model(None)
        sent = None
        if body.message is not None:
            key = body.idempotency_key or f"create:{uuid.uuid4()}"
            sent, _ = await hub.send(sid, key=key, text=body.message)
        return CreatedSession(
            session_id=sid,
            model=spec,
            message=None if sent is None else _message(sent),
            stream=_stream_path(sid),
        )

    @app.get("/v1/sessions", tags=["sessions"])
    async def list_sessions(who: Grant) -> SessionList:
        """The sessions this token can see."""
        found = await hub.list_sessions()
        return SessionList(sessions=[s for s in found if who.allows(s)])

    @app.get("/v1/sessions/{session_id}", tags=["sessions"])
    async def show_session(session_id: Session) -> SessionOut:
        state = (
            await sessions.state(session_id)
            if await sessions.storage.log.exists(session_id)
            else None
        )
        pending = await hub.approvals(session_id=session_id)
        return SessionOut(
            session_id=session_id,
            model=await control.session_model(session_id) or (state.last_model if state else None),
            events=len(state.events) if state else 0,
            turns=state.turns if state else 0,
            open_turn=state.open_turn if state else None,
            last_turn_status=state.last_turn_status if state else None,
            workspace=state.workspace if state else None,
            running=await hub.busy(session_id),
            pending_approvals=len(pending),
        )

    @app.get("/v1/sessions/{session_id}/events", tags=["events"])
    async def events(
        session_id: Session,
        start: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    ) -> EventPage:
        """Committed facts ``[start, start + limit)``, verified."""
        page = await sessions.storage.log.read(session_id, start=start, end=start + limit)
        return EventPage(events=[event_json(e) for e in page], next=start + len(page))

    @app.get(
        "/v1/sessions/{session_id}/stream",
        tags=["events"],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
    )
    async def stream(
        session_id: Session,
        start: Annotated[int | None, Query(ge=0, le=MAX_OFFSET)] = None,
        follow: bool = True,
        last_event_id: Annotated[  # at most 18 digits: below MAX_OFFSET
            str | None, Header(alias="Last-Event-ID", max_length=18, pattern=r"^[0-9]+$")
        ] = None,
    ) -> StreamingResponse:
        """The session's facts as server-sent events from ``start`` (or after
        ``Last-Event-ID``), then live as they commit (``follow=false``: up to now). A
        stream that cannot go on (a damaged log) ends with a ``stream_error`` event whose data
        is the error body."""
        first = start if start is not None else 0
        if last_event_id is not None:
            first = int(last_event_id) + 1

        async def body() -> AsyncIterator[bytes]:
            metrics.active_streams += 1
            metrics.streams_total += 1
            try:
                yield b": lodger stream\n\n"
                events = feeds.follow(session_id, start=first, follow=follow)
                pending: asyncio.Task[Event] | None = None
                try:
                    while True:
                        if pending is None:
                            pending = asyncio.ensure_future(anext(events))
                        done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
                        if not done:
                            yield b": ping\n\n"
                            continue
                        try:
                            event = pending.result()
                        except StopAsyncIteration:
                            return
                        except CorruptLogError as exc:
                            # the status line went out already: say why the stream ends (a
                            # damaged log, fail closed) as a last event, not a cut connection;
                            # anything else (storage away for a moment) cuts it: the client
                            # reconnects with Last-Event-ID
                            error = json.dumps(error_body(exc), ensure_ascii=False)
                            yield f"event: stream_error\ndata: {error}\n\n".encode()
                            return
                        finally:
                            pending = None
                        data = json.dumps(event_json(event), ensure_ascii=False)
                        yield f"id: {event.offset}\nevent: {event.kind}\ndata: {data}\n\n".encode()
                finally:
                    if pending is not None:
                        pending.cancel()
                        await asyncio.gather(pending, return_exceptions=True)
                    await events.aclose()
            finally:
                metrics.active_streams -= 1

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/sessions/{session_id}/messages", status_code=202, tags=["sessions"])
    async def send(
        session_id: Session,
        body: SendMessage,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", max_length=200, pattern=r"^[\x21-\x7e]+$")
        ] = None,
    ) -> Accepted:
        """Queue a turn of ``text``; the same idempotency key returns the same message
        and runs nothing again. The turn runs in the background: follow ``stream``."""
        if idempotency_key is not None and idempotency_key.startswith(HOOK_KEY):
            where = ("header", "Idempotency-Key")
            msg = f"keys starting with {HOOK_KEY!r} are the host's own (webhooks)"
            raise RequestValidationError([{"loc": where, "msg": msg, "type": "value_error"}])
        key = body.idempotency_key or idempotency_key or f"auto:{uuid.uuid4()}"
        message, created = await hub.send(session_id, key=key, text=body.text)
        return Accepted(message=_message(message), created=created, stream=_stream_path(session_id))

    @app.get("/v1/sessions/{session_id}/messages/{message_id}", tags=["sessions"])
    async def show_message(
        session_id: Session, message_id: Annotated[int, Path(ge=0, le=2**62)]
    ) -> MessageOut:
        found = await hub.message(session_id, message_id)
        if found is None:
            raise UsageError(
                f"session {session_id!r} has no message {message_id}",
                code="not_found",
                session_id=session_id,
            )
        return _message(found)

    # ------------------------------------------------------------ approvals

    @app.get("/v1/approvals", tags=["approvals"])
    async def all_approvals(who: Grant) -> ApprovalList:
        """Pending approvals of every session this token can see."""
        found = await hub.approvals()
        return ApprovalList(
            approvals=[ApprovalOut(**a.to_dict()) for a in found if who.allows(a.session_id)]
        )

    @app.get("/v1/sessions/{session_id}/approvals", tags=["approvals"])
    async def approvals(session_id: Session) -> ApprovalList:
        found = await hub.approvals(session_id=session_id)
        return ApprovalList(approvals=[ApprovalOut(**a.to_dict()) for a in found])

    @app.post("/v1/sessions/{session_id}/approvals/{call_id}", tags=["approvals"])
    async def answer(
        session_id: Session,
        call_id: Annotated[str, Path(min_length=1, max_length=200)],
        body: Answer,
        who: Grant,
    ) -> ApprovalOut:
        """Answer a parked call; the first answer wins, a later one gets 409."""
        decided = await hub.answer(
            session_id, call_id, allow=body.decision == "allow", by=who.label or who.scope
        )
        return ApprovalOut(**decided.to_dict())

    # ------------------------------------------------------------ recovery

    @app.get("/v1/sessions/{session_id}/recovery", tags=["recovery"])
    async def recovery(session_id: Session) -> dict[str, Any]:
        """The recovery plan of the open turn (read-only)."""
        if not await sessions.storage.log.exists(session_id):
            return {"session_id": session_id, "open_turn": None, "calls": [], "blocked": False}
        return (await sessions.plan(session_id)).to_dict()

    @app.post("/v1/sessions/{session_id}/decide", tags=["recovery"])
    async def decide(session_id: Session, body: DecideCall) -> Facts:
        """An operator decision on a parked call, appended as a fact."""
        async with hub.exclusive(session_id):
            made = await sessions.decide(
                session_id, body.call_id, body.decision, result=body.result
            )
            if body.decision == "abandon":
                await hub.abandoned(session_id)
            else:
                await hub.decided(session_id)
        hub.publish(session_id, made)
        return Facts(offsets=[e.offset for e in made])

    @app.post("/v1/sessions/{session_id}/abandon", tags=["recovery"])
    async def abandon(session_id: Session, body: AbandonTurn) -> Facts:
        async with hub.exclusive(session_id):
            made = await sessions.abandon(session_id, reason=body.reason)
            await hub.abandoned(session_id)
        hub.publish(session_id, made)
        return Facts(offsets=[e.offset for e in made])

    @app.post("/v1/sessions/{session_id}/resume", status_code=202, tags=["recovery"])
    async def resume(session_id: Session, body: ResumeSession) -> Accepted:
        """Continue the interrupted turn as a new run, in the background."""
        key = body.idempotency_key or f"resume:{uuid.uuid4()}"
        message, created = await hub.send(session_id, key=key, text="", kind="resume")
        return Accepted(message=_message(message), created=created, stream=_stream_path(session_id))

    @app.post("/v1/sessions/{session_id}/fork", status_code=201, tags=["recovery"])
    async def fork(session_id: Session, body: ForkSession, who: Grant) -> Forked:
        """A new session continuing from this one's verified prefix (admin only)."""
        require_admin(who)
        if body.session_id is not None and await hub.known(body.session_id):
            await hub.create(session_id=body.session_id, model=None)  # raises: it exists
        made = await sessions.fork(session_id, at=body.at, session=body.session_id)
        model = await control.session_model(session_id) or hub.resolve_model(None)
        await control.bind_session(made.session_id, model=model, created_us=sessions.clock.now_us())
        await hub.forked(parent=session_id, child=made.session_id, model=model)
        hub.publish(made.session_id, (made.started,))
        return Forked(
            session_id=made.session_id, parent=session_id, high_water=made.parent.high_water
        )

    @app.get(
        "/v1/sessions/{session_id}/artifacts/{sha256}",
        tags=["events"],
        response_class=Response,
        responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}},
    )
    async def artifact(
        session_id: Session,
        sha256: Annotated[str, Path(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")],
    ) -> Response:
        """An artifact the session's log refers to (never another session's)."""
        media = None
        for event in await sessions.storage.log.read(session_id):
            body = event.body
            refs = (
                body.artifacts
                if isinstance(body, ToolResponded)
                else (body.artifact,)
                if isinstance(body, ArtifactStored)
                else ()
            )
            for ref in refs:
                if ref.sha256 == sha256:
                    media = ref.media_type
        if media is None:
            raise UsageError(
                f"session {session_id!r} refers to no artifact {sha256}",
                code="artifact_missing",
                session_id=session_id,
            )
        data = await sessions.storage.artifacts.get(sha256)
        # a tool's output, served on the API's own origin: never sniffed, never run as a
        # page (its scripts would reach the API with the timeline's cookie), saved instead
        inert = {
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox",
            "Content-Disposition": f'attachment; filename="{sha256}"',
        }
        return Response(data, media_type=media, headers=inert)

    # ------------------------------------------------------------ webhooks

    @app.post("/hooks/{name}", status_code=202, tags=["webhooks"])
    async def webhook(
        name: Annotated[str, Path(min_length=1, max_length=100)],
        request: Request,
        x_hub_signature_256: Annotated[str | None, Header(max_length=200)] = None,
        x_github_event: Annotated[str | None, Header(max_length=100)] = None,
    ) -> HookAccepted:
        """An external event as a message (signed with HMAC-SHA256: ``X-Hub-Signature-256:
        sha256=<hex>``; the delivery id is the idempotency key)."""
        hook = hooks.get(name)
        if hook is None:
            raise UsageError(f"no webhook named {name!r}", code="unknown_hook")
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise UsageError(
                f"webhook body of {len(raw)} bytes is over {MAX_BODY}", code="payload_too_large"
            )
        check_signature(hook, raw, x_hub_signature_256)
        delivery = delivery_id(request.headers)
        if hook.session is not None:
            sid = hook.session
            if not await hub.known(sid):
                await control.bind_session(
                    sid, model=hub.resolve_model(hook.model), created_us=sessions.clock.now_us()
                )
        else:
            sid = await control.delivery_session(name, delivery, new_session=sessions.ids.new_id())
            await control.bind_session(
                sid, model=hub.resolve_model(hook.model), created_us=sessions.clock.now_us()
            )
        text = raw.decode("utf-8", errors="replace")
        event = f" ({x_github_event})" if x_github_event else ""
        message, created = await hub.send(
            sid,
            key=f"{HOOK_KEY}{name}:{delivery}",
            text=f"webhook {name}{event}, delivery {delivery}:\n{text}",
        )
        return HookAccepted(session_id=sid, message=_message(message), created=created)

    # ------------------------------------------------------------ operations

    @app.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
    async def metrics_text(who: Grant) -> PlainTextResponse:
        """Prometheus text format (admin only)."""
        require_admin(who)
        text = metrics.render(pending_approvals=await hub.pending_count(), turns=hub.turns_run)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/timeline/{session_id}", response_class=HTMLResponse, tags=["timeline"])
    async def timeline(session_id: SessionId) -> HTMLResponse:
        """The timeline page (static; it asks the API for data with the token given in
        the URL fragment, which never reaches the server)."""
        page = resources.files("lodger.host").joinpath("timeline.html").read_text("utf-8")
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    return app
