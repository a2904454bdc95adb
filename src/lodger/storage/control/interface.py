"""The control plane: the small, strongly consistent state that workers share.

Session leases with fencing epochs, inbound messages and timers (the wake queue, with
idempotency keys and cron schedules), the session index that ``lodger sessions`` lists
without opening logs, the index of parked operations, and the global resource
authorities (named leases with fencing tokens, counting semaphores, request quotas).

Two implementations pass one conformance suite (``lodger.testing.control_conformance``):
``SqliteControlPlane`` (a file beside the local store) and ``PostgresControlPlane``
(psycopg 3, async, pooled). Times are seconds since the epoch measured by the control
plane (PostgreSQL's clock, or the SQLite implementation's injected clock): a worker's own
clock never decides whether its lease is still current.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "ApprovalRequest",
    "Approvals",
    "ControlPlane",
    "FollowUps",
    "GlobalAuthorities",
    "HostToken",
    "Lifecycle",
    "ModeRequest",
    "ModeRequests",
    "NamedLease",
    "ParkedCall",
    "QueuedRow",
    "Schedule",
    "Schedules",
    "Secrets",
    "SessionCancel",
    "SessionCancels",
    "SessionClaim",
    "SessionIndex",
    "SessionLease",
    "SessionLeases",
    "SessionRow",
    "SteerRow",
    "Steers",
    "TextNotices",
    "TextPiece",
    "Tokens",
    "Wake",
    "WakeBell",
    "WakeEnd",
    "WakeInfo",
    "WakeNotices",
    "Wakes",
]


@dataclass(frozen=True, kw_only=True)
class SessionLease:
    """The right of ``holder`` to run ``session_id``'s turns; ``epoch`` grows by one at
    every grant, so a commit guarded by an older epoch is refused."""

    session_id: str
    holder: str
    epoch: int
    expires_at: float


@dataclass(frozen=True, kw_only=True)
class Wake:
    """One due event for a session: a message (a new turn) or, with ``message`` None, a
    plain wake (resume whatever is open). ``started_offset`` is the log's high-water mark
    recorded just before a worker delivered the message, so a worker that takes the wake
    over after a crash can tell whether the message already reached the log."""

    id: int
    session_id: str
    message: str | None
    due_at: float
    attempts: int
    started_offset: int | None


@dataclass(frozen=True, kw_only=True)
class WakeInfo:
    """A wake and where it is: ``queued`` (waiting to be due or claimed), ``running``
    (claimed by a live worker), ``done``, or ``failed`` (a worker gave up on it after its
    last attempt; ``error`` says why)."""

    wake: Wake
    status: str
    #: the idempotency key it was sent with, if any
    idempotency_key: str | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest:
    """A call of a worker-run turn waiting for a person's answer (schema version 3).

    ``status`` is ``pending`` until one answer wins (``allow``/``deny``) or the asking
    worker's deadline passes (``expired``: the call is denied). In ``mode`` ``wait`` a
    pending approval is live (listed, answerable) only while ``asked_by`` holds the
    session's lease: the question of a worker that died is answered by nobody. In
    ``mode`` ``park`` (schema version 6) the session is dormant and the approval is live
    until ``expires_at``; answering it wakes the session (``approval_key``)."""

    session_id: str
    call_id: str
    tool: str
    summary: str
    status: str
    asked_by: str
    answered_by: str | None
    asked_at: float
    expires_at: float
    mode: str = "wait"


@dataclass(frozen=True, kw_only=True)
class HostToken:
    """A bearer token of the HTTP hosts that share this control plane (schema version 4).

    Only the token's SHA-256 is kept (``token_hash``, 64 hex digits); the plain token is
    never handed to the control plane. ``scope`` is ``admin`` (``session_id`` None) or
    ``session`` (one session). A revoked token (``revoked_at`` set) stays revoked: adding
    the same token again does not bring it back."""

    token_hash: str
    scope: str
    session_id: str | None
    label: str
    created_at: float
    revoked_at: float | None = None


@dataclass(frozen=True, kw_only=True)
class SessionRow:
    """One session in the index: how its last turn settled, when, and where its
    workspace snapshot is."""

    session_id: str
    status: str
    last_activity: float
    events: int = 0
    snapshot: str | None = None
    model: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionClaim:
    """A due wake claimed together with its session's lease (a new epoch) and the
    session's index row (None for a session not indexed yet), in one transaction
    (``claim_sessions``)."""

    wake: Wake
    lease: SessionLease
    row: SessionRow | None


class WakeBell:
    """Rung when wakes may have become due (a notification from the control plane).

    ``live`` is True while notifications are being received: a worker then polls the
    queue rarely, and at its short interval while they are not (a lost connection, or a
    control plane that sends none)."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()
        self.live = False
        #: notifications received (each may stand for several wakes)
        self.rings = 0

    def ring(self) -> None:
        self.rings += 1
        self._rung.set()

    def clear(self) -> None:
        self._rung.clear()

    def is_set(self) -> bool:
        return self._rung.is_set()

    async def wait(self) -> None:
        await self._rung.wait()


@runtime_checkable
class WakeNotices(Protocol):
    """A control plane that tells listeners when a wake becomes due (PostgreSQL's
    ``LISTEN``/``NOTIFY``); without it a worker only polls."""

    async def listen_wakes(self, bell: WakeBell) -> None:
        """Ring ``bell`` at every notification until cancelled, keeping ``bell.live``
        true while notifications can arrive (reconnecting when the connection drops)."""
        ...


@dataclass(frozen=True, kw_only=True)
class TextPiece:
    """A piece of a step's text as a worker's model streams it (transient: never a
    fact). ``after`` is one past the newest fact the worker had committed then."""

    session_id: str
    turn_id: str
    step_id: str
    after: int
    text: str


@runtime_checkable
class TextNotices(Protocol):
    """A control plane that relays text deltas from the workers to the hosts
    (PostgreSQL's ``NOTIFY``): best effort, never stored; a host that does not listen,
    or is not connected, misses them (the facts carry the whole text)."""

    async def notify_text(self, *, pieces: Sequence[TextPiece]) -> None:
        """Send ``pieces`` to every host listening now."""
        ...

    async def listen_text(self, sink: Callable[[TextPiece], None]) -> None:
        """Call ``sink`` with every piece sent, until cancelled (reconnecting when the
        connection drops)."""
        ...


@dataclass(frozen=True, kw_only=True)
class ParkedCall:
    session_id: str
    call_id: str
    tool: str
    reason: str
    since: float


@dataclass(frozen=True, kw_only=True)
class WakeEnd:
    """How a claimed wake ends (``Wakes.end_wake``): finished (``delay_s`` None; failed
    for good with ``error``, as in ``finish_wake``) or handed back (``delay_s`` and
    ``held``, as in ``hand_back_wake``); with ``row``, the session's index is written
    first (``index_session`` with ``row``, ``parked`` and ``release_held``)."""

    delay_s: float | None = None
    held: bool = False
    error: str | None = None
    row: SessionRow | None = None
    parked: Sequence[ParkedCall] = ()
    release_held: bool = False


@dataclass(frozen=True, kw_only=True)
class Schedule:
    id: int
    session_id: str
    cron: str
    message: str
    next_at: float


@dataclass(frozen=True, kw_only=True)
class NamedLease:
    """An exclusive lease on a shared external resource; ``token`` grows at every grant
    and is what the holder passes on with each write (see ``admit_token``)."""

    name: str
    holder: str
    token: int
    expires_at: float


class Lifecycle(Protocol):
    """Opening, closing and the clock every other part of the control plane uses."""

    async def start(self) -> None:
        """Connect and bring the schema to the newest version (migrations run here)."""
        ...

    async def close(self) -> None: ...

    async def schema_version(self) -> int: ...

    async def now(self) -> float:
        """The control plane's clock, in seconds since the epoch."""
        ...


class SessionLeases(Protocol):
    """One writer per session: leases with fencing epochs."""

    async def acquire_session(
        self, *, session_id: str, holder: str, ttl_s: float
    ) -> SessionLease | None:
        """Grant the lease with a new epoch, unless another holder's lease is current."""
        ...

    async def renew_session(self, *, lease: SessionLease, ttl_s: float) -> SessionLease:
        """Extend a current lease; ``LeaseLostError`` when it expired or was taken."""
        ...

    async def check_session(
        self, *, lease: SessionLease, wake_started: tuple[int, int] | None = None
    ) -> None:
        """``LeaseLostError`` unless ``lease`` is still current (the commit guard). With
        ``wake_started`` (a wake id and an offset), ``mark_wake_started`` in the same
        step: a worker's first commit of a delivered message records where it started."""
        ...

    async def release_session(self, *, lease: SessionLease) -> None: ...


class Wakes(Protocol):
    """The wake queue: messages and plain wakes, with idempotency keys."""

    async def send(
        self,
        *,
        session_id: str,
        message: str | None,
        due_at: float | None = None,
        idempotency_key: str | None = None,
        urgent: bool = False,
    ) -> int | None:
        """Enqueue a wake (due now, or at ``due_at``); None when ``idempotency_key`` was
        seen before (nothing is enqueued). An ``urgent`` wake is claimed before the
        session's other due wakes (a message sent with policy interrupt or rollback)."""
        ...

    async def claim_wakes(self, *, holder: str, limit: int, ttl_s: float) -> list[Wake]:
        """Claim up to ``limit`` due wakes of sessions nobody holds, for ``ttl_s``."""
        ...

    async def claim_sessions(self, *, holder: str, limit: int, ttl_s: float) -> list[SessionClaim]:
        """Claim up to ``limit`` due wakes of sessions nobody holds and take each one's
        session lease (a new epoch), both for ``ttl_s``, in one transaction: what
        ``claim_wakes`` then ``acquire_session`` and ``get_session`` for each do."""
        ...

    async def end_wake(
        self, *, wake_id: int, lease: SessionLease, end: WakeEnd | None = None
    ) -> None:
        """In one transaction: index the session first when ``end.row`` is given (this
        wake itself is then finished or handed back as asked, whatever
        ``end.release_held`` did to it), finish the wake or hand it back as ``end``
        says (None: finished), settle a cancel request of ``lease``'s grant that no turn
        took (``not_running``: the worker is done with the session), then release
        ``lease`` (``release_session``)."""
        ...

    async def renew_wake(self, *, wake_id: int, holder: str, ttl_s: float) -> None: ...

    async def mark_wake_started(self, *, wake_id: int, offset: int) -> None: ...

    async def finish_wake(self, *, wake_id: int, error: str | None = None) -> None:
        """The wake is over: done, or failed for good with ``error`` (schema version 5)."""
        ...

    async def hand_back_wake(
        self, *, wake_id: int, delay_s: float = 0.0, held: bool = False
    ) -> None:
        """Unclaim a wake so another worker (or this one, after ``delay_s``) takes it. A
        ``held`` wake waits for its session's open turn to settle (schema version 7):
        ``release_held_wakes`` makes it due then, and ``delay_s`` is its latest next look."""
        ...

    async def release_held_wakes(self, *, session_id: str) -> int:
        """The session's open turn settled: its held wakes are due now (how many were)."""
        ...

    async def pending_wakes(self, *, session_id: str | None = None) -> list[Wake]:
        """Wakes not finished yet, due or not."""
        ...

    async def get_wake(self, *, wake_id: int) -> WakeInfo | None: ...

    async def wake_for_key(self, *, idempotency_key: str) -> WakeInfo | None:
        """The wake the first ``send`` with ``idempotency_key`` enqueued."""
        ...


class Schedules(Protocol):
    """Recurring messages (cron, UTC)."""

    async def add_schedule(
        self, *, session_id: str, cron: str, message: str, start: float | None = None
    ) -> Schedule:
        """A recurring message; its first run is the first match after ``start`` (now by
        default; an earlier ``start`` makes the runs since then count as missed)."""
        ...

    async def list_schedules(self) -> list[Schedule]: ...

    async def fire_schedules(self) -> int:
        """Enqueue one wake per schedule that is due and move it to its next time after
        now: runs missed while no worker was up fire once, not once per miss."""
        ...


class SessionIndex(Protocol):
    """What ``lodger sessions --control`` lists without opening a log, and the parked
    operations of each session."""

    async def record_session(self, *, row: SessionRow) -> None: ...

    async def index_session(
        self, *, row: SessionRow, parked: Sequence[ParkedCall], release_held: bool = False
    ) -> int:
        """In one transaction: ``record_session(row)``, ``set_parked`` with ``parked``
        and, when ``release_held``, ``release_held_wakes`` (how many it released). The
        row's ``last_activity`` and each call's ``since`` are the control plane's now."""
        ...

    async def get_session(self, *, session_id: str) -> SessionRow | None: ...

    async def list_sessions(self) -> list[SessionRow]: ...

    async def set_parked(self, *, session_id: str, calls: Sequence[ParkedCall]) -> None:
        """Replace the session's parked operations (empty: none wait any more)."""
        ...

    async def list_parked(self, *, session_id: str | None = None) -> list[ParkedCall]: ...


class Approvals(Protocol):
    """Questions a call waits on, answered from anywhere (a host, another worker)."""

    async def ask_approval(
        self,
        *,
        session_id: str,
        call_id: str,
        tool: str,
        summary: str,
        holder: str,
        wait_s: float,
    ) -> ApprovalRequest:
        """Record that ``holder`` waits up to ``wait_s`` for an answer about the call. A
        call asked again keeps an answer given meanwhile; an expired one is asked anew."""
        ...

    async def park_approval(
        self,
        *,
        session_id: str,
        call_id: str,
        tool: str,
        summary: str,
        holder: str,
        expires_s: float,
    ) -> ApprovalRequest:
        """Record that the call waits, its session dormant, up to ``expires_s`` for an
        answer, and queue the session's wake (key ``approval:<session>:<call_id>``) due at
        the expiry, in one transaction; an answer makes the wake due at once. A call
        parked again keeps its question (and any answer given meanwhile)."""
        ...

    async def poll_approval(self, *, session_id: str, call_id: str) -> ApprovalRequest | None:
        """The approval now; a pending one whose deadline passed becomes ``expired``."""
        ...

    async def answer_approval(
        self, *, session_id: str, call_id: str, allow: bool, by: str
    ) -> tuple[ApprovalRequest | None, bool]:
        """Answer a pending approval: ``(approval, True)`` for the one answer that wins;
        ``(approval, False)`` when it was answered or expired before; ``(None, False)``
        when no such call was asked."""
        ...

    async def list_approvals(
        self, *, session_id: str | None = None, status: str | None = "pending"
    ) -> list[ApprovalRequest]:
        """Approvals by status (``pending``: only those someone still waits for)."""
        ...

    async def withdraw_approvals(self, *, session_id: str) -> int:
        """Expire every pending approval of ``session_id`` (its turn was abandoned, so no
        run will ask for the answer): an answer after this is ``already_answered``.
        Returns how many were withdrawn."""
        ...


class Tokens(Protocol):
    """Host tokens and webhook deliveries, shared by every host of the control plane."""

    async def add_token(
        self, *, token_hash: str, scope: str, session_id: str | None, label: str
    ) -> HostToken:
        """Record a host token by its SHA-256 hex digest (anything else is refused with
        ``invalid_token_hash``). A hash recorded before keeps its first row, revoked or
        not, and that row is returned: compare it to what was asked."""
        ...

    async def get_token(self, *, token_hash: str) -> HostToken | None: ...

    async def revoke_token(self, *, token_hash: str) -> bool:
        """Revoke a token for every host; True when this call revoked it."""
        ...

    async def list_tokens(self) -> list[HostToken]:
        """Every host token, revoked ones included, oldest first."""
        ...

    async def claim_delivery(self, *, hook: str, delivery: str, session_id: str) -> str:
        """The session a webhook delivery goes to: ``session_id`` the first time, the
        first claim's session on every later one, whichever host receives it."""
        ...


class GlobalAuthorities(Protocol):
    """Resource authorities across workers: named leases with fencing tokens, counting
    semaphores, request quotas."""

    async def acquire_named(self, *, name: str, holder: str, ttl_s: float) -> NamedLease | None:
        """Grant the named lease with the next fencing token, unless it is held."""
        ...

    async def release_named(self, *, lease: NamedLease) -> None: ...

    async def admit_token(self, *, name: str, token: int) -> None:
        """The resource's side of fencing: accept a write carrying ``token`` only if no
        newer token was granted for ``name`` (``StaleTokenError`` otherwise)."""
        ...

    async def acquire_permit(
        self, *, name: str, limit: int, holder: str, ttl_s: float
    ) -> str | None:
        """One of ``limit`` permits of the named semaphore, or None when all are held."""
        ...

    async def release_permit(self, *, name: str, permit: str) -> None: ...

    async def take_quota(
        self, *, name: str, per_minute: int | None = None, per_hour: int | None = None
    ) -> float:
        """Take one request from the named quota: 0.0 when granted, else the seconds to
        wait before one is free (nothing is taken then)."""
        ...


# ----------------------------------------------------------- steers (session_steers)


@dataclass(frozen=True, kw_only=True)
class SteerRow:
    """A steer a host took for a session a worker runs, until that worker commits it."""

    steer_id: str
    session_id: str
    text: str
    who: str | None
    created_at: float


class Steers(Protocol):
    """Steers for sessions that run on workers (``lodger.engine.steering``): a host adds
    one; the worker holding the session takes it into its running turn (a
    ``steer_received`` fact) and marks it done; what its turn did not take becomes a
    wake, the session's next message, once it lets the session go."""

    async def add_steer(
        self, *, session_id: str, steer_id: str, text: str, who: str | None
    ) -> bool:
        """True: a worker holds the session and will take the steer; False: none does,
        and the steer was sent as a wake (idempotency key ``steer:<steer_id>``)."""
        ...

    async def take_steers(self, *, session_id: str, holder: str) -> list[SteerRow]:
        """The session's steers not taken by ``holder`` yet, oldest first, now taken by
        it (a steer another holder took and did not finish is taken again)."""
        ...

    async def done_steers(self, *, session_id: str, steer_ids: Sequence[str]) -> None:
        """The steers are committed to the session's log: forget them."""
        ...

    async def requeue_steers(self, *, session_id: str, skip: Sequence[str] = ()) -> int:
        """Once no worker holds the session: send each steer still waiting (but those in
        ``skip``, already in its log) as a wake, and forget them all; how many were sent
        (0, touching nothing, while a worker holds the session)."""
        ...


# ----------------------------------------------------------- cancel requests (session_cancels)


@dataclass(frozen=True, kw_only=True)
class SessionCancel:
    """A request to cancel the turn a session's lease grant ``epoch`` runs (schema version
    10): ``pending`` until the worker holding that lease delivers it, then how that went
    (``cancelled``, ``already_cancelling``, ``not_running``: a ``CancelOutcome`` status)."""

    id: int
    session_id: str
    epoch: int
    who: str | None
    reason: str
    status: str
    requested_at: float
    #: ``cancel``, or ``interrupt``/``rollback``: a message sent with that policy asks the
    #: running turn to stop so it runs next (``lodger.engine.queue.StopRequest``)
    policy: str = "cancel"


class SessionCancels(Protocol):
    """Cancel requests for a turn that a worker runs, sent from anywhere (a host, the CLI)."""

    async def request_cancel(
        self, *, session_id: str, who: str | None, reason: str, policy: str = "cancel"
    ) -> tuple[SessionCancel | None, bool]:
        """Record a cancel (or another ``policy``'s stop) for the turn the session's
        current lease runs, in one transaction: ``(None, False)`` when nobody holds the
        lease (nothing runs); ``(request, True)`` when this call recorded it;
        ``(request, False)`` when one was recorded for this lease before (nothing new)."""
        ...

    async def pending_cancel(self, *, lease: SessionLease) -> SessionCancel | None:
        """The undelivered cancel for ``lease``'s grant (a later grant never sees it)."""
        ...

    async def settle_cancel(self, *, cancel_id: int, status: str) -> None:
        """The holder delivered the request: ``status`` says how it went."""
        ...

    async def get_cancel(self, *, cancel_id: int) -> SessionCancel | None: ...


class Secrets(Protocol):
    """Opaque values by name, sealed by the caller with a key the store never holds
    (MCP OAuth logins for workers: ``lodger.tools._mcp_credentials``)."""

    async def put_secret(self, *, name: str, value: bytes) -> None: ...

    async def get_secret(self, *, name: str) -> bytes | None: ...

    async def delete_secret(self, *, name: str) -> bool: ...

    async def list_secrets(self, *, prefix: str) -> list[str]:
        """The names that start with ``prefix``, sorted."""
        ...


# ----------------------------------------------------------- the follow-up queue (session_queue)


@dataclass(frozen=True, kw_only=True)
class QueuedRow:
    """A follow-up message for a session that runs on workers (schema version 11): in
    the control plane, editable, until the worker holding the session commits it to the
    session's log as ``message_queued`` and runs it (``taken_by`` names that worker
    meanwhile, and the message can no longer be changed)."""

    message_id: str
    session_id: str
    text: str
    policy: str
    who: str | None
    position: int
    created_at: float
    #: who edited or moved it last (None: nobody since ``who`` queued it)
    changed_by: str | None = None
    taken_by: str | None = None


class FollowUps(Protocol):
    """The follow-up queue of sessions that run on workers (``lodger.engine.queue``'s
    policies): a host queues, lists, edits, moves and retracts; the worker holding the
    session takes an ``interrupt``/``rollback`` message into its running turn at once
    (which stops it) and an ``enqueue`` one once the turn settles, oldest first."""

    async def add_queued(
        self,
        *,
        session_id: str,
        message_id: str,
        text: str,
        policy: str,
        who: str | None,
        refuse_busy: bool = False,
    ) -> tuple[QueuedRow | None, bool]:
        """Queue a message, an urgent one ahead of the waiting ones (behind earlier urgent
        ones): ``(row, held)``, ``held`` telling whether a worker holds the session (else
        a plain wake was sent, unless one is waiting already). ``(None, held)`` with
        ``refuse_busy`` when the session has work (held, a wake due, a message queued):
        nothing is queued."""
        ...

    async def list_queued(self, *, session_id: str) -> list[QueuedRow]:
        """The session's queued messages in the order they run."""
        ...

    async def change_queued(
        self,
        *,
        session_id: str,
        message_id: str,
        action: str,
        who: str | None,
        text: str | None = None,
        position: int | None = None,
    ) -> list[QueuedRow] | None:
        """``edit`` (a new text), ``move`` (to ``position``, 0 the front) or ``retract``
        a message not taken yet; the queue after it, or None when no such message waits."""
        ...

    async def take_queued(
        self, *, session_id: str, holder: str, urgent_only: bool = False
    ) -> QueuedRow | None:
        """The first queued message (only an ``interrupt``/``rollback`` one with
        ``urgent_only``), now taken by ``holder``; None when none waits."""
        ...

    async def done_queued(self, *, session_id: str, message_id: str) -> None:
        """The taken message is in the session's log: forget it."""
        ...

    async def wake_queued(self, *, session_id: str) -> bool:
        """Once the session is let go: a plain wake when messages still wait and nobody
        holds it (whether one was sent)."""
        ...


# ----------------------------------------------------------- mode switches (session_modes)


@dataclass(frozen=True, kw_only=True)
class ModeRequest:
    """A permission-mode switch for the turn a session's lease grant ``epoch`` runs
    (schema version 11): ``pending`` until the worker holding that lease commits it
    through the turn (``changed``, ``unchanged``, with the mode before), or lets the
    session go first (``not_running``: the sender switches it itself then)."""

    id: int
    session_id: str
    epoch: int
    mode: str
    who: str | None
    status: str
    previous: str | None = None


class ModeRequests(Protocol):
    """Permission-mode switches for a turn that a worker runs, sent from a host."""

    async def request_mode(
        self, *, session_id: str, mode: str, who: str | None
    ) -> ModeRequest | None:
        """Record a switch for the turn the session's current lease runs; None when
        nobody holds the lease (the sender commits the switch itself)."""
        ...

    async def pending_modes(self, *, lease: SessionLease) -> list[ModeRequest]:
        """The undelivered switches for ``lease``'s grant, oldest first."""
        ...

    async def settle_mode(
        self, *, request_id: int, status: str, previous: str | None = None
    ) -> None: ...

    async def get_mode_request(self, *, request_id: int) -> ModeRequest | None: ...


class ControlPlane(
    Lifecycle,
    SessionLeases,
    Wakes,
    Schedules,
    SessionIndex,
    Approvals,
    Tokens,
    GlobalAuthorities,
    Steers,
    SessionCancels,
    Secrets,
    FollowUps,
    ModeRequests,
    Protocol,
):
    """All of the control plane: what ``SqliteControlPlane`` and
    ``PostgresControlPlane`` implement. A part that needs less takes the narrow protocol
    it uses (a worker's approver takes ``Approvals``). Every method is keyword-only;
    failures of the database are ``ControlPlaneError``."""
