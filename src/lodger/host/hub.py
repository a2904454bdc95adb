"""The hub: what runs hosted sessions in the background.

A send queues a message in the control index (once per idempotency key) and wakes the
session's runner: one task per session with work, owned by the hub's task group, that
runs the session's queued messages one turn at a time (one writer per session). Every
fact a run commits is published to the session's feed (live streams) and to the
observers (metrics, traces) in commit order.

Approvals: in a hosted run the permission gate's ``Approver`` parks the call in the
control index and waits; an answer from any client (``answer``) decides it once: the
index lets one answer win and the others get a conflict. The ``permission_requested``
fact the gate commits just before asking tells which call is asked about: it is observed
in the call's own task, which then asks, so a context variable carries the call id.

After a crash: messages that were running are looked up in the log. A turn that never
started runs again; an open turn is resumed (a resume, not a retry); a settled turn is
marked done. Pending approvals of the dead process are marked expired (the resume asks
again).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.control import CancelOutcome
from lodger.engine.envelope import streaming_envelope
from lodger.engine.loop import TurnResult
from lodger.engine.modelsettings import settings_from_mapping
from lodger.engine.permissions import Answered
from lodger.engine.queue import QueuedMessage, Steered, StopRequest
from lodger.errors import (
    HostConflictError,
    LodgerError,
    SessionLockedError,
    SessionNotFoundError,
    UsageError,
)
from lodger.events import Event, QueuePolicy, TurnStarted
from lodger.host.elicitations import ElicitationInbox
from lodger.host.feed import Feeds
from lodger.media import (
    MediaItem,
    UserInput,
    attached_input,
    media_message,
    parse_media_message,
    store_media,
)
from lodger.providers.base import ModelSettings
from lodger.runtime._session_control import ModeOutcome
from lodger.runtime.composition import Overrides, compose
from lodger.runtime.project import Project
from lodger.runtime.rewind import RewindResult, open_branch
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import check_session_id
from lodger.storage.control.host_index import Approval, HostControl, Message, MessageKind
from lodger.storage.control.interface import QueuedRow
from lodger.substrates.codemode import Language
from lodger.tools._mcp_content import decode_input, encode_input
from lodger.tools.mcp import McpInput
from lodger.tools.spec import Tool

__all__ = ["URGENT", "HostConfig", "Hub", "busy_refusal"]

_log = logging.getLogger("lodger.host")
#: how often, and how far apart, a message's run is tried while another writer holds its
#: session (nothing is committed by a run that finds the session locked)
_LOCKED_TRIES = 40
_LOCKED_WAIT_S = 0.25

EventObserver = Callable[[Event], None]

# The call the permission gate is asking about, set in the call's task when its
# ``permission_requested`` fact commits (see the module docstring).
_ASKING: contextvars.ContextVar[str | None] = contextvars.ContextVar("lodger_asking", default=None)


@dataclass(frozen=True, kw_only=True)
class HostConfig:
    """What every hosted session runs with."""

    #: model specs a session may use; the first is the default
    models: tuple[str, ...] = ("test",)
    #: tools bound in every session besides the workspace tools
    tools: Sequence[Tool] = ()
    #: each session works in ``<workspaces>/<session id>`` with the workspace tools
    workspaces: Path | None = None
    code_mode: Language | None = None
    max_steps: int = 50
    #: usage limits and money budgets of every session (over its lodger.toml's)
    usage: UsageLimits | None = None
    budgets: Budgets | None = None
    #: apply the whole lodger.toml found in a session's workspace (its MCP servers,
    #: allow rules, sandbox network); otherwise only what narrows (lodger.runtime.project)
    trust_projects: bool = False


@dataclass
class _Asked:
    """A call waiting for an approval in this process."""

    future: asyncio.Future[Answered]
    parked: asyncio.Event = field(default_factory=asyncio.Event)


class Hub:
    def __init__(
        self,
        sessions: Sessions,
        control: HostControl,
        config: HostConfig,
        *,
        feeds: Feeds | None = None,
        observers: Sequence[EventObserver] = (),
    ) -> None:
        self.sessions = sessions
        self.control = control
        self.config = config
        self.feeds = feeds or Feeds(sessions.storage.log)
        self.observers = list(observers)
        self._group: asyncio.TaskGroup | None = None
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._asked: dict[tuple[str, str], _Asked] = {}
        #: MCP servers' questions to a person from this process's runs
        self.elicitations = ElicitationInbox()
        self.turns_run = 0

    # ------------------------------------------------------------ lifecycle

    async def start(self, group: asyncio.TaskGroup) -> None:
        """Adopt the work a previous process left, then run it in ``group``."""
        self._group = group
        await self.control.expire_pending()
        for message in await self.control.messages(status="running"):
            await self._adopt(message)
        for message in await self.control.messages(status="queued"):
            self.wake(message.session_id)

    async def stop(self) -> None:
        """Cancel every runner and wait for each to settle (a cancelled turn records
        what it left running; nothing is abandoned silently)."""
        tasks = list(self._runners.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._group = None

    async def _adopt(self, message: Message) -> None:
        """A message that was running when the previous process died."""
        events = await self.sessions.storage.log.read(message.session_id)
        started = [
            e
            for e in events
            if isinstance(e.body, TurnStarted) and e.offset >= (message.start_offset or 0)
        ]
        if not started:
            await self.control.requeue(message.id, kind=message.kind)  # it never started
            return
        state = await self.sessions.state(message.session_id)
        if state.open_turn is not None:
            await self.control.requeue(message.id, kind="resume")  # resume, never retry
            return
        await self.control.finish_message(
            message.id,
            status="done",
            result={"status": state.last_turn_status, "adopted": True},
        )

    # ------------------------------------------------------------ sessions

    def resolve_model(self, spec: str | None) -> str:
        if spec is None:
            return self.config.models[0]
        if spec not in self.config.models:
            raise UsageError(
                f"model {spec!r} is not offered by this host",
                hint="use one of: " + ", ".join(self.config.models),
                code="model_not_allowed",
            )
        return spec

    async def forked(self, *, parent: str, child: str, model: str) -> None:
        """A fork of ``parent`` was made over the API (nothing more to do here: the fork's
        log is its whole state)."""

    async def create(self, *, session_id: str | None, model: str | None) -> str:
        spec = self.resolve_model(model)
        sid = session_id or self.sessions.ids.new_id()
        check_session_id(sid)
        if await self.sessions.storage.log.exists(sid) or not await self.control.bind_session(
            sid, model=spec, created_us=self.sessions.clock.now_us()
        ):
            raise HostConflictError(
                f"session {sid!r} exists already",
                hint="pick another id, or leave it out to get a fresh one",
                code="session_exists",
                session_id=sid,
            )
        return sid

    async def known(self, session_id: str) -> bool:
        check_session_id(session_id)
        if await self.control.session_model(session_id) is not None:
            return True
        return await self.sessions.storage.log.exists(session_id)

    async def require(self, session_id: str) -> None:
        if not await self.known(session_id):
            raise SessionNotFoundError(
                f"no session {session_id!r} on this host",
                hint="list the sessions to find the id",
                session_id=session_id,
            )

    async def list_sessions(self) -> list[str]:
        found = set(await self.sessions.list_sessions())
        found.update(await self.control.bound_sessions())
        return sorted(found)

    def running(self, session_id: str) -> bool:
        return session_id in self._runners

    async def busy(self, session_id: str) -> bool:
        """Whether a turn of the session is running (or queued to run) now."""
        return self.running(session_id)

    async def message(self, session_id: str, message_id: int) -> Message | None:
        return await self.control.message(session_id, message_id)

    @contextlib.asynccontextmanager
    async def exclusive(self, session_id: str) -> AsyncIterator[None]:
        """Held while the host appends facts outside a turn (decide, abandon). Here the
        log's own writer lock suffices; the distributed hub takes the session lease."""
        yield

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
        """Queue ``text`` (once per ``key``) and wake the session's runner. ``media``
        (checked by the caller) are stored as artifacts first; the queued message names
        them, so the turn runs with them whenever it runs; it asks the model with
        ``settings`` over the project's. ``mcp`` names MCP resources and a prompt the
        turn starts from (its text is ``text``). ``policy`` as the follow-up queue's:
        ``reject`` is refused while the session has work; ``interrupt`` and
        ``rollback`` stop the running turn (as the queue's do) and run before the
        session's other waiting messages."""
        await self.require(session_id)
        if policy == "reject" and await self.busy(session_id):
            raise busy_refusal(session_id)
        if mcp is not None:
            text = encode_input(mcp)
        if media:
            attachments = await store_media(media, self.sessions.storage.artifacts, {})
            text, kind = media_message(text, attachments), "media"
        message, created = await self.control.submit(
            session_id,
            key=key,
            kind=kind,
            text=text,
            created_us=self.sessions.clock.now_us(),
            settings=settings.record() if settings is not None else None,
            urgent=policy in URGENT,
        )
        if created:
            if policy in URGENT:
                running = self.sessions.turns.of_session(session_id)
                if running is not None:
                    running.request_stop(StopRequest(message_id=str(message.id), policy=policy))
            self.wake(session_id)
        return message, created

    def wake(self, session_id: str) -> None:
        self._dirty.add(session_id)
        if session_id in self._runners:
            return
        if self._group is None:
            raise UsageError("the host is not running", code="usage")
        self._runners[session_id] = self._group.create_task(
            self._runner(session_id), name=f"lodger-host-{session_id}"
        )

    async def _runner(self, session_id: str) -> None:
        try:
            while True:
                self._dirty.discard(session_id)
                if await self._run_followup(session_id):
                    continue  # a message queued while the last turn ran goes first
                message = await self.control.next_message(session_id)
                if message is None:
                    if session_id in self._dirty:
                        continue  # woken while we looked
                    return
                await self._run_message(message)
        finally:
            self._runners.pop(session_id, None)

    async def _run_message(self, message: Message) -> None:
        sid = message.session_id
        head = (await self.sessions.storage.log.head(sid)).high_water
        await self.control.start_message(message.id, start_offset=head)
        try:
            for attempt in range(_LOCKED_TRIES):
                binding = await self.binding(sid, settings=_settings_of(message))
                try:
                    if message.kind == "resume":
                        result = await self.sessions.resume(sid, binding=binding)
                    else:
                        task = await self._input(message)
                        result = await self.sessions.run(task, binding=binding, session=sid)
                    break
                except SessionLockedError as exc:
                    # another writer holds the session for a moment (a decide or abandon
                    # over this host, `lodger decide`): a run that cannot open its own
                    # session's writer committed nothing, so wait and try again rather
                    # than fail the message
                    if exc.session_id != sid or attempt + 1 == _LOCKED_TRIES:
                        raise
                finally:
                    if not isinstance(binding.model, str):  # compose made a Model
                        await binding.model.aclose()
                await asyncio.sleep(_LOCKED_WAIT_S)
        except LodgerError as exc:
            await self.control.finish_message(
                message.id, status="failed", result={"error": exc.to_dict()}
            )
            return
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the host: record it
            _log.exception("turn of message %s in session %s failed", message.id, sid)
            failure = {"code": "lodger_error", "message": f"{type(exc).__name__}: {exc}"}
            await self.control.finish_message(
                message.id, status="failed", result={"error": failure}
            )
            return
        self.turns_run += 1
        await self.control.finish_message(message.id, status="done", result=_summary(result))

    async def _input(self, message: Message) -> UserInput | McpInput:
        """A queued message's turn input (a ``media`` message's bytes from the artifacts;
        MCP resources and a prompt named, read when the turn's servers are up)."""
        if message.kind != "media":
            return decode_input(message.text) or message.text
        text, attachments = parse_media_message(message.text)
        given = await attached_input(
            text, attachments, self.sessions.storage.artifacts, session_id=message.session_id
        )
        items = list(given) if not isinstance(given, str) else [given]
        media = [item for item in items[1:] if not isinstance(item, str)]
        return decode_input(text, media) or given

    async def binding(self, session_id: str, *, settings: ModelSettings | None = None) -> Binding:
        spec = await self.control.session_model(session_id)
        project = Project.none()
        if self.config.workspaces is not None:
            workspace = (self.config.workspaces / session_id).resolve()
            state = (
                await self.sessions.state(session_id) if await self._logged(session_id) else None
            )
            if state is not None and state.workspace is not None:
                workspace = Path(state.workspace)  # a fork works where its parent did
            await asyncio.to_thread(workspace.mkdir, parents=True, exist_ok=True)
            project = await asyncio.to_thread(
                Project.load, workspace, trusted=self.config.trust_projects
            )
        return compose(
            project,
            Overrides(
                # the host's own list decides which models a session may use, never a file
                model=spec or self.config.models[0],
                tools=self.config.tools,
                approver=self._approver(session_id),
                elicitor=self.elicitations.elicitor(session_id),
                max_steps=self.config.max_steps,
                usage=self.config.usage,
                budgets=self.config.budgets,
                on_event=self._observer(session_id),
                on_text=self._text_sink(session_id),
                code_mode=self.config.code_mode,
                model_settings=settings,
            ),
        )

    async def _logged(self, session_id: str) -> bool:
        return await self.sessions.storage.log.exists(session_id)

    def publish(self, session_id: str, events: Sequence[Event]) -> None:
        """Facts committed outside a run (decide, abandon, fork) reach streams at once."""
        for event in events:
            for observe in self.observers:
                observe(event)
        self.feeds.publish(session_id, events)

    def _text_sink(self, session_id: str) -> Callable[[str], None]:
        """The model's text as it streams, to the session's followers that take deltas
        (transient: never a fact; see ``lodger.host.feed``)."""

        def on_text(text: str) -> None:
            where = streaming_envelope()
            if where is not None and where.turn_id is not None and where.step_id is not None:
                self.feeds.publish_text(session_id, where.turn_id, where.step_id, text)

        return on_text

    def _observer(self, session_id: str) -> EventObserver:
        def on_event(event: Event) -> None:
            if event.kind == "permission_requested" and event.call_id is not None:
                _ASKING.set(event.call_id)
                key = (session_id, event.call_id)
                if key not in self._asked:
                    self._asked[key] = _Asked(asyncio.get_running_loop().create_future())
            for observe in self.observers:
                observe(event)
            self.feeds.publish(session_id, (event,))

        return on_event

    # ------------------------------------------------------------ approvals

    def _approver(self, session_id: str) -> Callable[[Tool, dict[str, Any]], Any]:
        async def approve(tool: Tool, arguments: dict[str, Any]) -> bool | Answered:
            call_id = _ASKING.get()
            if call_id is None:  # the gate asked without a fact: never allow blindly
                return False
            key = (session_id, call_id)
            asked = self._asked.get(key)
            if asked is None:
                asked = self._asked[key] = _Asked(asyncio.get_running_loop().create_future())
            summary = ""
            for event in reversed(self.feeds.feed(session_id).recent):
                if event.call_id == call_id and event.kind == "permission_requested":
                    summary = getattr(event.body, "summary", "")
                    break
            try:
                await self.control.park(
                    session_id,
                    call_id,
                    tool=tool.name,
                    summary=summary,
                    created_us=self.sessions.clock.now_us(),
                )
                asked.parked.set()
                return await asked.future
            finally:
                asked.parked.set()  # an answer waiting for the index goes on either way
                self._asked.pop(key, None)

        return approve

    def waiting(self) -> int:
        """Calls waiting for an approval in this process."""
        return len(self._asked)

    async def approvals(self, *, session_id: str | None = None) -> list[Approval]:
        """Pending approvals (of one session, or of all)."""
        return await self.control.approvals(session_id=session_id)

    async def pending_count(self) -> int:
        return self.waiting()

    async def abandoned(self, session_id: str) -> None:
        """The session's open turn was just abandoned: nothing of it waits any more. Here
        a question is asked only by a running turn, which an abandon cannot meet."""

    async def decided(self, session_id: str) -> None:
        """An operator decision was just appended to the session's open turn. Here the
        turn goes on when a client resumes it (``POST .../resume``)."""

    async def answer(
        self, session_id: str, call_id: str, *, allow: bool, by: str, always: bool = False
    ) -> Approval:
        """Decide a parked call once: the first answer wins, any later one is a conflict.
        ``by`` names who answered (``token:tok_...``); the decision's fact records it.
        ``always`` (with ``allow``) allows the tool for the rest of the session."""
        asked = self._asked.get((session_id, call_id))
        if asked is not None:
            await asked.parked.wait()  # the fact can reach a client before the index does
        approval = await self.control.answer(session_id, call_id, allow=allow, by=by)
        if asked is not None and not asked.future.done():
            asked.future.set_result(
                Answered(("always" if always else "once") if allow else "deny", by)
            )
        return approval

    # ------------------------------------------------------------ steering and the queue

    async def steer(self, session_id: str, text: str, *, who: str) -> Steered:
        """A message for the session's running turn (``lodger.engine.steering``); with no
        turn running it is queued as the session's next turn, which runs at once."""
        await self.require(session_id)
        async with self.exclusive(session_id):
            steered = await self.sessions.steer(session_id, text, who=who)
        if steered.status == "queued":
            if steered.offset is not None:
                await self._published_from(session_id, steered.offset)
            self.wake(session_id)
        return steered

    async def enqueue(
        self, session_id: str, text: str, *, policy: str, who: str
    ) -> QueuedMessage | QueuedRow:
        """A follow-up message with its policy, as a fact; ``reject`` is refused while
        the session has work (a turn running or messages waiting to run)."""
        await self.require(session_id)
        if policy == "reject" and await self.busy(session_id):
            raise busy_refusal(session_id)
        async with self.exclusive(session_id):
            queued = await self.sessions.enqueue(session_id, text, policy=policy, who=who)
        if not self.sessions.busy(session_id):
            await self._published_from(session_id, queued.offset)
        self.wake(session_id)
        return queued

    async def queue(self, session_id: str) -> Sequence[QueuedMessage | QueuedRow]:
        await self.require(session_id)
        if not await self._logged(session_id):
            return []
        return await self.sessions.queue(session_id)

    async def change_queued(
        self,
        session_id: str,
        message_id: str,
        action: Literal["edit", "move", "retract"],
        *,
        text: str | None = None,
        position: int | None = None,
        who: str,
    ) -> Sequence[QueuedMessage | QueuedRow]:
        await self.require(session_id)
        head = (await self.sessions.storage.log.head(session_id)).high_water
        async with self.exclusive(session_id):
            queue = await self.sessions.change_queued(
                session_id, message_id, action, text=text, position=position, who=who
            )
        if not self.sessions.busy(session_id):
            await self._published_from(session_id, head)
        return queue

    async def _published_from(self, session_id: str, offset: int) -> None:
        """Facts appended outside a turn from ``offset`` on reach the streams."""
        self.publish(session_id, await self.sessions.storage.log.read(session_id, start=offset))

    async def _run_followup(self, session_id: str) -> bool:
        """Run the session's next queued follow-up message as a turn; False when none
        waits, or when it is still waiting after (an open turn that could not settle
        first: it waits for the next wake rather than being tried again at once)."""
        if not await self._logged(session_id):
            return False
        queue = await self.sessions.queue(session_id)
        if not queue:
            return False
        try:
            binding = await self.binding(session_id)
            try:
                result = await self.sessions.run_queued(session_id, binding=binding)
            finally:
                if not isinstance(binding.model, str):
                    await binding.model.aclose()
        except Exception:  # noqa: BLE001 - a bug must not stop the host: it is logged
            _log.exception("queued message of session %s failed", session_id)
            return False
        if result is not None:
            self.turns_run += 1
        head = queue[0].message_id
        return all(m.message_id != head for m in await self.sessions.queue(session_id))

    # ------------------------------------------------------------ session control

    async def cancel(self, session_id: str, *, who: str | None, reason: str) -> CancelOutcome:
        """Cancel the session's running turn (this host's runner, or another process on
        this machine that runs it); idempotent. An open turn nobody runs (interrupted,
        parked) ends cancelled; its facts reach the streams."""
        running = self.running(session_id) or self.sessions.turns.of_session(session_id)
        log = self.sessions.storage.log
        branch = await open_branch(self.sessions.storage, session_id)
        head = (await log.head(branch)).high_water if await log.exists(branch) else 0
        done = await self.sessions.cancel(session_id, who=who, reason=reason)
        if done.status == "cancelled" and not running:
            self.publish(session_id, await log.read(branch, start=head))
        return done

    async def rewind(self, session_id: str, **point: Any) -> RewindResult:
        """Rewind the session (``Sessions.rewind``'s arguments) while nothing else
        writes it."""
        async with self.exclusive(session_id):
            return await self.sessions.rewind(session_id, **point)

    async def set_permission_mode(
        self, session_id: str, mode: str, *, who: str | None
    ) -> ModeOutcome:
        """Switch the session's permission mode, through whoever writes it now."""
        async with self.exclusive(session_id):
            done = await self.sessions.set_permission_mode(session_id, mode, who=who)
        if done.outside_run and done.event is not None:
            self.publish(session_id, (done.event,))  # a run's facts reach streams by itself
        return done


#: the policies whose message stops the running turn and runs before the waiting ones
URGENT = ("interrupt", "rollback")


def busy_refusal(session_id: str) -> HostConflictError:
    """A message with policy ``reject`` for a session that has work."""
    return HostConflictError(
        f"session {session_id!r} is running a turn, and the message's policy is reject",
        hint="send it again once the turn has ended, or with policy enqueue",
        code="session_busy",
        session_id=session_id,
    )


def _summary(result: TurnResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "turn_id": result.turn_id,
        "run_id": result.run_id,
        "answer": result.answer,
        "error": result.error,
        "commits": result.commits,
    }


def _settings_of(message: Message) -> ModelSettings | None:
    """The settings a queued message asked with (checked when it was sent)."""
    if message.settings is None:
        return None
    return settings_from_mapping(message.settings, where="the message's model_settings")
