"""The HTTP API of the host: sessions, messages, live event streams, approvals, recovery.

``create_app(sessions, control, config)`` builds a FastAPI app whose generated OpenAPI
document (``docs/openapi.json``) is the contract. Every route needs a bearer token
(``lodger.host.auth``) except the timeline page's static files (which hold no data) and
webhooks (authenticated by their HMAC signature). Every refusal is a 4xx whose body
carries the engine's error code and next steps (``lodger.host.errors``).

The routes live in ``lodger.host.routes``, one module per resource; this module composes
them with the hub, the error handlers and the middleware that bound and count requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lodger.errors import LodgerError, UsageError
from lodger.host.auth import Authenticator
from lodger.host.errors import ErrorBody, error_body, status_for
from lodger.host.feed import Feeds
from lodger.host.hub import EventObserver, HostConfig, Hub
from lodger.host.limits import BodyLimit, body_limit
from lodger.host.metrics import HostMetrics
from lodger.host.routes import ROUTERS, HostParts
from lodger.host.webhooks import HookConfig
from lodger.runtime.sessions import Sessions
from lodger.storage.control.host_index import HostControl
from lodger.storage.control.interface import ControlPlane

__all__ = ["API_VERSION", "create_app"]

API_VERSION = "1"

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for status, why in (
        (400, "bad input (the engine's error code says what)"),
        (401, "no token, or an unknown one"),
        (403, "the token's scope does not cover this"),
        (404, "no such session, call, message, artifact or model"),
        (
            409,
            "a conflict with the session's state: answered already, key reused, busy, blocked, "
            "or a fork past its head",
        ),
        (413, "the request body is too large"),
        (422, "the request does not match the schema"),
    )
}


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
    metrics = HostMetrics()
    feeds = Feeds(sessions.storage.log, poll_s=poll_s)
    observing = (metrics.observe, *observers)
    hub = _hub(sessions, control, config or HostConfig(), plane, feeds, observing)
    auth = Authenticator(control)
    app = FastAPI(
        title="lodger host",
        version=API_VERSION,
        description="Durable agent sessions over HTTP: send messages, stream committed "
        "facts (resumable by offset), answer approvals, recover, decide, resume, fork.",
        lifespan=_lifespan(hub, on_started),
        responses=_ERRORS,
    )
    _install_openapi(app)
    # what the routes use (lodger.host.routes._deps); hub, auth and metrics stay on the
    # state by name too, for callers that reach in
    app.state.host = HostParts(
        sessions=sessions,
        control=control,
        hub=hub,
        feeds=feeds,
        metrics=metrics,
        auth=auth,
        hooks=hooks or {},
        heartbeat_s=heartbeat_s,
    )
    app.state.hub, app.state.auth, app.state.metrics = hub, auth, metrics
    app.exception_handler(LodgerError)(_lodger_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(StarletteHTTPException)(_http_error)
    # a body without a Content-Length is read here, bounded, before any route sees it
    app.add_middleware(BodyLimit, limit_for=body_limit)
    app.middleware("http")(_counting(metrics))  # outermost: it sees every answer
    for router in ROUTERS:
        app.include_router(router)
    return app


def _hub(
    sessions: Sessions,
    control: HostControl,
    config: HostConfig,
    plane: ControlPlane | None,
    feeds: Feeds,
    observers: tuple[EventObserver, ...],
) -> Hub:
    if plane is None:
        return Hub(sessions, control, config, feeds=feeds, observers=observers)
    # distributed: workers run the turns (lodger.host.distributed)
    from lodger.host.distributed import ControlPlaneHub

    return ControlPlaneHub(sessions, control, plane, config, feeds=feeds, observers=observers)


def _lifespan(
    hub: Hub, on_started: Callable[[Hub], Awaitable[None]] | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The hub runs in a task group for as long as the app serves."""

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

    return lifespan


def _install_openapi(app: FastAPI) -> None:
    """Serve the document with ``ErrorBody`` in its schemas: every error body, on every
    route, whatever the route's own media type."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            errors = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(errors.pop("$defs", {}))
            schemas["ErrorBody"] = errors
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# ---------------------------------------------------------------- errors


async def _lodger_error(request: Request, exc: LodgerError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=status_for(exc))


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
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


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if exc.status_code == 404 else "invalid_request"
    error = UsageError(str(exc.detail), code=code)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed(request)
    return JSONResponse(error_body(error), status_code=exc.status_code, headers=headers)


def _allowed(request: Request) -> str:
    """The methods of every route on the request's path (RFC 9110's ``Allow`` of a 405):
    routing names only the first route it found there, one method of several."""
    routes = [*request.app.router.routes, *(r for router in ROUTERS for r in router.routes)]
    path = request.scope["path"]
    methods: set[str] = set()
    for route in routes:
        regex, named = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and named and regex.match(path):
            methods.update(named)
    return ", ".join(sorted(methods))


def _counting(metrics: HostMetrics) -> Callable[[Request, Any], Awaitable[Response]]:
    """The middleware that counts every request by its route's path, and refuses a
    declared Content-Length over its ``body_limit`` before anything is read."""

    async def count(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length", "0")
        limit = body_limit(request.method, request.url.path)
        if not length.isdigit() or int(length) > limit:
            error = UsageError(
                f"a request body may hold at most {limit} bytes",
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

    return count
