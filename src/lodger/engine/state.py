"""``SessionState``: the one fold of a session's log.

Every reader of a session asks the same questions of its log: is a turn open, which run
is the latest and is it still open, how many steps has the turn taken, which tools has
it activated, which call ids are taken, what is the state of every call, what did the
context projection elide last, where is the head. ``SessionState`` answers all of them
from one pass, and the journal feeds it each committed batch, so a run never re-reads
its log and a new turn on an open session costs only the events it has not seen.
A property test holds the incremental fold equal to folding the whole log at once.

A fork's history begins in its parent: ``inherit`` hands the state the ancestors' shared
events (read and checked by ``lodger.storage.forks.read_inherited``), which the context
projection puts before the session's own, so the model sees the parent's conversation
up to the fork point. Everything else (turns, calls, recovery) folds the session's own
events only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Sized

from lodger._core.bulk import cycle_collector_paused
from lodger.context import Projector
from lodger.engine.history import History
from lodger.engine.queue import QueuedMessage, fold_queue
from lodger.events import (
    ALWAYS_REASON,
    EMPTY_PREFIX,
    ArtifactStored,
    CallRejected,
    ContextCompacted,
    Event,
    ForkParent,
    MessageQueued,
    ModelOutput,
    OperatorDecision,
    OutputRejected,
    PermissionDecided,
    PermissionMode,
    PermissionModeChanged,
    PermissionRequested,
    Prefix,
    ProviderRetried,
    QueueChanged,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    TurnEnded,
    TurnStarted,
    WorkspaceSnapshot,
)
from lodger.recovery.classify import CallClassifier, CallState
from lodger.recovery.plan import RecoveryPlan, plan_calls

__all__ = ["SessionState"]

#: body classes only the call states fold (exact classes: anything else, a subclass
#: included, goes through the checks below as before)
_CALLS_ONLY: frozenset[type] = frozenset(
    {
        ToolDispatched,
        ToolResponded,
        CallRejected,
        PermissionRequested,
        ProviderRetried,
        RecoveryObserved,
        RecoveryDecided,
        OperatorDecision,
        ArtifactStored,
        WorkspaceSnapshot,
        OutputRejected,
    }
)


class SessionState:
    """The verified events of one session and everything folded from them."""

    def __init__(
        self, session_id: str, events: Iterable[Event] = (), *, history: History | None = None
    ) -> None:
        self.session_id = session_id
        #: every event folded, in offset order; ``history`` (a checkpoint's) may hold
        #: events not decoded yet, whose fold the caller restores
        self.events = history if history is not None else History()
        #: the offset the session's stored checkpoint covers (0: none known)
        self.checkpoint_offset = 0
        #: where the session works: its first workspace, or the latest relocation's
        self.workspace: str | None = None
        self.workspace_id: str | None = None
        #: the open turn (None when the last turn ended) and where it started
        self.open_turn: str | None = None
        self.open_turn_offset: int | None = None
        self.last_run_id: str | None = None
        self.run_open = False
        self.last_model: str | None = None
        self.turns = 0
        self.last_turn_status: str | None = None
        #: steps started and tools activated in the latest turn
        self.turn_steps = 0
        self.turn_activated: list[str] = []
        self.call_ids: set[str] = set()
        self.last_elided: tuple[str, ...] = ()
        #: tool -> offset of the fact by which the user allowed it for the whole session
        self.always_allowed: dict[str, int] = {}
        #: the offset of the latest ``permission_mode_changed`` (None: never switched), and
        #: of the one in force when the latest step started: a switch applies from the
        #: first step that starts after it in the log
        self.permission_mode_at: int | None = None
        self.step_mode_at: int | None = None
        #: the step id of the latest ``step_started``
        self.last_step_id: str | None = None
        #: the fork point this session started from (None: not a fork)
        self.parent: ForkParent | None = None
        #: the ancestors' shared events, oldest first, once ``inherit`` gave them
        self.inherited: tuple[Event, ...] | None = None
        #: the follow-up queue, in the order it runs (``lodger.engine.steering``)
        self.queue: list[QueuedMessage] = []
        # a closure over the list, not a bound method: the fold holds no reference cycle,
        # so a fold a service drops is freed at once, without waiting for a full collection
        folded = self.events
        self._calls = CallClassifier(session_id, lambda offset: folded.digest_at(offset))
        #: the bytes of the images and documents in the model's context, by sha256 (read
        #: from the artifact store before a projection needs them: ``lodger.engine.media``)
        self.media: dict[str, bytes] = {}
        self.projector = Projector(self.events, media=self.media)
        self.feed(events)

    @property
    def needs_inheritance(self) -> bool:
        """A fork whose ancestors' events have not been handed to ``inherit`` yet."""
        return self.parent is not None and self.inherited is None

    def inherit(self, events: Sequence[Event]) -> None:
        """Put the ancestors' shared events (oldest first) before this session's own in
        the model's context; their call ids stay taken, so results pair unambiguously."""
        self.inherited = tuple(events)
        for e in events:
            if isinstance(e.body, ModelOutput):
                self.call_ids.update(c.call_id for c in e.body.calls)
        self.projector = Projector(self.events, prefix=self.inherited, media=self.media)

    @property
    def head(self) -> Prefix:
        if not self.events:
            return EMPTY_PREFIX
        return Prefix(high_water=len(self.events), digest=self.events[-1].digest)

    @property
    def permission_mode(self) -> PermissionMode | None:
        """The session's permission mode now (None: never switched: the policy alone)."""
        return self._mode_at(self.permission_mode_at)

    def mode_of_step(self, step_id: str | None) -> PermissionMode | None:
        """The permission mode the calls of step ``step_id`` are checked under: the mode
        in force when its ``step_started`` was committed. A step whose start is not
        committed yet (it is deferred, and commits with the first fact after it: any
        commit, a switch included, takes it along) starts under the mode now."""
        if step_id is not None and step_id == self.last_step_id:
            return self._mode_at(self.step_mode_at)
        return self.permission_mode

    def _mode_at(self, offset: int | None) -> PermissionMode | None:
        if offset is None:
            return None
        body = self.events[offset].body
        assert isinstance(body, PermissionModeChanged)
        return body.mode

    @property
    def calls(self) -> dict[str, CallState]:
        return self._calls.calls

    @property
    def accepted_open(self) -> Mapping[str, CallState]:
        """Calls the remote side accepted whose result has not been recorded yet, by
        operation id."""
        return self._calls.accepted_open

    def feed(self, events: Iterable[Event]) -> None:
        """Fold newly committed events, in offset order."""
        # Folding a long log builds a call state per call while every event stays alive:
        # automatic cycle collections would rescan that growing heap again and again.
        # (a list first: an ABC check costs more than the rest of this for one append)
        count = len(events) if type(events) is list or isinstance(events, Sized) else 0
        with cycle_collector_paused(count):
            self._feed(events)

    def _feed(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.offset != len(self.events):
                raise ValueError(
                    f"session {self.session_id!r}: fold expected offset {len(self.events)}, "
                    f"got {e.offset}"
                )
            self.events.append(e)
            self._calls.feed(e)  # fails closed on an inconsistent log, naming the offset
            body = e.body
            if type(body) in _CALLS_ONLY:  # most of a call's events: nothing more here
                continue
            if isinstance(body, ModelOutput):
                self.call_ids.update(c.call_id for c in body.calls)
            elif isinstance(body, TurnStarted):
                self.open_turn, self.open_turn_offset = e.turn_id, e.offset
                self.last_run_id, self.run_open = None, False
                self.turns += 1
                self.turn_steps = 0
                self.turn_activated = []
            elif isinstance(body, RunStarted):
                self.last_run_id, self.run_open = e.run_id, True
                self.last_model = body.model
                if body.workspace_id is not None:  # a relocation: the session moved
                    self.workspace, self.workspace_id = body.workspace, body.workspace_id
            elif isinstance(body, StepStarted):
                self.step_mode_at, self.last_step_id = self.permission_mode_at, e.step_id
                if e.turn_id == self.open_turn:
                    self.turn_steps += 1
            elif isinstance(body, ToolsActivated):
                if e.turn_id == self.open_turn:
                    self.turn_activated.extend(
                        n for n in body.names if n not in self.turn_activated
                    )
            elif isinstance(body, RunEnded):
                self.run_open = False
            elif isinstance(body, TurnEnded):
                self.open_turn = self.open_turn_offset = None
                self.last_run_id, self.run_open = None, False
                self.last_turn_status = body.status
            elif isinstance(body, ContextCompacted):
                self.last_elided = body.elided_call_ids
            elif isinstance(body, (MessageQueued, QueueChanged)):
                fold_queue(self.queue, e)
            elif isinstance(body, PermissionDecided):
                if (body.by, body.decision, body.reason) == ("user", "allow", ALWAYS_REASON):
                    self.always_allowed.setdefault(body.tool, e.offset)
            elif isinstance(body, PermissionModeChanged):
                self.permission_mode_at = e.offset
            elif isinstance(body, SessionStarted) and e.offset == 0:
                self.workspace, self.workspace_id = body.workspace, body.workspace_id
                self.parent = body.parent

    def plan(self) -> RecoveryPlan:
        """The recovery plan of the open turn, from the folded call states."""
        return plan_calls(
            session_id=self.session_id,
            prefix=self.head,
            turn_id=self.open_turn,
            last_run_id=self.last_run_id,
            run_open=self.run_open,
            calls=self.calls,
        )

    def used_tools(self) -> list[str]:
        """Every tool the history dispatched, sorted."""
        return sorted(self._calls.dispatched_tools)

    def snapshot(self) -> dict[str, object]:
        """The folded facts as plain values (what the property test compares)."""
        return {
            "head": self.head,
            "workspace": (self.workspace, self.workspace_id),
            "open_turn": (self.open_turn, self.open_turn_offset),
            "run": (self.last_run_id, self.run_open, self.last_model),
            "turns": (self.turns, self.last_turn_status),
            "turn": (self.turn_steps, tuple(self.turn_activated)),
            "call_ids": frozenset(self.call_ids),
            "permission_mode": (self.permission_mode_at, self.step_mode_at, self.last_step_id),
            "last_elided": self.last_elided,
            "plan": self.plan().to_dict(),
            "used_tools": tuple(self.used_tools()),
        }
