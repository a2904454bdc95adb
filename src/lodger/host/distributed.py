"""The host in distributed mode: a front door to the control plane; workers run turns.

``ControlPlaneHub`` is the second implementation of the hub the app talks to. It runs
no turn: a send enqueues a wake in the control plane (``ControlPlane.send``) under the
client's idempotency key, so a key seen before returns the first message and wakes
nothing, whichever host got it first; a ``lodger worker`` claims the wake, runs the turn
and commits to the shared object store. Streams follow that store's log (the feed falls
back to reading the log every ``poll_s``, since nothing is committed in this process);
on a control plane that relays text (PostgreSQL), the workers' text deltas reach the
streams that take them (``lodger.runtime._worker_text``), and a delta makes its stream
read the facts committed before it at once.
Sessions are listed from the control plane's session index plus the log; approvals
asked by worker-run calls (``lodger.runtime.approvals``) are listed and answered in the
control plane, where a conditional update lets exactly one answer win.

Messages are wakes: a message id is the wake id and its status is the wake's
(``queued``, ``running``, ``done``). Idempotency keys are per session on the API and
stored in the control plane as ``host:<session>:<key>``. Tokens and webhook deliveries
are in the control plane too (``lodger.storage.control.shared_host_index``, which ``lodger serve``
uses), so several hosts share them; the host's own SQLite index keeps the model a session
was created with on it.

Decisions and abandons (which append facts outside a turn) take the session lease first,
so they never write while a worker runs the session (409 ``session_busy`` then). A
cancel and a permission-mode switch of a turn a worker runs are requests in the control
plane that the worker holding the session delivers (``lodger.runtime._worker_cancel``);
with no worker holding it they are committed here under the lease. Follow-up messages
queue in the control plane (``lodger.runtime._worker_queue``).
A question a waiting worker asked (``--approval-wait``) is live only while that worker
holds the session's lease: a worker that died leaves a question nobody can answer (409),
and the resumed turn asks anew. A parked one (``--approval-park``) is live until its own
expiry, or until its turn is abandoned (``abandoned`` withdraws it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, cast

from lodger.engine.control import CancelOutcome
from lodger.engine.queue import QueuedMessage, Steered, check_message
from lodger.errors import HostConflictError, SessionNotFoundError, UsageError
from lodger.events import QueuePolicy
from lodger.host.feed import Feeds
from lodger.host.hub import URGENT, EventObserver, HostConfig, Hub, busy_refusal
from lodger.media import WAKE_MEDIA_PREFIX, MediaItem, store_media, wake_message
from lodger.providers.base import ModelSettings
from lodger.runtime._session_control import ModeOutcome, check_mode
from lodger.runtime._worker_cancel import ask_worker_to_cancel, ask_worker_to_switch
from lodger.runtime.rewind import RewindResult
from lodger.runtime.sessions import Sessions
from lodger.runtime.worker import newest_snapshot
from lodger.storage import check_session_id
from lodger.storage.control.host_index import (
    Approval,
    ApprovalStatus,
    HostControl,
    Message,
    MessageKind,
    MessageStatus,
    answered_already,
    no_such_approval,
)
from lodger.storage.control.interface import (
    ApprovalRequest,
    ControlPlane,
    QueuedRow,
    SessionRow,
    TextNotices,
    TextPiece,
    WakeInfo,
)
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace
from lodger.tools.mcp import McpInput

__all__ = ["ControlPlaneHub", "host_key"]

#: how long the host holds a session's lease while it appends a decision
_LEASE_TTL_S = 30.0
#: how often a mode switch is asked again when the worker let the session go first
_MODE_TRIES = 3


def host_key(session_id: str, key: str) -> str:
    """The control plane's idempotency key for a session's API key."""
    return f"host:{session_id}:{key}"


def _refuse_unsendable(
    session_id: str, text: str, *, settings: ModelSettings | None, mcp: McpInput | None
) -> None:
    """What a worker's wake cannot carry (it takes text and media only), refused."""
    if mcp is not None:
        # reading the resources on the worker, once per delivery, is not done yet
        raise UsageError(
            "a distributed host does not take MCP resources or prompts per message yet",
            hint="send the text, and let the model read resources with <server>__read_resource",
            code="usage",
            session_id=session_id,
        )
    if settings is not None:
        raise UsageError(
            "a distributed host does not take model_settings per message yet",
            hint="set [model_settings] in the project's lodger.toml (workers compose it)",
            code="model_settings",
            session_id=session_id,
        )
    if text.startswith(WAKE_MEDIA_PREFIX):
        # the line by which a wake says it carries media is the host's own
        raise UsageError(
            f"a message may not start with {WAKE_MEDIA_PREFIX!r}",
            hint="send images and documents as attachments",
            code="usage",
            session_id=session_id,
        )


class ControlPlaneHub(Hub):
    def __init__(
        self,
        sessions: Sessions,
        control: HostControl,
        plane: ControlPlane,
        config: HostConfig,
        *,
        feeds: Feeds | None = None,
        observers: Sequence[EventObserver] = (),
    ) -> None:
        super().__init__(sessions, control, config, feeds=feeds, observers=observers)
        self.plane = plane
        self.holder = f"host:{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"
        self._pending = 0
        self._text: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self, group: asyncio.TaskGroup) -> None:
        self._group = group  # nothing to adopt: turns run in workers
        if isinstance(self.plane, TextNotices):  # the workers' text deltas, for streams
            self._text = group.create_task(self.plane.listen_text(self._worker_text))

    async def stop(self) -> None:
        if self._text is not None:
            self._text.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._text
            self._text = None
        self._group = None

    def _worker_text(self, piece: TextPiece) -> None:
        self.feeds.publish_text(
            piece.session_id, piece.turn_id, piece.step_id, piece.text, after=piece.after
        )

    # ------------------------------------------------------------ sessions

    async def create(self, *, session_id: str | None, model: str | None) -> str:
        if session_id is not None:
            check_session_id(session_id)
            if await self.plane.get_session(session_id=session_id) is not None:
                # known to the workers (lodger send made it): bind nothing here
                raise HostConflictError(
                    f"session {session_id!r} exists already",
                    hint="pick another id, or leave it out to get a fresh one",
                    code="session_exists",
                    session_id=session_id,
                )
        sid = await super().create(session_id=session_id, model=model)
        spec = await self.control.session_model(sid)
        await self.plane.record_session(
            row=SessionRow(
                session_id=sid, status="created", last_activity=await self.plane.now(), model=spec
            )
        )
        return sid

    async def forked(self, *, parent: str, child: str, model: str) -> None:
        """Index the fork now, not with its first message: every host and worker knows
        it and its model, and a worker wakes it in a copy of the parent's workspace (the
        parent's last snapshot)."""
        row = await self.plane.get_session(session_id=parent)
        await self.plane.record_session(
            row=SessionRow(
                session_id=child,
                status="created",
                last_activity=await self.plane.now(),
                model=model,
                snapshot=row.snapshot if row is not None else None,
            )
        )

    async def known(self, session_id: str) -> bool:
        check_session_id(session_id)
        if await self.plane.get_session(session_id=session_id) is not None:
            return True
        return await super().known(session_id)

    async def list_sessions(self) -> list[str]:
        found = set(await super().list_sessions())
        found.update(row.session_id for row in await self.plane.list_sessions())
        return sorted(found)

    async def busy(self, session_id: str) -> bool:
        """Work is queued or running for the session (a due or claimed wake)."""
        now = await self.plane.now()
        return any(w.due_at <= now for w in await self.plane.pending_wakes(session_id=session_id))

    def running(self, session_id: str) -> bool:
        return False  # this process runs nothing; see ``busy``

    # ------------------------------------------------------------ sending

    async def send(
        self,
        session_id: str,
        *,
        key: str,
        text: str,
        kind: MessageKind = "message",
        media: Sequence[MediaItem] = (),
        settings: ModelSettings | None = None,
        mcp: McpInput | None = None,
        policy: QueuePolicy = "enqueue",
    ) -> tuple[Message, bool]:
        """A wake for a worker (the message's id is the wake's). ``reject`` is refused
        while the session has work; ``interrupt``/``rollback`` make an urgent wake (run
        before the session's other waiting ones) and ask the worker running the session
        to stop its turn (a ``session_cancels`` request with that policy)."""
        _refuse_unsendable(session_id, text, settings=settings, mcp=mcp)
        if policy == "reject" and await self.busy(session_id):
            raise busy_refusal(session_id)
        await self.require(session_id)
        if media:  # stored where the workers read them, before the wake names them
            attachments = await store_media(media, self.sessions.storage.artifacts, {})
            text = wake_message(text, attachments)
        if await self.plane.get_session(session_id=session_id) is None:
            # bound here only (a webhook's session): tell the workers its model
            spec = await self.control.session_model(session_id)
            if spec is not None:
                await self.plane.record_session(
                    row=SessionRow(
                        session_id=session_id,
                        status="created",
                        last_activity=await self.plane.now(),
                        model=spec,
                    )
                )
        body = text if kind == "message" else None  # a plain wake resumes what is open
        if (
            policy in URGENT
            and await self.plane.wake_for_key(idempotency_key=host_key(session_id, key)) is None
        ):
            # the turn running now (if any) stops for it: asked before the wake exists,
            # so the stop can never reach the turn of this message itself
            await self.plane.request_cancel(
                session_id=session_id, who=None, reason=f"message for key {key}", policy=policy
            )
        wake_id = await self.plane.send(
            session_id=session_id,
            message=body,
            idempotency_key=host_key(session_id, key),
            urgent=policy in URGENT,
        )
        if wake_id is not None:
            info = await self.plane.get_wake(wake_id=wake_id)
            assert info is not None
            return _message(info), True
        first = await self.plane.wake_for_key(idempotency_key=host_key(session_id, key))
        if first is None or first.wake.message != body:
            raise HostConflictError(
                f"idempotency key {key!r} of session {session_id!r} was used for another request",
                hint="use a new key for a new message",
                code="idempotency_conflict",
                session_id=session_id,
            )
        return _message(first), False

    def wake(self, session_id: str) -> None:
        raise UsageError("a distributed host runs no turns; workers do", code="usage")

    async def message(self, session_id: str, message_id: int) -> Message | None:
        info = await self.plane.get_wake(wake_id=message_id)
        if info is None or info.wake.session_id != session_id:
            return None
        return _message(info)

    # ------------------------------------------------------------ writes outside turns

    @asynccontextmanager
    async def exclusive(self, session_id: str) -> AsyncIterator[None]:
        lease = await self.plane.acquire_session(
            session_id=session_id, holder=self.holder, ttl_s=_LEASE_TTL_S
        )
        if lease is None:
            raise HostConflictError(
                f"session {session_id!r} is running in a worker",
                hint="wait until its turn settles (follow the stream), then try again",
                code="session_busy",
                session_id=session_id,
            )
        try:
            yield
        finally:
            await self.plane.release_session(lease=lease)

    # ------------------------------------------------------------ approvals

    # ------------------------------------------------------------ steering

    async def steer(self, session_id: str, text: str, *, who: str) -> Steered:
        """Through the control plane: the worker holding the session commits it into its
        running turn; with none holding it, it is a wake (the session's next message)."""
        await self.require(session_id)
        check_message(text)
        steer_id = self.sessions.ids.new_id()
        held = await self.plane.add_steer(
            session_id=session_id, steer_id=steer_id, text=text, who=who
        )
        return Steered(steer_id=steer_id, status="steer" if held else "queued", offset=None)

    async def enqueue(self, session_id: str, text: str, *, policy: str, who: str) -> QueuedRow:
        """A follow-up in the control plane's queue (``lodger.runtime._worker_queue``):
        the worker holding the session takes it (at once for interrupt and rollback,
        which stop its turn); a dormant session is woken for it."""
        await self.require(session_id)
        checked = check_message(text, policy)
        await self._need_log(session_id)
        made, _ = await self.plane.add_queued(
            session_id=session_id,
            message_id=self.sessions.ids.new_id(),
            text=text,
            policy=checked,
            who=who,
            refuse_busy=checked == "reject",
        )
        if made is None:
            raise busy_refusal(session_id)
        return made

    async def _need_log(self, session_id: str) -> None:
        if not await self._logged(session_id):  # as the embedded host: no turn yet
            raise SessionNotFoundError(
                f"no log for session {session_id!r}",
                hint="send its first message (POST .../messages); queue follow-ups after it",
                session_id=session_id,
            )

    async def queue(self, session_id: str) -> list[QueuedMessage | QueuedRow]:
        """What a worker committed to the log but has not run yet, then the control
        plane's queue, in the order they run."""
        await self.require(session_id)
        logged = await self.sessions.queue(session_id) if await self._logged(session_id) else []
        ids = {m.message_id for m in logged}
        rows = await self.plane.list_queued(session_id=session_id)
        return [*logged, *(r for r in rows if r.message_id not in ids)]

    async def change_queued(
        self,
        session_id: str,
        message_id: str,
        action: Literal["edit", "move", "retract"],
        *,
        text: str | None = None,
        position: int | None = None,
        who: str,
    ) -> list[QueuedMessage | QueuedRow]:
        """Edit, move or retract a message the control plane holds; one a worker already
        committed to the log is changed in the log while no worker holds the session
        (409 ``session_busy`` while one does). A position counts the whole queue."""
        await self.require(session_id)
        if action == "edit":
            check_message(text or "")
        if action == "move" and (type(position) is not int or position < 0):
            raise UsageError("a move needs a position of 0 or more", code="usage")
        ahead = [m for m in await self.queue(session_id) if isinstance(m, QueuedMessage)]
        if any(m.message_id == message_id for m in ahead):
            async with self.exclusive(session_id):
                await self.sessions.change_queued(
                    session_id, message_id, action, text=text, position=position, who=who
                )
            return await self.queue(session_id)
        changed = await self.plane.change_queued(
            session_id=session_id,
            message_id=message_id,
            action=action,
            who=who,
            text=text,
            position=None if position is None else max(0, position - len(ahead)),
        )
        if changed is None:
            raise UsageError(
                f"no message {message_id!r} waits in the queue of session {session_id!r}",
                hint="list the queue: a message leaves it once delivered or retracted",
                code="not_queued",
                session_id=session_id,
            )
        return await self.queue(session_id)

    async def approvals(self, *, session_id: str | None = None) -> list[Approval]:
        found = [_approval(a) for a in await self.plane.list_approvals(session_id=session_id)]
        if session_id is None:
            self._pending = len(found)
        return found

    async def pending_count(self) -> int:
        return len(await self.approvals())

    async def abandoned(self, session_id: str) -> None:
        """Withdraw the questions of the abandoned turn's parked calls: no run will ask
        for their answers (an answer now is 409 ``already_answered``). Messages that
        waited for that turn to settle are due now."""
        await self.plane.withdraw_approvals(session_id=session_id)
        await self.plane.release_held_wakes(session_id=session_id)

    async def decided(self, session_id: str) -> None:
        """A worker held the session's wakes back for an operator's decision: they are
        due now (a worker resumes, or holds them again if more decisions are needed)."""
        await self.plane.release_held_wakes(session_id=session_id)

    def waiting(self) -> int:
        return self._pending

    async def answer(
        self, session_id: str, call_id: str, *, allow: bool, by: str, always: bool = False
    ) -> Approval:
        if always:  # the control plane records allow or deny; a worker would ask again
            raise UsageError(
                "a distributed host answers allow or deny, not always",
                hint="answer allow (once), or add an allow rule to the project's lodger.toml",
                code="usage",
            )
        found, won = await self.plane.answer_approval(
            session_id=session_id, call_id=call_id, allow=allow, by=by
        )
        if found is None:
            raise no_such_approval(session_id, call_id)
        if not won:
            raise answered_already(session_id, call_id, found.status)
        return _approval(found)

    # ------------------------------------------------------------ session control

    async def set_permission_mode(
        self, session_id: str, mode: str, *, who: str | None
    ) -> ModeOutcome:
        """While a worker runs the session's turn, through the control plane
        (``session_modes``): that worker commits it through the turn, effective from
        its next step, and this waits for its answer. With none holding the session it
        is committed here under the session's lease."""
        checked = check_mode(mode)
        for _ in range(_MODE_TRIES):
            asked = await ask_worker_to_switch(self.plane, session_id, checked, who=who)
            if asked is not None:
                return asked
            try:
                return await super().set_permission_mode(session_id, checked, who=who)
            except HostConflictError as exc:
                if exc.code != "session_busy":
                    raise  # else a worker took the session meanwhile: ask it
        raise HostConflictError(
            f"session {session_id!r} is running in a worker that did not take the switch",
            hint="try again; the worker takes switches while its turn runs",
            code="session_busy",
            session_id=session_id,
        )

    async def rewind(self, session_id: str, **point: Any) -> RewindResult:
        """A worker-run session's workspace lives in its snapshots: under the session's
        lease, its newest snapshot is restored into a scratch directory, the rewind puts
        that directory back to the point's view, and its snapshot becomes the one the
        next worker wakes the session in (the session index's)."""
        storage = self.sessions.storage
        async with self.exclusive(session_id):
            row = await self.plane.get_session(session_id=session_id)
            state = (
                await self.sessions.state(session_id) if await self._logged(session_id) else None
            )
            start = newest_snapshot(state, row)
            scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="lodger-rewind-"))
            try:
                if start is not None:
                    await restore_snapshot(start, storage.artifacts, scratch)
                done = await self.sessions.rewind(session_id, workspace=scratch, **point)
                taken = await snapshot_workspace(scratch, storage.artifacts)
                now = await self.sessions.state(session_id)
                await self.plane.record_session(
                    row=SessionRow(
                        session_id=session_id,
                        status=row.status if row is not None else "idle",
                        last_activity=await self.plane.now(),
                        events=len(now.events),  # the log holds no newer snapshot
                        snapshot=taken.ref,
                        model=row.model if row is not None else None,
                    )
                )
            finally:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
        return done

    async def cancel(self, session_id: str, *, who: str | None, reason: str) -> CancelOutcome:
        """Ask the worker that holds the session to cancel its turn (through the control
        plane's ``session_cancels``), and wait a while for its answer. With no worker
        holding it, an open turn (parked, interrupted) is ended cancelled here, under
        the session's lease; its parked questions are withdrawn."""
        done = await ask_worker_to_cancel(self.plane, session_id, who=who, reason=reason)
        if done.status != "not_running" or not await self._logged(session_id):
            return done
        async with self.exclusive(session_id):
            done = await self.sessions.cancel(session_id, who=who, reason=reason)
        if done.status == "cancelled":
            await self.abandoned(session_id)  # nothing of that turn waits any more
        return done


def _message(info: WakeInfo) -> Message:
    wake = info.wake
    prefix = host_key(wake.session_id, "")
    key = info.idempotency_key or ""
    key = key.removeprefix(prefix) if key.startswith(prefix) else key
    status = info.status if info.status in ("queued", "running", "done", "failed") else "queued"
    result = None
    if info.error is not None:  # a worker gave up on it: say why, as the embedded host does
        code, _, text = info.error.partition(": ")
        result = {"error": {"code": code, "message": text or code}}
    return Message(
        id=wake.id,
        session_id=wake.session_id,
        key=key,
        kind="message" if wake.message is not None else "resume",
        text=wake.message or "",
        status=cast(MessageStatus, status),
        start_offset=wake.started_offset,
        result=result,
    )


def _approval(found: ApprovalRequest) -> Approval:
    status = found.status if found.status in ("pending", "allow", "deny", "expired") else "expired"
    return Approval(
        session_id=found.session_id,
        call_id=found.call_id,
        tool=found.tool,
        summary=found.summary,
        status=cast(ApprovalStatus, status),
        answered_by=found.answered_by,
        created_us=int(found.asked_at * 1_000_000),
    )
