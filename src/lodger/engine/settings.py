"""Settings: the few frozen groups an agent's runs are configured with.

    Agent(
        model=model,
        tools=tools,
        limits=Limits(max_steps=20, context_budget=60_000),
        retries=Retries(max_retries=2),
        hooks=Hooks(before_call=[guard], on_event=print),
        services=Services(clock=ManualClock(), ids=SequentialIds()),
    )

Each group is a frozen, keyword-only value with a default for every field, passed whole
from the agent to the engine and from the engine to the call pipeline, which read its
fields where they are used: a new setting is one new field in one group. A change for
one run (a subagent's step budget, a stream's sinks) is ``dataclasses.replace`` of the
group.

They live in the engine because the engine reads them and their types are its own (hooks,
approver, executor); what only the agent binds (code mode, subagents) stays on ``Agent``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lodger.authority import Authorities
from lodger.engine.budgets import Budgets, UsageLimits
from lodger.engine.compaction import CompactionPolicy
from lodger.engine.steering import RunningTurns
from lodger.ids import Clock, IdFactory, SystemClock, Uuid7Factory
from lodger.media import MediaLimits
from lodger.substrates.inprocess import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from lodger.engine.hooks import AfterCall, BeforeCall
    from lodger.engine.permissions import Approver
    from lodger.engine.state import SessionState
    from lodger.events import Event
    from lodger.providers.base import TextSink
    from lodger.substrates.inprocess import Executor
    from lodger.tools.spec import Elicitor

__all__ = ["Hooks", "Limits", "Retries", "Services"]

_FROM_CLOCK: Any = object()  # Services.ids unset: UUIDv7 from the group's clock


@dataclass(frozen=True, kw_only=True)
class Limits:
    """How far a turn and its calls may go."""

    #: model steps per turn; the turn ends ``step_limit`` past them
    max_steps: int = 50
    #: tokens the model's context is compacted to (older tool results elided); None: all
    context_budget: int | None = None
    #: seconds a call may run when its tool sets no ``timeout``
    default_timeout: float = DEFAULT_TIMEOUT
    #: times a final answer that fails the output type goes back to the model
    output_retries: int = 2
    #: requests, tokens and tool calls per turn; past one the turn parks (lodger.engine.budgets)
    usage: UsageLimits = field(default_factory=UsageLimits)
    #: money per session, subagent tree and UTC day; past one the turn parks
    budgets: Budgets = field(default_factory=Budgets)
    #: the images and documents a turn's input and a tool's result may carry
    media: MediaLimits = field(default_factory=MediaLimits)
    #: when and how the context is compacted into a summary (``lodger.engine.compaction``;
    #: ``Agent(compaction=...)`` sets it); None: never, only ``context_budget``'s elision
    compaction: CompactionPolicy | None = None


@dataclass(frozen=True, kw_only=True)
class Retries:
    """How a model request that failed for a retryable reason (rate limit, overload, a
    dropped connection) is tried again: exponential backoff from ``base_delay`` with
    ``jitter``, or the provider's ``Retry-After``; each retry is a ``provider_retried``
    fact."""

    #: retries of one request before the turn fails
    max_retries: int = 4
    #: seconds before the first retry (doubled each time)
    base_delay: float = 0.5
    #: a ``Retry-After`` longer than this gives up at once instead of waiting
    max_retry_after: float = 120.0
    #: a number in [0, 1) per retry: spreads clients that failed together apart
    jitter: Callable[[], float] = random.random
    #: how the run waits between attempts (a test's no-op makes retries instant)
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """Your code, called by the runs: around each call, on each committed event and
    text delta, and to answer a permission ``ask``."""

    #: before a call is dispatched: return ``Veto``, ``Rewrite`` or None (lodger.engine.hooks)
    before_call: Sequence[BeforeCall] = ()
    #: after a call settled: return new content for T2, or None
    after_call: Sequence[AfterCall] = ()
    #: every committed event, in order
    on_event: Callable[[Event], None] | None = None
    #: the model's text as it streams
    on_text: TextSink | None = None
    #: answers a call the permission policy asks about; None (not interactive): denied
    approver: Approver | None = None
    #: answers a question a tool asks a person while a call runs (an MCP elicitation);
    #: None: nobody can answer here, so the tool's policy declines it
    elicitor: Elicitor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "before_call", tuple(self.before_call))
        object.__setattr__(self, "after_call", tuple(self.after_call))


@dataclass(frozen=True, kw_only=True)
class Services:
    """What the runs use besides storage: where times and new ids come from (inject a
    ``ManualClock`` and ``SequentialIds`` for a reproducible log), the authorities calls
    meet on, the executor they run in, and the folds kept between turns."""

    clock: Clock = field(default_factory=SystemClock)
    #: new ids (default: UUIDv7 from ``clock``)
    ids: IdFactory = _FROM_CLOCK
    #: file leases, actors and capacity; give agents that share a workspace the same one
    authorities: Authorities = field(default_factory=Authorities)
    #: where a call runs (None: in this process)
    executor: Executor | None = None
    #: the verified fold of each open session, kept between turns; share one mapping to
    #: share them between agents (``Sessions`` does); None: the agent's own
    folds: MutableMapping[str, SessionState] | None = None
    #: the turns running here, by session (``lodger.engine.steering``): steers, queued
    #: messages, a cancel and a permission-mode switch find them there; share one to
    #: reach from one agent the turns another runs (``Sessions`` does)
    turns: RunningTurns = field(default_factory=RunningTurns)

    def __post_init__(self) -> None:
        if self.ids is _FROM_CLOCK:
            object.__setattr__(self, "ids", Uuid7Factory(self.clock))
