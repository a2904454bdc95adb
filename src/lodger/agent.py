"""The agent: Reason -> Act -> Observe over turns, runs and steps.

>>> agent = Agent(model=ScriptedModel([{"text": "hello"}]), tools=[add])
>>> result = await agent.run("say hello")
>>> result.answer
'hello'

A turn is one user input and everything until the agent answers, fails, hits its step
limit or is stopped. Each step fixes its visible tools, asks the model for the next
output from a projection of the committed log, and runs the proposed calls as one
batch through the tool boundary. Every fact is committed before anything acts on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lodger.authority import Authorities
from lodger.context import Projector
from lodger.engine.journal import Journal
from lodger.engine.permissions import Approver, PermissionPolicy
from lodger.engine.pipeline import StepScope, ToolRuntime
from lodger.engine.resume import Decision, decide, resume_locked
from lodger.errors import CommitFailedError, ProviderError
from lodger.events import (
    ContextCompacted,
    Event,
    ModelOutput,
    ProposedCall,
    ProviderRetried,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolRef,
    ToolsActivated,
    TurnEnded,
    TurnStarted,
)
from lodger.ids import Clock, IdFactory, SystemClock, Uuid7Factory
from lodger.providers.base import Model, ModelRequest, ModelResponse, TextSink
from lodger.recovery.plan import RecoveryPlan, plan_recovery
from lodger.storage import EventLog, SqliteLogStore
from lodger.storage.artifacts import ArtifactStore, FileArtifactStore, MemoryArtifactStore
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import attach_tool_search, searches_first
from lodger.tools.spec import Tool
from lodger.tools.workspace import workspace_id

__all__ = ["DEFAULT_SYSTEM", "Agent", "SessionHandle", "TurnResult", "open_turn"]

DEFAULT_SYSTEM = (
    "You are a careful software agent working in a workspace. Use the tools to inspect and "
    "change files; prefer small, verifiable steps. Calls you make in one step run in "
    "parallel, so only batch calls that do not depend on each other. When the task is "
    "done, answer with a short summary of what you did."
)

TurnStatus = Literal["completed", "failed", "cancelled", "step_limit", "abandoned"]


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    session_id: str
    turn_id: str
    run_id: str
    status: TurnStatus
    answer: str | None = None
    error: str | None = None


def open_turn(events: Sequence[Event]) -> tuple[str, int] | None:
    """The id and offset of the session's last turn if it has not ended, else None."""
    for event in reversed(events):
        if isinstance(event.body, TurnEnded):
            return None
        if isinstance(event.body, TurnStarted):
            assert event.turn_id is not None
            return event.turn_id, event.offset
    return None


class SessionHandle:
    """Read access to one session's log."""

    def __init__(self, log: EventLog, session_id: str) -> None:
        self.log = log
        self.session_id = session_id

    async def events(self) -> list[Event]:
        return await self.log.read_all(self.session_id)

    async def verify(self) -> tuple[int, str]:
        prefix = await self.log.verify(self.session_id)
        return prefix.high_water, prefix.digest


class Agent:
    """A model, bound tools and a place to keep sessions.

    ``state_dir`` (default ``.lodger``) holds the SQLite log and the artifacts unless a
    ``log`` and ``artifacts`` store are passed. ``workspace`` is the directory file tools
    work in. Nothing here is global: clocks and ids are injected for tests.
    """

    def __init__(
        self,
        *,
        model: Model,
        tools: Sequence[Tool] = (),
        system: str = DEFAULT_SYSTEM,
        state_dir: str | os.PathLike[str] = ".lodger",
        log: EventLog | None = None,
        artifacts: ArtifactStore | None = None,
        workspace: str | os.PathLike[str] | None = None,
        permissions: PermissionPolicy | None = None,
        approver: Approver | None = None,
        max_steps: int = 50,
        context_budget: int | None = None,
        max_provider_retries: int = 4,
        retry_base_delay: float = 0.5,
        clock: Clock | None = None,
        ids: IdFactory | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_text: TextSink | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        authorities: Authorities | None = None,
    ) -> None:
        self.model = model
        self.registry = ToolRegistry(tools)
        # Deferred tools are found through tool_search and listed in the system prompt.
        self.tool_search = attach_tool_search(self.registry)
        self.system = system
        self.state_dir = Path(state_dir)
        self._owns_log = log is None
        self.log = log or EventLog(SqliteLogStore(self.state_dir))
        if artifacts is None:
            artifacts = (
                FileArtifactStore(self.state_dir / "artifacts")
                if self._owns_log
                else MemoryArtifactStore()
            )
        self.artifacts = artifacts
        self.workspace = Path(workspace).resolve() if workspace is not None else None
        self.permissions = permissions or PermissionPolicy()
        self.approver = approver
        self.max_steps = max_steps
        self.context_budget = context_budget
        self.max_provider_retries = max_provider_retries
        self.retry_base_delay = retry_base_delay
        self.clock = clock or SystemClock()
        self.ids = ids or Uuid7Factory(self.clock)
        self.on_event = on_event
        self.on_text = on_text
        self._sleep = sleep
        # File leases, actors and capacity for this agent's calls; pass one Authorities to
        # every agent that shares the workspace so their calls meet on the same leases.
        self.authorities = authorities or Authorities()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_log:
            await self.log.close()

    def session(self, session_id: str) -> SessionHandle:
        return SessionHandle(self.log, session_id)

    # ------------------------------------------------------------------ turns

    async def run(self, task: str, *, session: str | None = None) -> TurnResult:
        """Run one turn of ``task`` on ``session`` (a new session when None)."""
        session_id = session or self.ids.new_id()
        writer = await self.log.open_writer(session_id)
        try:
            journal = Journal(
                writer,
                writer.initial_events,
                clock=self.clock,
                ids=self.ids,
                on_event=self.on_event,
            )
            if not journal.events:
                # Committed with the turn's first facts: a session never exists without
                # its first turn, even if the process dies right here.
                journal.defer(
                    journal.draft(
                        SessionStarted(
                            workspace=str(self.workspace) if self.workspace else None,
                            workspace_id=_workspace_id(self.workspace),
                        )
                    )
                )
            elif open_turn(journal.events) is not None:
                # An interrupted turn is finished first, through resume (never a retry).
                resumed = await resume_locked(self, writer)
                if resumed.status != "completed":
                    return resumed
                journal = Journal(
                    writer,
                    await self.log.read(session_id),
                    clock=self.clock,
                    ids=self.ids,
                    on_event=self.on_event,
                )
            turn_id, run_id = self.ids.new_id(), self.ids.new_id()
            await journal.record(
                journal.draft(TurnStarted(input=task), turn_id=turn_id),
                journal.draft(
                    RunStarted(model=self.model.spec, tools=tuple(self.registry.names())),
                    turn_id=turn_id,
                    run_id=run_id,
                ),
            )
            return await self.drive(journal, turn_id=turn_id, run_id=run_id)
        finally:
            await writer.close()

    async def resume(self, session_id: str) -> TurnResult:
        """Resume the session's interrupted turn as a new run (see ``lodger.recovery``).

        Raises ``ResumeBlockedError`` naming every parked operation or failed invariant.
        """
        writer = await self.log.open_writer(session_id)
        try:
            return await resume_locked(self, writer)
        finally:
            await writer.close()

    async def recovery_plan(self, session_id: str) -> RecoveryPlan:
        """What resume would do now: every call of the open turn, its status and action."""
        return plan_recovery(await self.log.read_all(session_id))

    async def decide(
        self,
        session_id: str,
        call_id: str,
        decision: Decision,
        *,
        result: str | None = None,
    ) -> list[Event]:
        """Record an operator decision on a parked (or indeterminate) call."""
        return await decide(
            self.log, session_id, call_id, decision, result=result, clock=self.clock, ids=self.ids
        )

    def tool_runtime(self, journal: Journal, *, turn_id: str, run_id: str) -> ToolRuntime:
        return ToolRuntime(
            journal=journal,
            registry=self.registry,
            permissions=self.permissions,
            approver=self.approver,
            artifacts=self.artifacts,
            workspace=self.workspace,
            turn_id=turn_id,
            run_id=run_id,
            authorities=self.authorities,
            hidden=(self.state_dir.resolve(),),
        )

    async def drive(self, journal: Journal, *, turn_id: str, run_id: str) -> TurnResult:
        """Run steps of an open turn until it settles. Resume uses this too."""
        runtime = self.tool_runtime(journal, turn_id=turn_id, run_id=run_id)
        env = {"turn_id": turn_id, "run_id": run_id}
        result = _Result(journal.session_id, turn_id, run_id)
        projector = Projector(journal.events)
        turn = _TurnState(turn_id)
        try:
            while True:
                steps_done, activated = turn.update(journal.events)
                if steps_done >= self.max_steps:
                    return await result.end(
                        journal, "step_limit", error=f"stopped after {self.max_steps} steps"
                    )
                visible = self.registry.visible(activated)
                step_id = self.ids.new_id()
                journal.defer(
                    journal.draft(
                        StepStarted(
                            index=steps_done,
                            model=self.model.spec,
                            tools=tuple(
                                ToolRef(name=t.name, schema_digest=t.schema_digest())
                                for t in visible
                            ),
                        ),
                        step_id=step_id,
                        **env,
                    )
                )
                request = await self._request(journal, projector, visible, env, step_id)
                response = await self._complete(journal, request, env, step_id)
                response = _storable(response)
                calls = turn.unique_calls(response.calls, self.ids)
                # Deferred: it commits atomically with the first fact of its batch (the
                # first T1 or rejection) or with the end of the turn, saving one sync.
                journal.defer(
                    journal.draft(
                        ModelOutput(
                            text=response.text,
                            reasoning=response.reasoning,
                            calls=calls,
                            usage=response.usage,
                            finish_reason=response.finish_reason,
                            provider_state=response.provider_state,
                        ),
                        step_id=step_id,
                        origin="provider",
                        **env,
                    )
                )
                if not calls:
                    return await result.end(journal, "completed", answer=response.text)
                scope = StepScope(step_id=step_id, visible=frozenset(t.name for t in visible))
                for batch in searches_first(calls):
                    await runtime.run_batch(batch, scope)
        except ProviderError as exc:
            return await result.end(journal, "failed", error=str(exc))
        except asyncio.CancelledError:
            if journal.failure is None:
                await result.end(journal, "cancelled", error="stopped by the user")
            raise
        except CommitFailedError:
            raise  # the turn stays open in the log; recovery takes it from here

    async def _request(
        self,
        journal: Journal,
        projector: Projector,
        visible: Sequence[Tool],
        env: dict[str, str],
        step_id: str,
    ) -> ModelRequest:
        projection = projector.project(budget_tokens=self.context_budget)
        if projection.elided_call_ids and projection.elided_call_ids != _last_elided(
            journal.events
        ):
            assert self.context_budget is not None
            await journal.fact(
                ContextCompacted(
                    elided_call_ids=projection.elided_call_ids,
                    budget_tokens=self.context_budget,
                    estimated_tokens=projection.estimated_tokens,
                ),
                step_id=step_id,
                **env,
            )
        return ModelRequest(
            system=self.system
            if self.tool_search is None
            else self.tool_search.system(self.system),
            messages=projection.messages,
            tools=tuple(t.schema() for t in visible),
        )

    async def _complete(
        self, journal: Journal, request: ModelRequest, env: dict[str, str], step_id: str
    ) -> ModelResponse:
        attempt = 0
        while True:
            try:
                return await self.model.complete(request, on_text=self.on_text)
            except ProviderError as exc:
                attempt += 1
                if not exc.retryable or attempt > self.max_provider_retries:
                    raise
                delay = min(self.retry_base_delay * 2 ** (attempt - 1), 30.0)
                await journal.fact(
                    ProviderRetried(attempt=attempt, error=str(exc), delay_ms=int(delay * 1000)),
                    step_id=step_id,
                    **env,
                )
                await self._sleep(delay)


@dataclass
class _Result:
    session_id: str
    turn_id: str
    run_id: str

    async def end(
        self,
        journal: Journal,
        status: TurnStatus,
        *,
        answer: str | None = None,
        error: str | None = None,
    ) -> TurnResult:
        env = {"turn_id": self.turn_id, "run_id": self.run_id}
        await journal.record(
            journal.draft(RunEnded(status=status, error=error), **env),
            journal.draft(TurnEnded(status=status, answer=answer), **env),
        )
        return TurnResult(
            session_id=self.session_id,
            turn_id=self.turn_id,
            run_id=self.run_id,
            status=status,
            answer=answer,
            error=error,
        )


class _TurnState:
    """Steps taken and tools activated in one turn, and the call ids the session has
    used, folded from new events only."""

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.steps = 0
        self.activated: list[str] = []
        self.call_ids: set[str] = set()
        self._seen = 0

    def update(self, events: Sequence[Event]) -> tuple[int, list[str]]:
        for e in events[self._seen :]:
            if isinstance(e.body, ModelOutput):
                self.call_ids.update(c.call_id for c in e.body.calls)
            if e.turn_id != self.turn_id:
                continue
            if isinstance(e.body, StepStarted):
                self.steps += 1
            elif isinstance(e.body, ToolsActivated):
                self.activated.extend(n for n in e.body.names if n not in self.activated)
        self._seen = len(events)
        return self.steps, list(self.activated)

    def unique_calls(
        self, calls: Sequence[ProposedCall], ids: IdFactory
    ) -> tuple[ProposedCall, ...]:
        """The calls with ids unique in the session.

        Results are paired to calls by id for the whole session, so an id a server reuses
        (some OpenAI-compatible servers number calls per response) or leaves empty gets a
        fresh one; the model sees the renamed id in its history from then on.
        """
        out: list[ProposedCall] = []
        for call in calls:
            if not call.call_id or call.call_id in self.call_ids:
                call = call.model_copy(update={"call_id": f"call-{ids.new_id()}"})
            self.call_ids.add(call.call_id)
            out.append(call)
        return tuple(out)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """Text as valid UTF-8: a lone surrogate (a provider may decode one from a JSON escape)
    cannot be stored, so it becomes U+FFFD instead of failing the turn."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _storable(response: ModelResponse) -> ModelResponse:
    calls = tuple(
        c.model_copy(
            update={
                "call_id": _clean(c.call_id),
                "name": _clean(c.name),
                "arguments": _clean(c.arguments),
            }
        )
        for c in response.calls
    )
    return dataclasses.replace(
        response, text=_clean(response.text), reasoning=_clean(response.reasoning), calls=calls
    )


def _last_elided(events: Sequence[Event]) -> tuple[str, ...]:
    for e in reversed(events):
        if isinstance(e.body, ContextCompacted):
            return e.body.elided_call_ids
    return ()


def _workspace_id(workspace: Path | None) -> str | None:
    return None if workspace is None else workspace_id(workspace)
