"""What the protocol stream routes share: where a turn's stream starts, the moves of one
turn from the session's stream, and answers to approvals given in a protocol's terms.

A chat-style request starts a turn as a message (its idempotency key made from the
client's own message id, so a retried request runs nothing twice), then streams that
turn from the offset its message started at. A request that answers approvals continues
the open turn's stream from just after the first answered question
(``continuation``); the client's own view of the calls (which it knows, which it has
results of) keeps anything from being told twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from fastapi import Request

from lodger.errors import HostConflictError, LodgerError, UsageError
from lodger.events import PermissionRequested
from lodger.host.adapters.turn import Move, TurnMoves
from lodger.host.routes._deps import HostParts
from lodger.host.routes.events import live_items

__all__ = [
    "Continuation",
    "answer_approvals",
    "continuation",
    "message_start",
    "message_started",
    "open_turn_start",
    "turn_moves",
]

#: how far back from the head a continuation looks for the question it answers
_LOOK_BACK = 5000
#: how often a chat request looks whether its message has started
_START_POLL_S = 0.05
#: how long an answer waits for a question whose fact came to be recorded as asked
_RECORDED_WITHIN_S = 5.0


async def open_turn_start(host: HostParts, session_id: str) -> int | None:
    """The offset of the session's open turn's ``turn_started``, or None."""
    if not await host.sessions.storage.log.exists(session_id):
        return None
    return (await host.sessions.state(session_id)).open_turn_offset


async def message_start(host: HostParts, session_id: str, message_id: int) -> int | LodgerError:
    """The offset the message started running at, once it has; the error it failed
    with if it failed first."""
    while True:
        found = await host.hub.message(session_id, message_id)
        if found is None:
            return UsageError(
                f"session {session_id!r} has no message {message_id}", code="not_found"
            )
        if found.start_offset is not None:
            return found.start_offset
        if found.status == "failed":
            error = (found.result or {}).get("error") or {}
            return UsageError(str(error.get("message", "the message failed")), code="lodger_error")
        await asyncio.sleep(_START_POLL_S)


async def message_started(
    host: HostParts, session_id: str, message_id: int
) -> AsyncIterator[int | LodgerError | None]:
    """``message_start``'s answer as the last item, after a None whenever it took
    ``heartbeat_s`` more (the caller sends a ping: a queued message may wait long)."""
    task = asyncio.ensure_future(message_start(host, session_id, message_id))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=host.heartbeat_s)
            if done:
                yield task.result()
                return
            yield None
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass(frozen=True)
class Continuation:
    """Where the stream of a turn goes on after its questions were answered."""

    turn_id: str
    start: int


async def continuation(host: HostParts, session_id: str, call_ids: Iterable[str]) -> Continuation:
    """Just after the first ``permission_requested`` of ``call_ids`` (in the last
    ``_LOOK_BACK`` facts): the stream that ended with those questions goes on there."""
    wanted = set(call_ids)
    log = host.sessions.storage.log
    head = (await log.head(session_id)).high_water
    for event in await log.read(session_id, start=max(0, head - _LOOK_BACK), end=head):
        if (
            isinstance(event.body, PermissionRequested)
            and event.call_id in wanted
            and event.turn_id is not None
        ):
            return Continuation(event.turn_id, event.offset + 1)
    raise UsageError(
        f"session {session_id!r} asked no recent question about calls {sorted(wanted)}",
        hint="answer an approval the stream asked for (its approvalId or interrupt id)",
        code="not_found",
        session_id=session_id,
    )


async def answer_approvals(
    host: HostParts, request: Request, session_id: str, answers: Iterable[tuple[str, bool]]
) -> None:
    """Answer each ``(call_id, allow)``; one answered already (a retried request, or
    another client first) is left as it is."""
    by = host.auth.who(request)
    for call_id, allow in answers:
        await _answer(host, session_id, call_id, allow=allow, by=by)


async def _answer(host: HostParts, session_id: str, call_id: str, *, allow: bool, by: str) -> None:
    # a worker records its question just after the fact that asks it commits, and a
    # front end can answer from the fact: a question not recorded yet is looked for again
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _RECORDED_WITHIN_S
    while True:
        try:
            await host.hub.answer(session_id, call_id, allow=allow, by=by)
            return
        except HostConflictError as exc:
            if exc.code != "already_answered":
                raise
            return
        except UsageError as exc:
            if exc.code != "no_such_call" or loop.time() > deadline:
                raise
        await asyncio.sleep(_START_POLL_S)


async def turn_moves(
    host: HostParts, session_id: str, *, start: int, moves: TurnMoves
) -> AsyncIterator[list[Move] | None]:
    """The moves of the followed turn from offset ``start`` (facts and deltas), a None
    whenever nothing came for the heartbeat, until the turn's stream ends."""
    items = live_items(host, session_id, start=start, follow=True, deltas=True)
    try:
        async for item in items:
            if item is None:
                yield None
                continue
            found = moves.take(item)
            if found:
                yield found
            if moves.done:
                return
    finally:
        await items.aclose()
