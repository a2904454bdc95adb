"""The path of one call (DESIGN section 4), and the batch of one step.

    binding -> visibility -> arguments -> permission -> resources -> T1 -> execute -> T2

Each failed check becomes a ``call_rejected`` fact and an error result the model sees on
its next step; nothing raises out of here except a failed commit (which stops the turn)
and cancellation. A call's result reaches the model only through the projection of
committed events, so "T2 before the model sees it" holds by construction.

Resources: a call's claims are computed with the synchronous checks and reserved with the
authorities (``lodger.authority``) in the model's emission order before any call of the
batch runs; each call acquires them after its permission and holds them until its T2 is
committed, so conflicting calls run in emission order and independent ones never wait.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from lodger.authority import Authorities, AuthorityStatistics, Reservation, ResourceClaim
from lodger.engine.batch import Batch, Slot
from lodger.engine.journal import Journal
from lodger.engine.permissions import Approver, PermissionPolicy
from lodger.errors import AuthorityMisuseError, CommitFailedError, ToolCallError
from lodger.events import (
    ArtifactRef,
    CallRejected,
    FileExpectation,
    Origin,
    PermissionDecided,
    PermissionRequested,
    ProposedCall,
    ResultStatus,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    Visibility,
    canonical_json,
)
from lodger.storage.artifacts import ArtifactStore
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import ACTIVATION_SCOPE, StepActivations
from lodger.tools.spec import Tool, ToolContext, ToolOutput

__all__ = ["CallOutcome", "StepScope", "ToolRuntime"]

PREVIEW_CHARS = 4_000


@dataclass
class StepScope:
    """What the proposing step allowed: its visible names, fixed when the step started."""

    step_id: str
    visible: frozenset[str]
    activated_here: set[str] = field(default_factory=set)


@dataclass(frozen=True, kw_only=True)
class CallOutcome:
    call_id: str
    name: str
    status: ResultStatus | None  # None: rejected before dispatch
    content: str
    dispatched: bool

    @property
    def is_error(self) -> bool:
        return self.status != "ok"


@dataclass(frozen=True)
class _Rejection(Exception):
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class _Rejected:
    """A call that failed a synchronous check; its rejection is recorded when it runs."""

    call: ProposedCall
    env: dict[str, Any]
    rejection: _Rejection


@dataclass(frozen=True, kw_only=True)
class _Ready:
    """A call that passed the synchronous checks, with its claims reserved."""

    call: ProposedCall
    env: dict[str, Any]
    tool: Tool
    arguments: dict[str, Any]
    ctx: ToolContext
    reservation: Reservation


class ToolRuntime:
    """Runs calls for one run of one turn; all facts go through the run's journal."""

    def __init__(
        self,
        *,
        journal: Journal,
        registry: ToolRegistry,
        permissions: PermissionPolicy,
        approver: Approver | None,
        artifacts: ArtifactStore,
        workspace: Path | None,
        turn_id: str,
        run_id: str,
        result_limit: int = 16_000,
        authorities: Authorities | None = None,
        hidden: tuple[Path, ...] = (),
    ) -> None:
        self.journal = journal
        self.registry = registry
        self.permissions = permissions
        self.approver = approver
        self.artifacts = artifacts
        self.workspace = workspace
        self.turn_id = turn_id
        self.run_id = run_id
        self.result_limit = result_limit
        self.authorities = authorities or Authorities()
        self.hidden = hidden
        self._validators: dict[str, Draft202012Validator] = {}
        self._approval_lock = asyncio.Lock()

    # ------------------------------------------------------------ batch

    async def run_batch(self, calls: Sequence[ProposedCall], scope: StepScope) -> list[CallOutcome]:
        """Run one step's calls concurrently; outcomes come back in emission order.

        A failed commit in any call stops the calls that have not reached T1, lets running
        calls settle, and then raises ``CommitFailedError``. Cancellation never abandons a
        call past T1: it settles and its outcome is recorded first.
        """
        # Every call is checked and its claims reserved, in emission order, before any
        # call runs: conflicting calls then acquire in the order the model emitted them,
        # however long each one's permission takes.
        prepared = [self._prepare(call, scope) for call in calls]
        batch: Batch[CallOutcome] = Batch([call.call_id for call in calls])

        async def one(slot: Slot[CallOutcome]) -> CallOutcome:
            return await self._run_prepared(prepared[slot.index], halt=batch.halt, slot=slot)

        try:
            return await batch.run(one)
        finally:
            for entry in prepared:  # a task cancelled before it started never closed its own
                if isinstance(entry, _Ready):
                    entry.reservation.close()

    def authority_stats(self) -> tuple[AuthorityStatistics, ...]:
        """Who holds and who waits for which resources now, and counters so far."""
        return self.authorities.statistics()

    # ------------------------------------------------------------ one call

    def _envelope(
        self,
        call_id: str,
        scope: StepScope | None,
        parent_call_id: str | None,
        origin: Origin,
        visibility: Visibility,
    ) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "run_id": self.run_id,
            "step_id": scope.step_id if scope else None,
            "call_id": call_id,
            "parent_call_id": parent_call_id,
            "origin": origin,
            "visibility": visibility,
        }

    async def run_call(
        self,
        call: ProposedCall,
        *,
        scope: StepScope,
        halt: asyncio.Event | None = None,
        parent_call_id: str | None = None,
        origin: Origin = "provider",
        visibility: Visibility = "model",
    ) -> CallOutcome:
        """Run one call on its own (a batch of one, or a nested call of a code cell)."""
        prepared = self._prepare(call, scope, parent_call_id, origin, visibility)
        return await self._run_prepared(prepared, halt=halt)

    def _prepare(
        self,
        call: ProposedCall,
        scope: StepScope,
        parent_call_id: str | None = None,
        origin: Origin = "provider",
        visibility: Visibility = "model",
    ) -> _Ready | _Rejected:
        """The synchronous checks (binding, visibility, arguments), then the claims.

        Claims are pure functions of the validated arguments, so they are computed now and
        reserved with the authorities at once: a batch prepares its calls in emission
        order, which is the order conflicting calls will acquire in. Nothing is granted
        here; that waits for permission.
        """
        env = self._envelope(call.call_id, scope, parent_call_id, origin, visibility)
        try:
            t, arguments = self._check(call, scope)
            ctx = ToolContext(
                session_id=self.journal.session_id,
                turn_id=self.turn_id,
                run_id=self.run_id,
                call_id=call.call_id,
                operation_id=self.journal.ids.new_id(),
                workspace=self.workspace,
                hidden=self.hidden,
                parent_call_id=parent_call_id,
                extras={ACTIVATION_SCOPE: self._activations(scope, env)},
            )
            claims = self._claims(t, arguments, ctx)
            try:
                reservation = self.authorities.reserve(self._owner(call.call_id), claims)
            except AuthorityMisuseError:
                raise _Rejection(
                    "duplicate_call",
                    f"call id {call.call_id!r} is already in use by a running call; "
                    "give every call its own id",
                ) from None
        except _Rejection as rejection:
            return _Rejected(call=call, env=env, rejection=rejection)
        return _Ready(
            call=call, env=env, tool=t, arguments=arguments, ctx=ctx, reservation=reservation
        )

    async def _run_prepared(
        self,
        prepared: _Ready | _Rejected,
        *,
        halt: asyncio.Event | None = None,
        slot: Slot[CallOutcome] | None = None,
    ) -> CallOutcome:
        """permission -> resources -> T1 -> execute -> T2; leases end with the call."""
        call, env = prepared.call, prepared.env
        try:
            if isinstance(prepared, _Rejected):
                rejection = prepared.rejection
            else:
                t, arguments, ctx = prepared.tool, prepared.arguments, prepared.ctx
                try:
                    await self._permit(t, arguments, env)
                    self._stop_if_halted(call, halt)
                    # Leases: after permission, before T1 (and before the expectations,
                    # which hash the files the leases protect).
                    await prepared.reservation.acquire()
                    expectations = await self._expectations(t, arguments, ctx)
                except _Rejection as exc:
                    rejection = exc
                else:
                    self._stop_if_halted(call, halt)
                    if slot is not None:
                        slot.dispatch()
                    return await self._dispatch(
                        t,
                        arguments,
                        ctx,
                        env,
                        resources=prepared.reservation.resources(),
                        expectations=tuple(expectations),
                    )
            await self.journal.fact(
                CallRejected(tool=call.name, reason=rejection.reason, message=rejection.message),
                **env,
            )
            return CallOutcome(
                call_id=call.call_id,
                name=call.name,
                status=None,
                content=rejection.message,
                dispatched=False,
            )
        finally:
            if isinstance(prepared, _Ready):
                prepared.reservation.close()  # after T2, or wherever the call ended

    def _stop_if_halted(self, call: ProposedCall, halt: asyncio.Event | None) -> None:
        if halt is not None and halt.is_set():
            raise CommitFailedError(
                "the batch stopped after a failed commit; this call was not dispatched",
                session_id=self.journal.session_id,
                call_id=call.call_id,
            )

    async def redispatch(
        self,
        *,
        previous: ToolDispatched,
        call_id: str,
        parent_call_id: str | None,
        origin: Origin,
        visibility: Visibility,
        attempt: int,
    ) -> CallOutcome:
        """Recovery of an ``idempotent`` operation: run it again under a new, linked T1.

        The arguments, resources and expectations are the recorded ones: the original
        step already validated and permitted this call.
        """
        t = self.registry.get(previous.tool)
        if t is None:  # resume checks bindings first; this is a guard, not a path
            raise ToolCallError(f"tool {previous.tool!r} is not bound in this run")
        ctx = ToolContext(
            session_id=self.journal.session_id,
            turn_id=self.turn_id,
            run_id=self.run_id,
            call_id=call_id,
            operation_id=self.journal.ids.new_id(),
            workspace=self.workspace,
            hidden=self.hidden,
            parent_call_id=parent_call_id,
        )
        env = self._envelope(call_id, None, parent_call_id, origin, visibility)
        arguments = dict(previous.arguments)
        try:
            claims = self._claims(t, arguments, ctx)
        except _Rejection:
            claims = ()  # the tool checks its arguments itself when it runs again
        # The same leases as a first dispatch: other sessions sharing these authorities
        # must not meet a re-run half-way.
        reservation = self.authorities.reserve(self._owner(call_id), claims)
        try:
            await reservation.acquire()
            return await self._dispatch(
                t,
                arguments,
                ctx,
                env,
                resources=previous.resources,
                expectations=previous.expectations,
                retry_of=previous.operation_id,
                attempt=attempt,
            )
        finally:
            reservation.close()

    async def _dispatch(
        self,
        t: Tool,
        arguments: dict[str, Any],
        ctx: ToolContext,
        env: dict[str, Any],
        *,
        resources: tuple[str, ...],
        expectations: tuple[FileExpectation, ...],
        retry_of: str | None = None,
        attempt: int = 1,
    ) -> CallOutcome:
        """T1, execute, T2. From T1 on the call is never abandoned."""
        t1 = self.journal.draft(
            ToolDispatched(
                operation_id=ctx.operation_id,
                tool=t.name,
                arguments=arguments,
                attempt=attempt,
                retry_of=retry_of,
                recovery=t.recovery,
                resources=resources,
                expectations=expectations,
            ),
            **env,
        )
        try:
            await self.journal.record(t1)
        except asyncio.CancelledError:
            if not any(e.id == t1.id for e in reversed(self.journal.events)):
                raise  # T1 is not in the log: the call was never dispatched
            # T1 committed as the cancellation arrived: the call is past T1, so it is not
            # abandoned; it never started, and that is what T2 records.
            await self.journal.fact(
                ToolResponded(
                    operation_id=ctx.operation_id,
                    status="cancelled",
                    content=f"{t.name} was cancelled before it started; it did not run",
                ),
                **env,
            )
            raise
        execution = asyncio.ensure_future(self._execute(t, arguments, ctx))
        cancelled = False
        while not execution.done():
            try:
                await asyncio.shield(execution)
            except asyncio.CancelledError:
                # Settle, never abandon: the tool is told to stop, and what it did is
                # recorded before the cancellation goes on.
                cancelled = True
                execution.cancel()
        status, content = execution.result()
        content, truncated, refs = await self._bound(content)
        # T2: only after this commit may the outcome reach the model.
        await self.journal.fact(
            ToolResponded(
                operation_id=ctx.operation_id,
                status=status,
                content=content,
                truncated=truncated,
                artifacts=refs,
            ),
            **env,
        )
        if cancelled:
            raise asyncio.CancelledError
        return CallOutcome(
            call_id=ctx.call_id, name=t.name, status=status, content=content, dispatched=True
        )

    def _activations(self, scope: StepScope, env: dict[str, Any]) -> StepActivations:
        """What tool_search sees of its step; its activations are facts of this call."""

        async def record(fact: ToolsActivated) -> None:
            await self.journal.fact(fact, **env)

        return StepActivations(
            visible=scope.visible, activated_here=scope.activated_here, record=record
        )

    # ------------------------------------------------------------ checks

    def _owner(self, call_id: str) -> str:
        # Authorities may be shared by sessions; call ids are only unique in one session.
        return f"{self.journal.session_id}/{call_id}"

    def _claims(
        self, t: Tool, arguments: dict[str, Any], ctx: ToolContext
    ) -> tuple[ResourceClaim, ...]:
        if t.claims is None:
            return ()
        try:
            claims = tuple(t.claims(arguments, ctx))
        except ToolCallError as exc:
            raise _Rejection("invalid_arguments", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a broken hook fails the call, not the turn
            raise _Rejection(
                "claims_failed",
                f"{t.name} could not declare its resources ({type(exc).__name__}: {exc}); "
                "report this",
            ) from None
        for claim in claims:
            if not isinstance(claim, ResourceClaim):
                raise _Rejection(
                    "claims_failed",
                    f"{t.name} declared {claim!r} as a resource, not a ResourceClaim; report this",
                )
        return claims

    def _check(self, call: ProposedCall, scope: StepScope) -> tuple[Tool, dict[str, Any]]:
        t = self.registry.get(call.name)
        if t is None:
            names = ", ".join(sorted(scope.visible)) or "none"
            raise _Rejection(
                "unbound", f"unknown tool {call.name!r}; the tools you can call are: {names}"
            )
        if call.name not in scope.visible:
            if call.name in scope.activated_here:
                raise _Rejection(
                    "activated_this_step",
                    f"tool {call.name!r} was activated by tool_search in this step; "
                    "call it on the next step, when its schema is visible",
                )
            raise _Rejection(
                "invisible",
                f"tool {call.name!r} is not visible in this step; "
                "use tool_search to find and activate it first",
            )
        try:
            arguments = json.loads(call.arguments or "{}", parse_constant=_no_constants)
        except json.JSONDecodeError as exc:
            raise _Rejection(
                "invalid_arguments",
                f"arguments for {call.name} are not valid JSON ({exc.msg} at position "
                f"{exc.pos}); send a JSON object",
            ) from None
        except ValueError as exc:  # NaN / Infinity: not JSON, and not storable in the log
            raise _Rejection("invalid_arguments", f"arguments for {call.name}: {exc}") from None
        if not isinstance(arguments, dict):
            raise _Rejection(
                "invalid_arguments", f"arguments for {call.name} must be a JSON object"
            )
        try:
            canonical_json(arguments)  # what T1 will store must be encodable
        except UnicodeEncodeError:
            raise _Rejection(
                "invalid_arguments",
                f"arguments for {call.name} contain text that is not valid Unicode "
                "(a lone surrogate escape); send plain UTF-8 text",
            ) from None
        problems = self._validate(t, arguments)
        if problems:
            raise _Rejection(
                "invalid_arguments", f"invalid arguments for {call.name}: " + "; ".join(problems)
            )
        return t, arguments

    def _validate(self, t: Tool, arguments: dict[str, Any]) -> list[str]:
        validator = self._validators.get(t.name)
        if validator is None:
            try:
                validator = _compiled_validator(canonical_json(t.parameters).decode())
            except SchemaError as exc:
                return [f"the tool's own schema is invalid ({exc.message}); report this"]
            self._validators[t.name] = validator
        problems = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))[:5]:
            where = "/".join(str(p) for p in error.path)
            problems.append(f"{where}: {error.message}" if where else error.message)
        return problems

    async def _permit(self, t: Tool, arguments: dict[str, Any], env: dict[str, Any]) -> None:
        decision, why = self.permissions.decide(t)
        if decision == "allow":
            if why != "default":
                await self.journal.fact(
                    PermissionDecided(tool=t.name, decision="allow", by="policy", reason=why),
                    **env,
                )
            return
        if decision == "deny":
            await self.journal.fact(
                PermissionDecided(tool=t.name, decision="deny", by="policy", reason=why), **env
            )
            raise _Rejection("denied", f"calling {t.name} is denied by policy ({why})")
        if self.approver is None:
            reason = "approval required and the run is not interactive"
            await self.journal.fact(
                PermissionDecided(tool=t.name, decision="deny", by="default", reason=reason),
                **env,
            )
            raise _Rejection(
                "denied",
                f"calling {t.name} needs approval and nobody can approve it in this run; "
                "the operator can re-run with --yes or add an allow rule",
            )
        summary = _summarize(arguments)
        await self.journal.fact(PermissionRequested(tool=t.name, summary=summary), **env)
        async with self._approval_lock:  # one question at a time
            allowed = await self.approver(t, arguments)
        await self.journal.fact(
            PermissionDecided(
                tool=t.name, decision="allow" if allowed else "deny", by="user", reason=""
            ),
            **env,
        )
        if not allowed:
            raise _Rejection("denied", f"the user denied this call to {t.name}")

    async def _expectations(
        self, t: Tool, arguments: dict[str, Any], ctx: ToolContext
    ) -> Sequence[FileExpectation]:
        if t.expectations is None:
            return ()
        try:
            return await t.expectations(arguments, ctx)
        except ToolCallError as exc:
            raise _Rejection("precondition", str(exc)) from None

    # ------------------------------------------------------------ execution

    async def _execute(
        self, t: Tool, arguments: dict[str, Any], ctx: ToolContext
    ) -> tuple[ResultStatus, str]:
        try:
            value = await t.handler(arguments, ctx)
        except ToolCallError as exc:
            return "error", str(exc)  # the message and its hint: both are for the model
        except asyncio.CancelledError:
            return "cancelled", f"{t.name} was cancelled while running; its effect may be partial"
        except Exception as exc:  # noqa: BLE001 - a tool failure is a result, not a crash
            return "error", f"{t.name} failed: {type(exc).__name__}: {exc}"
        if isinstance(value, ToolOutput):
            return ("error" if value.is_error else "ok"), value.content
        if isinstance(value, str):
            return "ok", value
        try:
            return "ok", json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError) as exc:
            return "error", f"{t.name} returned a value that is not JSON: {exc}"

    async def _bound(self, content: str) -> tuple[str, bool, tuple[ArtifactRef, ...]]:
        data = content.encode("utf-8")
        if len(data) <= self.result_limit:
            return content, False, ()
        ref = await self.artifacts.put(data)
        preview = content[:PREVIEW_CHARS]
        note = (
            f"\n[... truncated: the full result ({len(data)} bytes) is stored as "
            f"artifact sha256:{ref.sha256}]"
        )
        return preview + note, True, (ref,)


def _summarize(arguments: dict[str, Any], limit: int = 200) -> str:
    text = json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=1024)
def _compiled_validator(schema_json: str) -> Draft202012Validator:
    """One checked validator per distinct schema, shared by every run of the process
    (checking and compiling a schema costs more than many validations)."""
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value; send a number or null")
