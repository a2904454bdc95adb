"""The ``delegate`` tool: a child session runs a task and its answer is the call's result.

    delegate(task, tools?, budget?, history?)
        claims   -> refuse (a tool error the model can fix) past the depth limit, with a
                    tool the parent lacks, or with the tree's budget spent; else claim
                    ``actor:subagent:<child id>`` (the id T1 records)
        T1       -> the child's id is in the log before the child exists
        execute  -> the child's first event (``session_started`` with the parent link; a
                    fork of the parent's prefix for ``history="fork"``), then its turn,
                    under its budget, with the parent's authorities and approver
        T2       -> the child's answer (or structured output) as JSON

Children are sessions in the parent's storage. They share the parent's ``Authorities``
(file leases, actors, capacity), so a child's edit and the parent's, or two children's,
meet on one lease; they share the parent's permission gate, so their questions go to the
parent's approver one at a time, and ``current_subagent()`` names the child that asks.
Cancelling the parent's call cancels the child, whose running calls settle first; when
the parent's turn was cancelled (``Agent.cancel``, not merely stopped), the child's turn
ends ``cancelled`` too (``cancel_requested`` naming who cancelled the parent).

Recovery (policy ``queryable``) probes the child: a child whose turn ended gives its
answer, with nothing run again; a child whose turn is open is resumed (never restarted);
a child that never wrote its first event did not happen, and the model is told so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import TypeAdapter

from lodger.authority import ResourceClaim
from lodger.engine.loop import Engine
from lodger.engine.output import OutputInvalid, OutputSpec
from lodger.engine.resume import cancel_open
from lodger.engine.state import SessionState
from lodger.engine.steering import enclosing_cancel
from lodger.errors import ProviderError, ResumeBlockedError, ToolCallError, UsageError
from lodger.events import (
    EventDraft,
    ModelOutput,
    SessionStarted,
    ToolDispatched,
    canonical_json,
)
from lodger.providers.base import Model, ModelRequest, ModelResponse, OutputMode, TextSink
from lodger.providers.fallback import FallbackModel
from lodger.runtime.subagents.ledger import (
    TreeSpend,
    budget_from_metadata,
    budget_metadata,
    settled_floor,
    tree_budget,
    tree_spend,
)
from lodger.runtime.subagents.link import (
    _ASKING,
    ChildOutcome,
    History,
    SubagentLink,
    child_outcome,
    child_resource,
    child_session_id,
    link_of,
    session_from_resources,
)
from lodger.runtime.subagents.policy import Budget, SubagentPolicy
from lodger.storage import EventLog, SessionWriter, Storage
from lodger.storage.forks import fork_session
from lodger.storage.merge import apply_snapshot_changes
from lodger.storage.snapshots import snapshot_workspace
from lodger.substrates.remote import RemoteWork
from lodger.tools.registry import ToolRegistry
from lodger.tools.search import TOOL_SEARCH, attach_tool_search
from lodger.tools.spec import ProbeResult, Suspended, Tool, ToolContext, ToolOutput
from lodger.tools.workspace import workspace_id

__all__ = ["Delegation", "ParentAgent", "delegate_tool", "drive_detached_child"]

_GRACE = 30.0  # the call's own time limit sits past the child's wall time
#: the delegation's arguments, in a detached child's first event (a worker runs it from
#: its own log, without the parent's)
_ARGUMENTS = "subagent.arguments"
#: the snapshot of the parent's workspace a detached child starts from
_BASE_SNAPSHOT = "subagent.base_snapshot"


class ParentAgent(Protocol):
    """What the ``delegate`` tool needs of the agent that binds it (``lodger.runtime.agent.Agent``
    is one): its storage, its engine (model, tools, clock and ids, which a child's engine
    is made from), its subagent policy, and its sessions opened the way it opens them. A
    protocol, so the agent imports this tool and not the other way round."""

    @property
    def storage(self) -> Storage: ...

    @property
    def engine(self) -> Engine: ...

    @property
    def subagents(self) -> SubagentPolicy | None: ...

    def open_session(
        self, session_id: str
    ) -> AbstractAsyncContextManager[tuple[SessionWriter, SessionState]]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delegation:
    """One delegation's arguments, read from the call (or from its T1 for recovery)."""

    task: str
    tools: tuple[str, ...] | None
    budget: Budget
    history: History
    #: a JSON schema the child's final answer must match (its value is the result)
    output_schema: dict[str, Any] | None = None

    @classmethod
    def parse(cls, arguments: dict[str, Any], policy: SubagentPolicy) -> Delegation:
        raw = arguments.get("budget") or {}
        default = policy.default_budget
        asked = Budget(
            steps=int(raw.get("steps", default.steps)),
            tokens=raw.get("tokens", default.tokens),
            wall_time=raw.get("wall_time_s", default.wall_time),
        )
        tools = arguments.get("tools")
        schema = arguments.get("output_schema")
        return cls(
            task=str(arguments["task"]),
            tools=None if tools is None else tuple(str(t) for t in tools),
            budget=asked.capped(policy.max_budget),
            history="fork" if arguments.get("history") == "fork" else "empty",
            output_schema=dict(schema) if isinstance(schema, dict) else None,
        )


def _parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "task": {
                "type": "string",
                "minLength": 1,
                "description": "what the subagent should do; it answers when done",
            },
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "uniqueItems": True,
                "description": "the names of your tools it may use (default: all of them)",
            },
            "budget": {
                "type": "object",
                "properties": {
                    "steps": {"type": "integer", "minimum": 1},
                    "tokens": {"type": "integer", "minimum": 1},
                    "wall_time_s": {"type": "number", "exclusiveMinimum": 0},
                },
                "additionalProperties": False,
                "description": "model steps, tokens and seconds it may spend",
            },
            "history": {
                "enum": ["fork", "empty"],
                "description": "fork: it starts from your conversation so far; "
                "empty (default): from the task alone",
            },
            "output_schema": {
                "type": "object",
                "description": "a JSON schema its final answer must match; the result's "
                "output is then that JSON value",
            },
        },
        "required": ["task"],
        "additionalProperties": False,
    }


class _SchemaOutput(OutputSpec):
    """A child's structured output, validated against the JSON schema the delegation gave
    (the parent's model speaks JSON schema, not Python types)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.output_type = Any
        self._adapter = TypeAdapter(Any)
        self._use_schema(schema)
        self._validator = Draft202012Validator(schema)

    def validate(self, text: str, mode: OutputMode = "prompted") -> tuple[Any, Any]:
        value, dumped = super().validate(text, mode)  # parsed as JSON (any value)
        errors = sorted(self._validator.iter_errors(dumped), key=lambda e: list(e.path))[:5]
        if errors:
            problems = [
                f"{'.'.join(str(p) for p in error.path) or 'the value'}: {error.message}"
                for error in errors
            ]
            raise OutputInvalid(
                "your final answer does not match the required output: "
                + "; ".join(problems)
                + ". Answer again with only a JSON value matching the schema"
            )
        return value, dumped


def _check_schema(schema: Any) -> None:
    if schema is None:
        return
    try:
        Draft202012Validator.check_schema(schema)
        canonical_json(schema)
    except (SchemaError, ValueError, TypeError, RecursionError) as exc:
        message = exc.message if isinstance(exc, SchemaError) else str(exc)
        raise ToolCallError(
            f"output_schema is not a valid JSON schema: {message}", code="subagent_schema"
        ) from None


class _Spent:
    """The tokens a child has spent, shared by the members of a fallback chain."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens


class _BudgetedModel:
    """The child's model, refusing a request once the child's tokens are spent."""

    def __init__(self, inner: Model, *, limit: int | None, spent: _Spent) -> None:
        self.inner = inner
        self.limit = limit
        self.spent = spent

    @property
    def spec(self) -> str:
        return self.inner.spec

    async def aclose(self) -> None:
        """The parent's model (or the policy's) is closed by whoever made it."""

    async def complete(
        self, request: ModelRequest, *, on_text: TextSink | None = None
    ) -> ModelResponse:
        used = self.spent.tokens
        if self.limit is not None and used >= self.limit:
            raise ProviderError(
                f"the subagent spent its token budget ({used} of {self.limit} tokens)",
                retryable=False,
                code="subagent_budget",
            )
        response = await self.inner.complete(request, on_text=on_text)
        if response.usage is not None:
            self.spent.tokens += response.usage.input_tokens + response.usage.output_tokens
        return response


def _budgeted(model: Model, *, limit: int | None, used: int) -> Model:
    """``model`` under the child's token budget; a fallback chain stays a chain (so the
    engine retries and switches per member), each member counting into one budget."""
    spent = _Spent(used)
    if not isinstance(model, FallbackModel):
        return _BudgetedModel(model, limit=limit, spent=spent)
    members = [_BudgetedModel(m, limit=limit, spent=spent) for m in model.models]
    return FallbackModel(*members, fallback_on=model.falls_back)


class _Trees:
    """What the delegators of one agent share about its trees: a lock per root (reading
    the tree's spending and writing a child's first event happen under it) and the most
    each root's settled children were seen to have spent (only grows: an early refusal
    from it, before T1, is never wrong)."""

    def __init__(self) -> None:
        self.locks: dict[str, asyncio.Lock] = {}
        self.settled: dict[str, tuple[int, int]] = {}

    def lock(self, root: str) -> asyncio.Lock:
        return self.locks.setdefault(root, asyncio.Lock())

    def remember(self, spend: TreeSpend) -> None:
        steps, tokens = self.settled.get(spend.root, (0, 0))
        self.settled[spend.root] = (
            max(steps, spend.settled_steps),
            max(tokens, spend.settled_tokens),
        )


class _Delegator:
    """The ``delegate`` tool of one depth of a tree; the root's is bound by the agent."""

    def __init__(
        self,
        agent: ParentAgent,
        policy: SubagentPolicy,
        *,
        depth: int = 0,
        root: str | None = None,
        trees: _Trees | None = None,
    ) -> None:
        self.agent = agent
        self.policy = policy
        self.depth = depth  # the depth of the sessions that call this tool (root: 0)
        self.root = root
        self.trees = _Trees() if trees is None else trees

    # ------------------------------------------------------------ the declaration

    def tool(self) -> Tool:
        cap = self.policy.max_budget.wall_time
        return Tool(
            name=self.policy.name,
            description=(
                "Hand a self-contained task to a subagent: a new agent session with your "
                "tools (or the subset you name) in your workspace, which works on it and "
                "answers. Its answer is this call's result (JSON with session, status and "
                "answer). Several delegations in one step run at the same time; give each "
                "a task that does not depend on the others."
            ),
            parameters=_parameters(),
            handler=self._handle,
            group="subagents",
            recovery="queryable",
            probe=self._probe,
            claims=self._claims,
            timeout=None if cap is None else cap + _GRACE,
            # with a launcher, a delegation hands its child off to a worker and suspends
            substrate=RemoteWork() if self.policy.children is not None else None,
        )

    def _check_settled(self, session_id: str) -> None:
        """Refuse before T1 when the tree's settled children alone spent its budget (as
        last read in this process; the full check reads the logs in the handler)."""
        root = self.root or session_id
        seen = self.trees.settled.get(root)
        if seen is not None:
            steps, tokens = seen
            spend = TreeSpend(root=root, settled_steps=steps, settled_tokens=tokens)
            settled_floor(spend, self.policy).check()

    @contextlib.asynccontextmanager
    async def _reserving(self, root: str) -> AsyncIterator[None]:
        """Held from reading the tree's spending to writing the child's first event: in
        this process, and across workers through the launcher."""
        async with self.trees.lock(root):
            if self.policy.children is None:
                yield
                return
            async with self.policy.children.reserving(root):
                yield

    async def _spend(self, root: str) -> TreeSpend:
        spend = await tree_spend(self.agent.storage.log, root, policy=self.policy)
        self.trees.remember(spend)
        return spend

    def _claims(self, arguments: dict[str, Any], ctx: ToolContext) -> list[ResourceClaim]:
        """Refusals before dispatch (nothing runs, no child exists), then the claim that
        puts the child's id in T1."""
        if self.depth >= self.policy.max_depth:
            raise ToolCallError(
                f"delegation is limited to depth {self.policy.max_depth} and this session is "
                f"at depth {self.depth}; do the task yourself",
                code="subagent_depth",
            )
        requested = arguments.get("tools")
        if requested is not None:
            mine = set(_bound_names(ctx, self.agent))
            lacking = [name for name in requested if name not in mine]
            if lacking:
                raise ToolCallError(
                    "a subagent can only get tools you have; you have no "
                    + ", ".join(repr(n) for n in lacking)
                    + ". Your tools: "
                    + ", ".join(sorted(mine)),
                    code="subagent_tools",
                )
        _check_schema(arguments.get("output_schema"))
        self._check_settled(ctx.session_id)
        return [ResourceClaim.actor(child_resource(child_session_id(ctx.session_id, ctx.call_id)))]

    # ------------------------------------------------------------ a delegation

    def _detached(self, ctx: ToolContext) -> bool:
        """Whether this call's child runs elsewhere (a launcher is set; a code cell's
        nested delegation still runs inline: a cell cannot suspend)."""
        return self.policy.children is not None and ctx.parent_call_id is None

    async def _handle(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput | Suspended:
        delegation = Delegation.parse(arguments, self.policy)
        child_id = child_session_id(ctx.session_id, ctx.call_id)
        root = self.root or ctx.session_id
        detached = self._detached(ctx)
        base: str | None = None
        if detached and ctx.workspace is not None:
            # what the child starts from, and what its edits are applied against when
            # the parent wakes (``lodger.storage.merge``)
            base = (await snapshot_workspace(ctx.workspace, self.agent.storage.artifacts)).ref
        async with self._reserving(root):
            # the tree's budget from its logs (it holds after a crash, across workers);
            # a ToolCallError the model can fix when nothing is left
            granted = tree_budget(await self._spend(root), self.policy).reserve(delegation.budget)
            # T1 is committed: the child's first event records the link and the grant
            link = await self._start_child(
                child_id,
                delegation,
                ctx,
                granted=granted,
                arguments=arguments if detached else None,
                base_snapshot=base,
            )
        if detached:
            assert self.policy.children is not None
            # its wake; the call suspends and the parent's run ends waiting once the
            # batch settles
            await self.policy.children.start(child=link, snapshot=base)
            return Suspended(reason=f"the subagent session {child_id!r} runs on a worker")
        outcome = await self._drive(link, delegation, granted, deps=ctx.deps, source=ctx)
        await self._spend(root)  # what settled, for the early refusal of the next call
        return ToolOutput(content=outcome.render(), is_error=not outcome.completed)

    async def _start_child(
        self,
        child_id: str,
        delegation: Delegation,
        ctx: ToolContext,
        *,
        granted: Budget,
        arguments: dict[str, Any] | None = None,
        base_snapshot: str | None = None,
    ) -> SubagentLink:
        """Write the child's first event: the parent link (and, for a fork, the shared
        prefix: the parent's log up to the model output that proposed this call). With
        ``arguments`` (a detached child), they are recorded too, and no workspace: the
        child works in whatever directory its worker restores."""
        log = self.agent.storage.log
        at, digest = await _branch_point(log, ctx.session_id, ctx.call_id)
        link = SubagentLink(
            session_id=child_id,
            parent_session=ctx.session_id,
            parent_call=ctx.call_id,
            parent_offset=at,
            parent_digest=digest,
            depth=self.depth + 1,
            root=self.root or ctx.session_id,
            history=delegation.history,
        )
        metadata = link.to_metadata() | budget_metadata(granted)
        if arguments is None:
            await self._write_first(link, delegation, ctx, metadata)
            return link
        metadata[_ARGUMENTS] = canonical_json(arguments).decode()
        if base_snapshot is not None:
            metadata[_BASE_SNAPSHOT] = base_snapshot
        assert self.policy.children is not None
        async with self.policy.children.writing(child_id):
            await self._write_first(link, delegation, ctx, metadata)
        return link

    async def _write_first(
        self,
        link: SubagentLink,
        delegation: Delegation,
        ctx: ToolContext,
        metadata: dict[str, str],
    ) -> None:
        log = self.agent.storage.log
        child_id, at = link.session_id, link.parent_offset
        services = self.agent.engine.services
        clock, ids = services.clock, services.ids
        if delegation.history == "fork":
            await fork_session(
                log,
                ctx.session_id,
                fork_id=child_id,
                at=at,
                clock=clock,
                ids=ids,
                metadata=metadata,
            )
            return
        workspace = ctx.workspace if _ARGUMENTS not in metadata else None
        ws_id = await asyncio.to_thread(workspace_id, workspace) if workspace else None
        body = SessionStarted(
            workspace=str(workspace) if workspace else None,
            workspace_id=ws_id,
            metadata=metadata,
        )
        async with await log.open_writer(child_id) as writer:
            if writer.head.high_water:
                raise ToolCallError(
                    f"the subagent session {child_id!r} exists already; delegate again",
                    code="subagent_exists",
                )
            draft = EventDraft(id=ids.new_id(), ts=clock.now_us(), body=body)
            await writer.append([draft], expected_offset=0)

    def _child_engine(
        self,
        link: SubagentLink,
        delegation: Delegation,
        granted: Budget,
        *,
        source: ToolContext | None,
        deps: Any,
        tokens_used: int,
    ) -> Engine:
        parent = self.agent.engine
        registry = self._child_registry(link, delegation, source)
        chosen = self.policy.model or parent.model
        if isinstance(chosen, str):
            raise UsageError(
                f"the subagent policy names its model as text ({chosen!r})",
                hint="bind the policy with Agent(subagents=...), which makes the model",
            )
        model = _budgeted(chosen, limit=granted.tokens, used=tokens_used)
        return dataclasses.replace(
            parent,
            model=model,
            registry=registry,
            system=self.policy.system or parent.system,
            limits=dataclasses.replace(parent.limits, max_steps=granted.steps),
            output=_SchemaOutput(delegation.output_schema) if delegation.output_schema else None,
            hooks=dataclasses.replace(parent.hooks, on_event=None, on_text=None),
            deps=deps,
        )

    def _child_registry(
        self, link: SubagentLink, delegation: Delegation, source: ToolContext | None
    ) -> ToolRegistry:
        names = _bound_names(source, self.agent)
        wanted = set(delegation.tools) if delegation.tools is not None else set(names)
        tools: list[Tool] = []
        for name in names:
            if name not in wanted or name in (TOOL_SEARCH, self.policy.name):
                continue
            t = _bound_tool(source, self.agent, name)
            if t is not None:
                tools.append(t)
        registry = ToolRegistry(tools)
        attach_tool_search(registry)
        if self.policy.name in wanted:
            below = _Delegator(
                self.agent, self.policy, depth=link.depth, root=link.root, trees=self.trees
            )
            registry.bind(below.tool())
        return registry

    async def _drive(
        self,
        link: SubagentLink,
        delegation: Delegation,
        granted: Budget,
        *,
        deps: Any,
        source: ToolContext | None,
        relocate: bool = False,
    ) -> ChildOutcome:
        """Run (or resume) the child's turn to its end under its wall time; ``relocate``
        (a worker's fresh directory) as a worker resumes any session."""
        child_id = link.session_id
        # Opened as the agent opens any session it runs: the same verified fold (and the
        # same history, for a fork, as the agent's projection gives one), read again
        # next time if this fails (the fold may hold less than the log after a failed
        # commit).
        async with self.agent.open_session(child_id) as (writer, state):
            token = _ASKING.set(link)
            try:
                before = child_outcome(child_id, state.events)
                if before.status is not None:
                    return before  # settled already: nothing runs again
                engine = self._child_engine(
                    link, delegation, granted, source=source, deps=deps, tokens_used=before.tokens
                )
                journal = engine.journal(writer, state)
                try:
                    async with asyncio.timeout(granted.wall_time):
                        if state.open_turn is not None:
                            await engine.resume(journal, relocate=relocate)
                        else:
                            await engine.start_turn(journal, delegation.task)
                except asyncio.CancelledError:
                    await _cascade_cancel(writer, state, engine)
                    raise
                except TimeoutError:
                    return dataclasses.replace(
                        child_outcome(child_id, state.events),
                        timed_out=True,
                        error=f"the subagent ran out of its wall time "
                        f"({granted.wall_time:g} s); its running calls settled and its turn "
                        "was stopped",
                    )
                return child_outcome(child_id, state.events)
            finally:
                _ASKING.reset(token)

    # ------------------------------------------------------------ recovery

    async def _probe(self, dispatched: ToolDispatched, ctx: ToolContext) -> ProbeResult:
        """What became of the child the T1 names: its answer, resuming it if it is open."""
        child_id = session_from_resources(dispatched.resources) or child_session_id(
            ctx.session_id, ctx.call_id
        )
        events = await self.agent.storage.log.read(child_id)
        if not events:
            return ProbeResult(
                applied=False,
                observation=f"the subagent session {child_id!r} never started; the delegation "
                "did not run",
            )
        link = link_of(events[0])
        if link is None:
            return ProbeResult(
                applied=None,
                observation=f"session {child_id!r} is not a subagent of this call",
            )
        if self._detached(ctx):
            assert self.policy.children is not None
            settled = child_outcome(child_id, events)
            if settled.status is None:
                # still running on a worker (or its wake was lost in a crash: start()
                # is idempotent and enqueues it again); the parent waits again
                await self.policy.children.start(child=link, snapshot=None)
                return ProbeResult(
                    applied=None,
                    pending=True,
                    observation=f"the subagent session {child_id!r} is still running",
                )
            content = settled.render()
            first = events[0].body
            base = first.metadata.get(_BASE_SNAPSHOT) if isinstance(first, SessionStarted) else None
            if base and ctx.workspace is not None:
                final = await self.policy.children.final_snapshot(child=link)
                if final is not None and final != base:
                    # the child's edits, into the parent's workspace as it is now (again
                    # after a crash: what is applied already counts as applied)
                    merged = await apply_snapshot_changes(
                        base, final, self.agent.storage.artifacts, ctx.workspace
                    )
                    if merged.applied or merged.conflicts:
                        content = json.dumps(
                            {**json.loads(content), "workspace": merged.to_dict()},
                            ensure_ascii=False,
                        )
            return ProbeResult(
                applied=True,
                observation=f"the subagent session {child_id!r} settled {settled.status}",
                content=content,
            )
        delegation = Delegation.parse(dict(dispatched.arguments), self.policy)
        granted = budget_from_metadata(events[0]) or delegation.budget
        try:
            outcome = await self._drive(link, delegation, granted, deps=ctx.deps, source=None)
        except ResumeBlockedError as exc:
            return ProbeResult(
                applied=None,
                observation=f"the subagent session {child_id!r} cannot resume: {exc.message}",
            )
        return ProbeResult(
            applied=True,
            observation=f"the subagent session {child_id!r} settled {outcome.status or 'open'}",
            content=outcome.render(),
        )


async def _cascade_cancel(writer: SessionWriter, state: SessionState, engine: Engine) -> None:
    """The parent's turn was cancelled (not merely stopped): the child's turn, whose
    calls just settled, ends ``cancelled`` as well (``cancel_requested`` naming who
    cancelled the parent), rather than being left open for a resume."""
    parent = enclosing_cancel()
    if parent is None or state.open_turn is None:
        return
    why = "its parent's turn was cancelled" + (f": {parent.reason}" if parent.reason else "")
    services = engine.services
    await cancel_open(
        writer, state, who=parent.who, reason=why, clock=services.clock, ids=services.ids
    )


def delegate_tool(agent: ParentAgent, policy: SubagentPolicy) -> Tool:
    """The root ``delegate`` tool of ``agent`` (what ``Agent(subagents=...)`` binds)."""
    return _Delegator(agent, policy).tool()


async def drive_detached_child(agent: ParentAgent, session_id: str) -> ChildOutcome | None:
    """Run, or resume, the one turn of a child session that was handed off to a worker,
    from its own log: its first event holds the link and the delegation's arguments.
    None when the session is not a subagent or ``agent`` binds no subagent policy."""
    policy = agent.subagents
    first = await agent.storage.log.read(session_id, start=0, end=1)
    link = link_of(first[0]) if first else None
    if policy is None or link is None:
        return None
    body = first[0].body
    assert isinstance(body, SessionStarted)  # link_of checked it
    try:
        arguments = json.loads(body.metadata.get(_ARGUMENTS, "null"))
    except json.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict) or not isinstance(arguments.get("task"), str):
        raise ToolCallError(
            f"subagent session {session_id!r} records no delegation to run",
            code="subagent_arguments",
        )
    delegation = Delegation.parse(arguments, policy)
    delegator = _Delegator(agent, policy, depth=link.depth - 1, root=link.root)
    return await delegator._drive(
        link,
        delegation,
        budget_from_metadata(first[0]) or delegation.budget,
        deps=agent.engine.deps,
        source=None,
        relocate=True,
    )


def _bound_names(ctx: ToolContext | None, agent: ParentAgent) -> list[str]:
    """The tools of the run that delegates (its own registry, for a call of a step)."""
    if ctx is not None and ctx.nested is not None:
        return ctx.nested.bound_names()
    return agent.engine.registry.names()


def _bound_tool(ctx: ToolContext | None, agent: ParentAgent, name: str) -> Tool | None:
    if ctx is not None and ctx.nested is not None:
        return ctx.nested.tool(name)
    return agent.engine.registry.get(name)


async def _branch_point(log: EventLog, session_id: str, call_id: str) -> tuple[int, str]:
    """The prefix a child branches from and its digest: the parent's log up to the model
    output that proposed the call (the same for every delegation of one step; the whole
    log when none did). Read from the end, a window at a time: the output commits with
    the first fact of its batch, so it sits near the head."""
    head = await log.head(session_id)
    end = head.high_water
    window = 64
    while end > 0:
        start = max(end - window, 0)
        events = await log.read(session_id, start=start, end=end)
        for e in reversed(events):
            body = e.body
            if isinstance(body, ModelOutput) and any(c.call_id == call_id for c in body.calls):
                return e.offset + 1, e.digest
        end, window = start, window * 4
    return head.high_water, head.digest
