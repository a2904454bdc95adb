"""Stateless workers: claim a due wake, take the session's lease, run, release.

For each wake a worker takes the session lease (a new epoch), restores the session's
workspace snapshot into a fresh directory, resumes an interrupted turn if there is one
(exactly the recovery that follows any crash), delivers the wake's message as a new
turn unless it already reached the log, snapshots the workspace, updates the session and
parked indexes, finishes the wake and releases the lease. Every commit is guarded by the
lease (``lodger.storage.control.fencing``), which a heartbeat renews while the turn runs.

A call whose approval was parked (``lodger.runtime.approvals.ParkingApprovals``) ends
the run waiting: once that is committed the worker records the call's question in the
control plane (``park_approval``, which queues the session's wake due at the question's
expiry), indexes the session ``waiting`` and releases it; the session is then dormant
until the question is answered or expires.

Stopping: ``stop`` set (SIGTERM) means take no more work; a running turn gets
``grace_s`` to settle, then it is cancelled (the engine settles running calls and ends
the run ``interrupted``) and its wake is handed back for another worker. A worker killed
outright (SIGKILL) leaves its lease and its claim to expire; another worker then claims
the wake and resumes the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lodger.engine.state import SessionState
from lodger.errors import (
    CommitFailedError,
    ControlPlaneError,
    LeaseLostError,
    LodgerError,
    ResumeBlockedError,
    SessionLockedError,
)
from lodger.events import PermissionRequested, WorkspaceSnapshot
from lodger.media import wake_input, wake_text
from lodger.runtime._worker_cancel import deliver_cancels
from lodger.runtime._worker_queue import take_into_log
from lodger.runtime._worker_steers import relay_steers, requeue_left, run_followups
from lodger.runtime._worker_text import TextRelay
from lodger.runtime.approvals import DEFAULT_APPROVAL_EXPIRY_S
from lodger.runtime.sessions import Binding, Sessions
from lodger.runtime.subagents.detached import ControlPlaneChildren
from lodger.runtime.subagents.link import SubagentLink, link_of
from lodger.storage import Storage
from lodger.storage.control.fencing import FencedLogStore, LeaseGuard
from lodger.storage.control.interface import (
    ControlPlane,
    ParkedCall,
    SessionClaim,
    SessionLease,
    SessionRow,
    TextNotices,
    Wake,
    WakeBell,
    WakeEnd,
    WakeNotices,
)
from lodger.storage.eventlog import EventLog
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace

__all__ = ["BindingFactory", "Worker", "WorkerConfig", "WorkerStats", "newest_snapshot"]

log = logging.getLogger("lodger.worker")

#: (session id, the model the session last ran with, the fresh workspace) -> what to bind
BindingFactory = Callable[[str, str | None, Path], Binding]


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    concurrency: int = 1
    lease_ttl_s: float = 15.0
    #: seconds between looks at an empty queue without wake notifications (SQLite, or
    #: the notifying connection lost)
    poll_s: float = 0.5
    #: seconds between looks while notifications arrive (a missed one costs this much)
    notified_poll_s: float = 5.0
    #: after SIGTERM, how long a running turn may take to settle before it is handed back
    grace_s: float = 20.0
    #: how long a wake waits when its session is busy or a turn failed to commit
    retry_delay_s: float = 1.0
    #: how long a wake of a session with parked operations waits before the next look
    parked_delay_s: float = 60.0
    schedules_every_s: float = 1.0
    #: attempts of a wake whose turn keeps failing with an error before it is dropped
    max_attempts: int = 5
    #: how long a parked approval stays answerable (then the call is denied)
    approval_expiry_s: float = DEFAULT_APPROVAL_EXPIRY_S
    #: seconds between looks for steers hosts sent the running turn (``Steers``)
    steer_poll_s: float = 0.2
    #: seconds between looks for a cancel request of the session being worked on (a
    #: read-only transaction: on SQLite it takes no lock)
    cancel_poll_s: float = 0.25


@dataclass
class WorkerStats:
    turns: int = 0
    resumed: int = 0
    handed_back: int = 0
    failed: int = 0
    fenced: int = 0
    settled: list[str] = field(default_factory=list)
    #: claims that took wakes, and the wakes they took (several a claim with concurrency)
    claims: int = 0
    claimed: int = 0
    #: wake notifications received from the control plane
    rings: int = 0
    #: folds taken from the cache (the stored head matched) and read from the log
    folds_reused: int = 0
    folds_read: int = 0


class Worker:
    def __init__(
        self,
        *,
        control: ControlPlane,
        storage: Storage,
        bind: BindingFactory,
        config: WorkerConfig | None = None,
        holder: str | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.control = control
        self.config = config or WorkerConfig()
        self.holder = holder or f"{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"
        self.guard = LeaseGuard(control)
        inner = storage.log
        _lease_no_longer_than(inner.store, self.config.lease_ttl_s)
        self.storage = Storage(
            log=EventLog(
                FencedLogStore(inner.store, self.guard),
                key=inner.key,
                require_key=inner.require_key,
            ),
            artifacts=storage.artifacts,
            state_dir=storage.state_dir,
        )
        self.bind = bind
        self.workdir = workdir
        self.stats = WorkerStats()
        #: rung by the control plane's notifications (``WakeNotices``), when it sends them
        self.bell = WakeBell()
        #: the text deltas of its turns, to the hosts (a control plane that relays them)
        self.text = TextRelay(control) if isinstance(control, TextNotices) else None
        # one service for every slot: one store handle and its group commit, and one
        # cache of verified folds (``_fold``)
        self.sessions = Sessions(
            self.storage, max_cached_sessions=max(64, 4 * self.config.concurrency)
        )
        self._next_schedules = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then settle or hand back what is running."""
        bell = self.bell
        async with asyncio.TaskGroup() as group:
            listener = None
            if isinstance(self.control, WakeNotices):
                listener = group.create_task(_listen(self.control, bell))
            relay = None if self.text is None else group.create_task(self.text.run())
            try:
                await self._dispatch(group, bell, stop)
            finally:
                for task in (listener, relay):
                    if task is not None:
                        task.cancel()

    async def _dispatch(
        self, group: asyncio.TaskGroup, bell: WakeBell, stop: asyncio.Event
    ) -> None:
        """Claim as many wakes as there are free slots, in one transaction, and run each
        in its own task; look again when a slot frees, when the control plane rings
        (a wake became due), or after the poll interval (long while the bell is live)."""
        running: set[asyncio.Task[None]] = set()
        nudge = asyncio.Event()
        relay = group.create_task(_relay(stop, nudge))

        def freed(task: asyncio.Task[None]) -> None:
            running.discard(task)
            nudge.set()

        try:
            while not stop.is_set():
                nudge.clear()
                bell.clear()  # rung after this: the next look happens at once
                await self._fire_schedules()
                free = self.config.concurrency - len(running)
                claims = await self._claim(free) if free > 0 else []
                for claim in claims:
                    task = group.create_task(self._guarded(claim, stop))
                    running.add(task)
                    task.add_done_callback(freed)
                if free == 0 or len(claims) < free:
                    await self._idle(bell, nudge, empty=free > 0)
                self.stats.rings = bell.rings
        finally:
            relay.cancel()

    async def _idle(self, bell: WakeBell, nudge: asyncio.Event, *, empty: bool) -> None:
        """Wait for a slot to free (``nudge``), the next schedules look, and, when the
        queue had less than the free slots (``empty``), a ring or the poll interval."""
        timeout = max(0.0, self._next_schedules - time.monotonic())
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(nudge.wait())]
        if empty:
            poll = self.config.notified_poll_s if bell.live else self.config.poll_s
            timeout = min(timeout, poll)
            waiters.append(asyncio.ensure_future(bell.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _fire_schedules(self) -> None:
        """Enqueue the due schedules' wakes, every ``schedules_every_s``."""
        if time.monotonic() < self._next_schedules:
            return
        self._next_schedules = time.monotonic() + self.config.schedules_every_s
        try:
            await self.control.fire_schedules()
        except ControlPlaneError as exc:
            log.warning("control plane: %s", exc.message)

    async def _claim(self, free: int) -> list[SessionClaim]:
        try:
            claims = await self.control.claim_sessions(
                holder=self.holder, limit=free, ttl_s=self.config.lease_ttl_s
            )
        except ControlPlaneError as exc:
            log.warning("control plane: %s", exc.message)
            return []
        if claims:
            self.stats.claims += 1
            self.stats.claimed += len(claims)
        return claims

    async def _guarded(self, claim: SessionClaim, stop: asyncio.Event) -> None:
        """One wake; its failures stop neither the other wakes nor the worker."""
        try:
            await self._process(claim, stop)
        except ControlPlaneError as exc:
            # the wake's claim and the lease expire on their own; another worker retries
            log.warning("control plane during wake %s: %s", claim.wake.id, exc.message)
        except Exception:  # the other slots and the next wakes go on
            log.exception("wake %s: unexpected error", claim.wake.id)

    async def _process(self, claim: SessionClaim, stop: asyncio.Event) -> None:
        wake, lease = claim.wake, claim.lease
        self.guard.hold(lease)
        ended = False
        try:
            delay, held, failure, index = await self._work(claim, stop)
            current = self._own(lease)
            # the session's index rides in the wake's end: one transaction, not two
            end = WakeEnd(delay_s=delay, held=held, error=failure)
            if index is not None:
                end = dataclasses.replace(end, row=index.row, parked=index.parked,
                                          release_held=index.release_held)  # fmt: skip
            await self.control.end_wake(wake_id=wake.id, lease=current, end=end)
            ended = True
            # the steers no turn took are the session's next messages now
            await requeue_left(self.control, self.sessions, wake.session_id, self.holder)
            # and a follow-up queued while this worker let go is woken for
            await self.control.wake_queued(session_id=wake.session_id)
        finally:
            # once released, another slot may hold the session's next grant: not that one
            current = self._own(lease)
            self.guard.drop(wake.session_id, epoch=lease.epoch)
            if not ended:
                with contextlib.suppress(ControlPlaneError):
                    await self.control.release_session(lease=current)

    def _own(self, lease: SessionLease) -> SessionLease:
        """This wake's lease as last renewed (the guard's, while it is the same grant)."""
        held = self.guard.lease(lease.session_id)
        return held if held is not None and held.epoch == lease.epoch else lease

    async def _work(
        self, claim: SessionClaim, stop: asyncio.Event
    ) -> tuple[float | None, bool, str | None, _Index | None]:
        """Run the wake under its lease's watch: (hand back after this delay, or None
        when the wake is done; whether it is held; why it is given up on, if it is;
        the session's index to write as the wake ends)."""
        wake = claim.wake
        delay: float | None = None
        held = False  # handed back until the session's open turn settles
        failure: str | None = None
        index: _Index | None = None
        turn = asyncio.ensure_future(self._turn(wake, claim.row))
        watch = asyncio.ensure_future(self._watch(wake, turn, stop))
        steers = asyncio.ensure_future(
            relay_steers(
                self.control,
                self.sessions,
                wake.session_id,
                self.holder,
                turn,
                poll_s=self.config.steer_poll_s,
            )
        )
        cancels = asyncio.ensure_future(  # a cancel sent through the control plane
            deliver_cancels(
                self.control,
                self.guard,
                self.sessions,
                wake.session_id,
                turn,
                every=self.config.cancel_poll_s,
            )
        )
        try:
            step = await turn
            delay, held, index = step.delay, step.held, step.index
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we were cancelled ourselves
            delay = 0.0  # stopped by the deadline or a lost lease: hand it back
            self.stats.handed_back += 1
        except (LeaseLostError, CommitFailedError) as exc:
            log.warning("session %s: %s", wake.session_id, exc.message)
            self.stats.fenced += 1
            delay = self.config.retry_delay_s
        except SessionLockedError as exc:
            # a writer outside the control plane (`lodger run --store`) holds it: the
            # wake waits for it, and is never given up on for that
            log.warning("session %s: %s", wake.session_id, exc.message)
            self.stats.handed_back += 1
            delay = self.config.retry_delay_s
        except Exception as exc:  # one turn's failure never stops the worker
            if isinstance(exc, LodgerError):
                log.warning("session %s: %s", wake.session_id, exc)
            else:  # a bug in a model adapter, a tool binding or lodger: keep the trace
                log.exception("session %s: unexpected error in its turn", wake.session_id)
            self.stats.failed += 1
            delay = self.config.retry_delay_s
            if wake.attempts >= self.config.max_attempts:
                # a wake that keeps failing (no model, a corrupt log) is dropped, and
                # the index says why, instead of retrying for ever
                delay = None
                failure = await self._give_up(wake, exc)
        finally:
            for helper in (watch, steers, cancels):
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
        return delay, held, failure, index

    async def _watch(self, wake: Wake, turn: asyncio.Future[_Step], stop: asyncio.Event) -> None:
        """Renew the lease and the claim; cancel the turn when the lease is lost or, after
        ``stop``, when the grace period is over."""
        ttl = self.config.lease_ttl_s
        stop_at: float | None = None
        stopped = asyncio.ensure_future(stop.wait())
        renew = False  # the lease and the claim were just taken, for ttl
        try:
            while not turn.done():
                if stop.is_set() and stop_at is None:
                    stop_at = time.monotonic() + self.config.grace_s
                if stop_at is not None and time.monotonic() >= stop_at:
                    turn.cancel()
                    return
                lease = self.guard.lease(wake.session_id) if renew else None
                renew = True
                if lease is not None:
                    try:
                        renewed = await self.control.renew_session(lease=lease, ttl_s=ttl)
                        self.guard.hold(renewed)
                        await self.control.renew_wake(
                            wake_id=wake.id, holder=self.holder, ttl_s=ttl
                        )
                    except LeaseLostError as exc:
                        log.warning("lost the lease: %s", exc.message)
                        turn.cancel()  # its commits would be refused anyway
                        return
                    except ControlPlaneError as exc:
                        log.warning("renewing the lease on %s: %s", wake.session_id, exc.message)
                timeout = ttl / 3
                if stop_at is not None:
                    timeout = min(timeout, max(0.01, stop_at - time.monotonic()))
                waiters: list[asyncio.Future[Any]] = [turn]
                if stop_at is None:
                    waiters.append(stopped)
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def _turn(self, wake: Wake, row: SessionRow | None) -> _Step:
        """Run the wake on its session. Returns the delay after which it should be looked
        at again (a session parked on an operator), None when the wake is done, and
        whether it is held: it waits for something only someone else can change (an
        answer that lets the open turn settle, an operator's decision) and is released
        the moment that happens (``release_held_wakes``), else looked at after the delay."""
        sid = wake.session_id
        sessions = self.sessions
        state = await self._fold(sid)
        root = await asyncio.to_thread(
            tempfile.mkdtemp, prefix=f"lodger-{sid[:40]}-", dir=self.workdir
        )
        workspace = Path(root)
        try:
            start = newest_snapshot(state, row)
            if start is not None:
                await restore_snapshot(start, self.storage.artifacts, workspace)
            # a session made by the host has no log yet; the index holds its model
            recorded = (state.last_model if state else None) or (row.model if row else None)
            binding = self._with_children(self.bind(sid, recorded, workspace))
            if self.text is not None:
                binding = self.text.bind(sid, binding)
            link = link_of(state.events[0]) if state is not None and state.events else None
            step = _Step(state=state)
            if link is not None and binding.subagents is not None and wake.message is None:
                await self._child_turn(sessions, sid, binding, link, step)
            elif state is not None and state.open_turn is not None:
                await self._open_turn(sessions, wake, binding, step)
            if step.delay is None and wake.message is not None and not _delivered(step.state, wake):
                await self._deliver(sessions, wake, binding, workspace, step)
            if step.delay is None and not step.waiting and step.state and step.state.queue:
                await self._followups(sessions, sid, binding, step)
            if step.delay is None and not step.waiting and step.state is not None:
                await self._queued(sessions, sid, binding, step)
            await self._settled(sid, binding, workspace, step)
            return step
        finally:
            if self.text is not None:
                self.text.forget(sid)
            await asyncio.to_thread(shutil.rmtree, workspace, True)

    async def _child_turn(
        self, sessions: Sessions, sid: str, binding: Binding, link: SubagentLink, step: _Step
    ) -> None:
        """A child handed off by its parent: its one turn, then wake the parent."""
        try:
            outcome = await sessions.run_subagent(sid, binding=binding)
        except ResumeBlockedError:
            outcome = None  # parked on an operator: the parent waits too
        if outcome is not None and outcome.status is None and outcome.timed_out:
            # out of its wall time: ended, so the parent is told rather than waiting on a
            # child nobody runs
            await sessions.abandon(sid, reason=outcome.error)
            await self.control.withdraw_approvals(session_id=sid)
            outcome = dataclasses.replace(outcome, status="abandoned")
        if outcome is None:
            # parked on an operator: a decision releases it (``decided``)
            step.delay = self.config.parked_delay_s
            step.held = True
        elif outcome.status is None:
            step.waiting = True  # it delegated in turn: its own children wake it
        else:
            self.stats.settled.append(outcome.status)
            # its parent is woken once the child's final snapshot is indexed: the parent
            # brings the child's edits into its own workspace from it
            step.wake_parent = link
        step.state = await self._fold(sid)

    async def _open_turn(
        self, sessions: Sessions, wake: Wake, binding: Binding, step: _Step
    ) -> None:
        """The session's turn is open: resume it first (or hold the message back)."""
        sid, state = wake.session_id, step.state
        assert state is not None
        if wake.message is not None and await self._approvals_unanswered(sid, state):
            # a message for a session whose approvals nobody answered yet: resuming would
            # only park them again; the message waits for the turn to settle
            step.delay = self.config.parked_delay_s
            step.held = step.waiting = True
            return
        self.stats.resumed += 1
        try:
            result = await sessions.resume(sid, binding=binding, relocate=True)
            step.waiting = result.status == "waiting"
            if result.status not in ("completed", "waiting"):
                step.delay = self.config.parked_delay_s
            elif step.waiting and wake.message is not None:
                # still open: the message would only resume it again and be lost; it is
                # delivered once the turn has settled
                step.delay = self.config.parked_delay_s
                step.held = True
        except ResumeBlockedError:
            # parked on an operator: a decision releases it (``decided``)
            step.delay = self.config.parked_delay_s
            step.held = True
        step.state = await self._fold(sid)

    async def _deliver(
        self, sessions: Sessions, wake: Wake, binding: Binding, workspace: Path, step: _Step
    ) -> None:
        """Run the wake's message as a new turn."""
        assert wake.message is not None
        sid = wake.session_id
        offset = len(step.state.events) if step.state is not None else 0
        # recorded with the turn's first commit check (``LeaseGuard.starting``)
        self.guard.starting(sid, wake_id=wake.id, offset=offset)
        try:
            task = await wake_input(wake.message, self.storage.artifacts, session_id=sid)
            result = await sessions.run(task, binding=binding, session=sid)
        except asyncio.CancelledError:
            # handed back (SIGTERM deadline, lost lease): keep what the turn did
            await self._settle_index(sid, workspace)
            raise
        self.stats.turns += 1
        self.stats.settled.append(result.status)
        step.waiting = result.status == "waiting"
        step.state = await self._after_turn(sid)

    async def _followups(self, sessions: Sessions, sid: str, binding: Binding, step: _Step) -> None:
        """The follow-up messages the log queued (a steer after the turn's last step)."""
        for result in await run_followups(sessions, sid, binding):
            self.stats.turns += 1
            self.stats.settled.append(result.status)
            step.waiting = result.status == "waiting"
        step.state = await self._fold(sid)

    async def _queued(self, sessions: Sessions, sid: str, binding: Binding, step: _Step) -> None:
        """The follow-ups hosts queued in the control plane, one turn each, while the
        session settles (``lodger.runtime._worker_queue``)."""
        while await take_into_log(self.control, sessions, sid, self.holder):
            await self._followups(sessions, sid, binding, step)
            if step.waiting or step.state is None or step.state.open_turn is not None:
                return

    async def _settled(self, sid: str, binding: Binding, workspace: Path, step: _Step) -> None:
        """After the wake's work: park its questions, snapshot, index, wake who waits."""
        state = step.state
        if step.waiting and state is not None:
            await self._park_approvals(sid, state)
        snapshot = await snapshot_workspace(workspace, self.storage.artifacts)
        # the turn settled: messages that waited for it go now, not at their next look
        # (this wake is still claimed, so it is not among them)
        settled = state is not None and state.open_turn is None
        step.index = _index_of(sid, state, snapshot.ref, waiting=step.waiting,
                               release_held=settled)  # fmt: skip
        if step.wake_parent is not None:
            # the parent brings the child's edits from the indexed snapshot: index now
            await self._index(step.index)
            step.index = None
            assert binding.subagents is not None and binding.subagents.children is not None
            await binding.subagents.children.settled(child=step.wake_parent)

    async def _approvals_unanswered(self, sid: str, state: SessionState) -> bool:
        """Whether the open turn waits for approvals that are all still pending."""
        calls = [c for c in state.plan().calls if c.action == "ask_permission"]
        if not calls:
            return False
        for call in calls:
            found = await self.control.poll_approval(session_id=sid, call_id=call.call_id)
            if found is None or found.status != "pending":
                return False  # answered, expired or never recorded: resume
        return True

    async def _park_approvals(self, sid: str, state: SessionState) -> None:
        """Record the question of every call whose approval the log says was parked
        (after that fact, so a question never outlives a log that forgot it)."""
        calls = [c for c in state.plan().calls if c.action == "ask_permission"]
        if not calls:
            return
        summaries: dict[str, str] = {}
        for event in state.events[state.open_turn_offset or 0 :]:
            if isinstance(event.body, PermissionRequested) and event.call_id is not None:
                summaries[event.call_id] = event.body.summary
        for call in calls:
            asked = await self.control.park_approval(
                session_id=sid,
                call_id=call.call_id,
                tool=call.tool,
                summary=summaries.get(call.call_id, ""),
                holder=self.holder,
                expires_s=self.config.approval_expiry_s,
            )
            log.info(
                "session %s: call %s waits for approval (%s) until %s",
                sid, call.call_id, asked.status, asked.expires_at,
            )  # fmt: skip

    def _with_children(self, binding: Binding) -> Binding:
        """A binding that delegates runs its children on this control plane's workers."""
        policy = binding.subagents
        if policy is None or policy.children is not None:
            return binding
        children = ControlPlaneChildren(
            self.control,
            self.storage.artifacts,
            guard=self.guard,
            holder=self.holder,
            ttl_s=self.config.lease_ttl_s,
        )
        return dataclasses.replace(
            binding, subagents=dataclasses.replace(policy, children=children)
        )

    async def _give_up(self, wake: Wake, exc: Exception) -> str:
        """Index the session as failed; what the wake ends with (``code: message``)."""
        code = exc.code if isinstance(exc, LodgerError) else "internal_error"
        row = await self.control.get_session(session_id=wake.session_id)
        log.warning(
            "dropping wake %s of session %s after %s attempts: %s",
            wake.id, wake.session_id, wake.attempts, code,
        )  # fmt: skip
        now = await self.control.now()
        await self.control.record_session(
            # the rest of the row (its model, its workspace snapshot) stays as it was
            row=dataclasses.replace(row, status=f"error:{code}", last_activity=now)
            if row is not None
            else SessionRow(session_id=wake.session_id, status=f"error:{code}", last_activity=now)
        )
        message = exc.message if isinstance(exc, LodgerError) else f"{type(exc).__name__}: {exc}"
        return f"{code}: {message}"

    async def _settle_index(self, sid: str, workspace: Path) -> None:
        """Snapshot and index a session whose turn was stopped; best effort (the next
        worker indexes it again), and shielded so the stop does not cut it short."""
        try:
            snapshot = await snapshot_workspace(workspace, self.storage.artifacts)
            state = await self._fold(sid)
            await self._index(_index_of(sid, state, snapshot.ref))
        except (LodgerError, OSError) as exc:
            log.warning("indexing %s after a stop: %s", sid, exc)

    async def _index(self, index: _Index | None) -> None:
        """The session's index row and parked calls (and its held wakes released, when
        its turn settled), in one transaction stamped with the control plane's clock."""
        if index is not None:
            await self.control.index_session(
                row=index.row, parked=index.parked, release_held=index.release_held
            )

    async def _after_turn(self, sid: str) -> SessionState | None:
        """The fold after a turn this worker ran to its end: the agent's, which holds
        what its writer committed (the writer read whatever the store had beyond it
        when it opened, and a failed commit drops it from the cache), so the stored
        head is not read again; the log when it is not cached."""
        cached = self.sessions.cached(sid)
        if cached is not None and cached.events:
            self.stats.folds_reused += 1
            return cached
        return await self._fold(sid)

    async def _fold(self, sid: str) -> SessionState | None:
        """The session's verified fold (None: no events yet), from this worker's cache
        when the stored head still ends where the cached fold does: same high-water
        mark, same digest. Anything else (another writer, a lost lease) reads the log."""
        head = await self.storage.log.head(sid)
        if head.high_water == 0:
            return None
        cached = self.sessions.cached(sid)
        if cached is not None and cached.events:
            last = cached.events[-1]
            if last.offset + 1 == head.high_water and last.digest == head.digest:
                self.stats.folds_reused += 1
                return cached
        self.stats.folds_read += 1
        return await self.sessions.state(sid)


def _lease_no_longer_than(store: object, ttl_s: float) -> None:
    """An object store's writer lease lasts no longer than the session lease: a worker
    that died on another machine (whose death nobody here can see) holds the log no
    longer than the session, so the next worker resumes it after one TTL, not after the
    store's (30 s). Fencing is unchanged: commits are checked against the session lease
    and every segment put is create-only."""
    current = getattr(store, "lease_ttl_s", None)
    if isinstance(current, float | int) and current > ttl_s:
        store.lease_ttl_s = ttl_s  # type: ignore[attr-defined]


async def _listen(control: WakeNotices, bell: WakeBell) -> None:
    """The control plane's notifications; a listener that fails leaves the worker
    polling at ``poll_s`` (never stops it)."""
    try:
        await control.listen_wakes(bell)
    except Exception:  # a bug in the listener: polling still finds every wake
        log.exception("listening for wakes failed; polling instead")
    finally:
        bell.live = False


async def _relay(stop: asyncio.Event, nudge: asyncio.Event) -> None:
    await stop.wait()
    nudge.set()


@dataclasses.dataclass(kw_only=True)
class _Step:
    """What one wake's work has come to so far (``Worker._turn``)."""

    state: SessionState | None
    #: look at the wake again after this many seconds (None: the wake is done)
    delay: float | None = None
    #: the wake waits for something only someone else can change (released then)
    held: bool = False
    #: the turn ended its run with calls suspended (subagents, parked approvals)
    waiting: bool = False
    #: a child whose turn settled here: its parent is woken once it is indexed
    wake_parent: SubagentLink | None = None
    #: the session's index, written as the wake ends (``end_wake``)
    index: _Index | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Index:
    """What indexes a session (``index_session``'s, and ``end_wake``'s, arguments)."""

    row: SessionRow
    parked: list[ParkedCall]
    release_held: bool


def _index_of(
    sid: str,
    state: SessionState | None,
    snapshot: str,
    *,
    waiting: bool = False,
    release_held: bool = False,
) -> _Index | None:
    """The session's index row and parked calls after a wake (None: no log yet)."""
    if state is None:
        return None
    plan = state.plan()
    status = state.last_turn_status or "started"
    if state.open_turn is not None:
        status = "parked" if plan.blocked else "waiting" if waiting else "interrupted"
    return _Index(
        row=SessionRow(
            session_id=sid,
            status=status,
            last_activity=0.0,
            events=len(state.events),
            snapshot=snapshot,
            model=state.last_model,
        ),
        parked=[
            ParkedCall(session_id=sid, call_id=c.call_id, tool=c.tool, reason=c.reason,
                       since=0.0)
            for c in plan.blocked
        ],
        release_held=release_held,
    )  # fmt: skip


def newest_snapshot(state: SessionState | None, row: SessionRow | None) -> str | None:
    """The workspace a wake starts from: the index's snapshot, unless the log recorded a
    newer one (a turn run outside the workers, ``lodger run --store``, after the index
    was written, or before any worker ran the session)."""
    indexed = row.snapshot if row is not None else None
    if state is None:
        return indexed
    seen = row.events if row is not None and indexed is not None else 0
    for event in reversed(state.events[seen:]):
        if isinstance(event.body, WorkspaceSnapshot):
            return event.body.ref
    return indexed


def _delivered(state: SessionState | None, wake: Wake) -> bool:
    """Whether the wake's message already started a turn (a worker died after that)."""
    if state is None or wake.started_offset is None or wake.message is None:
        return False
    text = wake_text(wake.message)
    for event in state.events[wake.started_offset :]:
        if event.kind == "turn_started" and getattr(event.body, "input", None) == text:
            return True
    return False
