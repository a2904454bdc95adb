"""Webhooks: an external event, signed with the hook's secret, becomes a message.

No bearer token here: the HMAC signature authenticates the request (``lodger.host.webhooks``
checks it). The delivery id is the message's idempotency key, so a redelivery runs nothing
again.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request
from pydantic import BaseModel

from lodger.errors import UsageError
from lodger.host.routes._deps import HostParts, Parts
from lodger.host.routes.messages import HOOK_KEY, MessageOut, message_out
from lodger.host.webhooks import MAX_BODY, HookConfig, check_signature, delivery_id

__all__ = ["HookAccepted", "router"]


class HookAccepted(BaseModel):
    session_id: str
    message: MessageOut
    created: bool


router = APIRouter()


@router.post("/hooks/{name}", status_code=202, tags=["webhooks"])
async def webhook(
    name: Annotated[str, Path(min_length=1, max_length=100)],
    request: Request,
    host: Parts,
    x_hub_signature_256: Annotated[str | None, Header(max_length=200)] = None,
    x_github_event: Annotated[str | None, Header(max_length=100)] = None,
) -> HookAccepted:
    """An external event as a message (signed with HMAC-SHA256: ``X-Hub-Signature-256:
    sha256=<hex>``; the delivery id is the idempotency key)."""
    hook = host.hooks.get(name)
    if hook is None:
        raise UsageError(f"no webhook named {name!r}", code="unknown_hook")
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise UsageError(
            f"webhook body of {len(raw)} bytes is over {MAX_BODY}", code="payload_too_large"
        )
    check_signature(hook, raw, x_hub_signature_256)
    delivery = delivery_id(request.headers)
    sid = await _session_for(host, name, hook, delivery)
    text = raw.decode("utf-8", errors="replace")
    event = f" ({x_github_event})" if x_github_event else ""
    message, created = await host.hub.send(
        sid,
        key=f"{HOOK_KEY}{name}:{delivery}",
        text=f"webhook {name}{event}, delivery {delivery}:\n{text}",
    )
    return HookAccepted(session_id=sid, message=message_out(message), created=created)


async def _session_for(host: HostParts, name: str, hook: HookConfig, delivery: str) -> str:
    """The hook's one session (bound on its first delivery), else the delivery's own: a new
    session the first time, the same one on every replay."""
    hub, control, sessions = host.hub, host.control, host.sessions
    if hook.session is not None:
        sid = hook.session
        if not await hub.known(sid):
            await control.bind_session(
                sid, model=hub.resolve_model(hook.model), created_us=sessions.clock.now_us()
            )
        return sid
    sid = await control.delivery_session(name, delivery, new_session=sessions.ids.new_id())
    await control.bind_session(
        sid, model=hub.resolve_model(hook.model), created_us=sessions.clock.now_us()
    )
    return sid
