"""What a tool is: its declaration, the ``@tool`` decorator, and the context it runs in.

A ``Tool`` is a frozen declaration plus an async handler ``(arguments, ctx) -> result``.
Behaviours compose by building a new declaration (``with_options``), never by growing a
class. The JSON schema of a Python tool comes from its type hints (pydantic); the
description from its docstring.

Where a call's work runs is the tool's ``substrate`` (DESIGN section 8): None for this
process, or a declaration of a sandboxed process, a code cell or remote work. The call
pipeline runs each call on an ``Executor`` it selects for that substrate
(``lodger.substrates.select``); ``Execution`` is how one ended.

>>> @tool(group="math")
... def add(a: int, b: int) -> int:
...     "Add two integers."
...     return a + b
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from typing_extensions import TypeVar

from lodger._core.text import is_valid_utf8, visible_text
from lodger.authority.common import ResourceClaim
from lodger.errors import ToolCallError, UsageError
from lodger.events import (
    CallReplayed,
    FileExpectation,
    ProcessEnded,
    ProcessStarted,
    RecoveryPolicy,
    ResultStatus,
    ToolDispatched,
    canonical_json,
)
from lodger.media import BinaryContent
from lodger.providers.base import ModelRequest, ModelResponse, ToolSchema

__all__ = [
    "Accepted",
    "CallRuntime",
    "CannotTell",
    "Elicitation",
    "ElicitationReply",
    "Elicitor",
    "Execution",
    "Executor",
    "NestedCaller",
    "NestedResult",
    "Poll",
    "ProbeResult",
    "RecoveryPolicy",
    "StepHandle",
    "StillRunning",
    "Substrate",
    "SubstrateKind",
    "Suspended",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "WorkerAbandoned",
    "idempotency_key",
    "run_in_worker",
    "tool",
]


class StepHandle(Protocol):
    """The model step a call runs in, as the engine hands it to tools that change what
    later steps show (``tool_search``): its visible names, what calls in it activated so
    far, and how to activate more (committing the fact before anything else sees it)."""

    @property
    def step_id(self) -> str: ...

    def shown(self) -> frozenset[str]: ...

    async def activate(self, query: str, names: Sequence[str]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Elicitation:
    """A question a tool (an MCP server) asks a person while a call runs: ``form`` asks
    for values matching ``requested_schema``, ``url`` sends the person to ``url`` (shown
    to the person, never to the model). Committed as ``elicitation_requested`` first."""

    elicitation_id: str
    session_id: str
    call_id: str
    server: str
    mode: Literal["form", "url"]
    message: str
    requested_schema: Mapping[str, Any] = field(default_factory=dict)
    url: str | None = None


@dataclass(frozen=True, kw_only=True)
class ElicitationReply:
    """A person's answer to an ``Elicitation``: ``accept`` (with ``content`` in form
    mode), ``decline`` or ``cancel``; ``who`` as ``permission_decided.who``."""

    action: Literal["accept", "decline", "cancel"]
    content: Mapping[str, Any] = field(default_factory=dict)
    who: str | None = None


Elicitor = Callable[[Elicitation], Awaitable[ElicitationReply]]
"""Who answers elicitations: the CLI asks at the terminal, a host holds the question
for its clients (``GET /v1/sessions/{id}/elicitations``). None: no one can answer."""


class CallRuntime(Protocol):
    """What a running call may ask of the run it belongs to (``ToolContext.runtime``):
    commit a fact of the call before its T2, ask a person, ask the session's model."""

    @property
    def elicitor(self) -> Elicitor | None: ...

    @property
    def model_spec(self) -> str: ...

    async def commit(self, body: Any) -> None:
        """Commit ``body`` (an event body) as a fact of this call, now."""
        ...

    async def sample(self, request: ModelRequest) -> ModelResponse:
        """Ask the session's own model (with the run's retries); the caller logs it."""
        ...


DepsT = TypeVar("DepsT", default=Any)


@dataclass(frozen=True, kw_only=True)
class NestedResult:
    """How a nested call of a code cell ended: ``status`` None means it was rejected
    before dispatch (unknown, invisible, invalid arguments, denied)."""

    call_id: str
    status: str | None
    content: str


class NestedCaller(Protocol):
    """What a code cell (the ``exec`` tool) calls tools through: each call takes the
    whole path of a top-level call with its own call id, ``parent_call_id`` = the cell's
    call, ``origin=code_mode`` and ``visibility=hidden``."""

    def callable_tools(self) -> list[Tool]:
        """The nestable tools a cell may call now (direct or activated in an earlier step)."""
        ...

    def tool(self, name: str) -> Tool | None:
        """The bound tool of that name, nestable or not."""
        ...

    def bound_names(self) -> list[str]:
        """Every tool name bound in the run."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> NestedResult:
        """Run one nested call to its T2 (or rejection); raises ``CommitFailedError``."""
        ...


@dataclass(frozen=True, kw_only=True)
class ToolContext(Generic[DepsT]):
    """Where and as what a call runs. Handlers that declare a ``ToolContext`` parameter get it.

    ``deps`` is what the caller passed as ``Agent.run(..., deps=...)``: a database handle,
    a client, settings. Annotate the parameter ``ToolContext[MyDeps]`` to have it typed.
    Deps are never logged: pass them again to ``Agent.resume``.
    """

    session_id: str
    turn_id: str
    run_id: str
    call_id: str
    operation_id: str
    workspace: Path | None = None
    parent_call_id: str | None = None
    #: paths no tool may read, write or list, wherever they are (the state directory)
    hidden: tuple[Path, ...] = ()
    #: the model step that proposed the call (None for recovery re-runs and probes)
    step: StepHandle | None = None
    #: how a code cell calls tools (set by the pipeline for calls of a model step)
    nested: NestedCaller | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    deps: DepsT = None  # type: ignore[assignment]
    #: the operation's idempotency key, minted with its T1: the same for every attempt
    #: of the call (a re-dispatch keeps its first attempt's key); ``lodger.tools.http``
    #: sends it as ``Idempotency-Key`` (empty for a context no T1 minted)
    idempotency_key: str = ""
    #: the run the call belongs to (None outside a run: a probe, a direct handler call)
    runtime: CallRuntime | None = None

    def require_workspace(self) -> Path:
        if self.workspace is None:
            raise ToolCallError("this tool needs a workspace and the session has none")
        return self.workspace


def idempotency_key(session_id: str, first_operation_id: str) -> str:
    """The idempotency key of every attempt of the call whose first operation (T1) is
    ``first_operation_id``: stable across re-dispatch, ASCII, unique per session and
    operation (``ToolContext.idempotency_key``; ``lodger.tools.http`` sends it)."""
    digest = hashlib.sha256(f"{session_id}\x00{first_operation_id}".encode()).hexdigest()
    return f"lodger-{digest[:40]}"


@dataclass(frozen=True, kw_only=True)
class ToolOutput:
    """A handler may return this to set the status explicitly; plain values mean ``ok``."""

    content: str
    is_error: bool = False
    #: images and documents for the model with the text (stored as artifacts)
    parts: Sequence[BinaryContent] = ()
    #: facts committed with the call's T2 (a background process started or ended; how a
    #: replay answered the call)
    facts: Sequence[ProcessStarted | ProcessEnded | CallReplayed] = ()


@dataclass(frozen=True, kw_only=True)
class Suspended:
    """A handler returns this when it has handed its work to run elsewhere (a subagent on
    another worker): the call stays dispatched with no T2, the run ends waiting once its
    batch settles, and the turn stays open. When the session is woken, resume's recovery
    probe of the call gives its result (or says ``pending``: the run waits again)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class Accepted:
    """A handler returns this when the remote side accepted a long-running call and
    answered a ``handle`` (a job or task id): the engine commits ``call_accepted`` with
    it (after T1, before the model sees anything) and settles the call through the
    tool's ``poll``. ``wait="wait"``: the turn waits, polling with backoff, for the
    result; ``"continue"``: the model reads that the call is running and the turn goes
    on; the result is committed as the call's T2 when a later poll finds it (between
    steps, or at a later turn's start), and after a crash recovery polls the handle."""

    handle: dict[str, Any]
    wait: Literal["continue", "wait"] = "continue"


@dataclass(frozen=True, kw_only=True)
class StillRunning:
    """A ``poll`` answers this while the accepted call is still running remotely."""

    note: str = ""


@dataclass(frozen=True, kw_only=True)
class CannotTell:
    """A ``poll`` answers this when the handle says nothing it can trust (the remote
    lost the job, or answers garbage): recovery then parks the call for a person."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """What a ``queryable`` tool's probe saw: ``applied`` True/False, or None when unknown.

    ``pending``: the operation is still running elsewhere (a suspended call's work); the
    call is left as it is and the resumed run ends waiting again instead of parking."""

    applied: bool | None
    observation: str
    content: str = ""
    pending: bool = False


# ---------------------------------------------------------------- the executor seam

SubstrateKind = Literal["in_process", "sandboxed_process", "code_cell", "remote"]
"""Where a call's work runs: this process (a task of the event loop), a sandboxed
process, a code cell's interpreter, or elsewhere (handed off; settled by a later wake)."""


@dataclass(frozen=True, slots=True)
class Execution:
    """How one execution ended, as a value: what T2 records (after the after-call hooks)."""

    status: ResultStatus
    content: str
    #: the work was handed off (``Suspended``): no T2 now, the run ends waiting
    suspended: bool = False
    #: images and documents the tool returned (``BinaryContent``, ``ToolOutput.parts``)
    parts: tuple[BinaryContent, ...] = ()
    #: facts committed in T2's append (``ToolOutput.facts``)
    facts: tuple[ProcessStarted | ProcessEnded | CallReplayed, ...] = ()
    #: the remote side accepted the call (``Accepted``): running with a handle, no T2 yet
    accepted: Accepted | None = None


class Executor(Protocol):
    """Runs one dispatched call on a substrate and says how it ended.

    ``execute`` never raises for the tool's faults: an exception of the tool is its error
    result. Every execution ends within its ``time_limit`` plus a short grace (then
    ``timed_out``). Cancellation of the caller stops the execution, which settles and
    says what happened (the pipeline records it in T2 before the cancellation goes on).
    Only a failure of the runtime itself (a failed commit) may propagate.
    """

    async def execute(
        self,
        *,
        tool: Tool,
        arguments: dict[str, Any],
        context: ToolContext,
        time_limit: float,
    ) -> Execution: ...


class Substrate(Protocol):
    """A tool's declaration of where its calls run (``Tool.substrate``): its ``kind``,
    what the substrate needs to run a call (a command line, a cell interpreter), and the
    ``executor`` that serves the kind unless the pipeline mounts another for it."""

    @property
    def kind(self) -> SubstrateKind: ...

    @property
    def executor(self) -> Executor: ...


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
Probe = Callable[[ToolDispatched, ToolContext], Awaitable[ProbeResult]]
# Queries an accepted call's handle: its result (what a handler returns: str, ToolOutput,
# JSON), ``StillRunning()`` or ``CannotTell(reason)``.
Poll = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
# What a call touches, for the authorities (DESIGN section 7); computed from validated
# arguments before permission, acquired after it. Raise ToolCallError for a bad argument.
Claims = Callable[[dict[str, Any], ToolContext], Sequence[ResourceClaim]]
Expectations = Callable[[dict[str, Any], ToolContext], Awaitable[Sequence[FileExpectation]]]


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool declaration. ``handler`` receives JSON arguments already schema-validated."""

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    group: str = "default"
    deferred: bool = False
    nestable: bool = False
    recovery: RecoveryPolicy = "never_retry"
    probe: Probe | None = None
    claims: Claims | None = None
    approval: bool = False
    expectations: Expectations | None = None
    #: seconds a call may run before it is stopped and settles ``timed_out`` (None: the
    #: run's default)
    timeout: float | None = None
    #: where its calls run (None: in this process, as a task of the event loop)
    substrate: Substrate | None = None
    #: the tool changes files or the world (a tool with ``expectations`` or ``approval``
    #: counts as writing anyway); ``TestModel`` does not call such tools unless asked
    writes: bool = False
    #: queries the handle of a call the remote side accepted (``Accepted``)
    poll: Poll | None = None

    def __post_init__(self) -> None:
        if self.recovery == "queryable" and self.probe is None:
            raise UsageError(
                f"tool {self.name!r} is queryable but has no probe",
                hint="pass probe=... or choose recovery='never_retry'",
                code="tool_declaration",
            )
        remote = self.substrate is not None and self.substrate.kind == "remote"
        if remote and self.recovery != "queryable":
            # a suspended call is settled only by its probe, when the session wakes
            raise UsageError(
                f"tool {self.name!r} hands its work off (RemoteWork) but is not queryable",
                hint="pass recovery='queryable' and a probe that reads the work's outcome",
                code="tool_declaration",
            )

    def schema(self) -> ToolSchema:
        return self._schema

    @functools.cached_property
    def _schema(self) -> ToolSchema:
        return ToolSchema(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            writes=self.writes or self.approval or self.expectations is not None,
        )

    @functools.cached_property
    def _canonical_schema(self) -> bytes:
        # Computed once per declaration: every step records each visible tool's digest.
        return canonical_json(
            {"name": self.name, "description": self.description, "parameters": self.parameters}
        )

    @functools.cached_property
    def parameters_json(self) -> str:
        """The argument schema as canonical JSON (the key its compiled validator is
        cached under)."""
        return canonical_json(self.parameters).decode()

    def schema_digest(self) -> str:
        return hashlib.sha256(self._canonical_schema).hexdigest()[:16]

    def schema_size(self) -> int:
        return len(self._canonical_schema)

    def with_options(self, **changes: Any) -> Tool:
        """A copy with other options: ``t.with_options(approval=True, deferred=True)``."""
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------- the decorator


def _is_context(annotation: Any) -> bool:
    return annotation is ToolContext or get_origin(annotation) is ToolContext


def _build(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    options: dict[str, Any],
) -> Tool:
    tool_name = name or fn.__name__
    hints = get_type_hints(fn, include_extras=True)
    signature = inspect.signature(fn)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in signature.parameters.values():
        annotation = hints.get(param.name, Any)
        if _is_context(annotation):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UsageError(
                f"tool {tool_name!r} takes *args/**kwargs; declare every argument",
                code="tool_declaration",
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model: type[BaseModel] = create_model(
        f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    doc = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
    is_async = inspect.iscoroutinefunction(fn)

    plain = _plain_fields(fields)

    async def handler(arguments: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = _plain_kwargs(plain, arguments) if plain is not None else None
        if kwargs is None:
            try:
                parsed = model.model_validate(arguments)
            except ValidationError as exc:
                raise ToolCallError(_pydantic_message(tool_name, exc)) from None
            kwargs = {key: getattr(parsed, key) for key in fields}
        if context_param is not None:
            kwargs[context_param] = ctx
        try:
            if is_async:
                value = await fn(**kwargs)
            else:
                # Sync tools run on a worker thread so they never block the event loop.
                value = await run_in_worker(functools.partial(fn, **kwargs))
        except ToolCallError as exc:
            if is_valid_utf8(str(exc)):
                raise
            raise _visible_error(exc) from None
        return _visible_result(value)

    return Tool(name=tool_name, description=doc, parameters=schema, handler=handler, **options)


#: annotations whose values pydantic hands over unchanged when they have exactly the type
_PLAIN_TYPES = (str, int, bool)
_REQUIRED: Any = object()


def _plain_fields(fields: dict[str, Any]) -> tuple[tuple[str, type, Any], ...] | None:
    """Each argument's name, type and default (``_REQUIRED``) when every one is annotated
    as plain ``str``, ``int`` or ``bool`` with a plain default (or none); None otherwise."""
    plain: list[tuple[str, type, Any]] = []
    for key, (annotation, default) in fields.items():
        if annotation not in _PLAIN_TYPES:
            return None
        if default is not ... and type(default) not in (*_PLAIN_TYPES, type(None)):
            return None  # ``Field(default=..., ge=...)`` and the like: the model's to apply
        plain.append((key, annotation, _REQUIRED if default is ... else default))
    return tuple(plain)


def _plain_kwargs(
    plain: tuple[tuple[str, type, Any], ...], arguments: dict[str, Any]
) -> dict[str, Any] | None:
    """The keyword arguments the tool's model would give for ``arguments`` when each
    value has exactly its field's type (pydantic returns such a value as it is) and no
    key is unknown; None for anything else, which the model then validates (and
    converts, or refuses with its own message)."""
    if type(arguments) is not dict or len(arguments) > len(plain):
        return None
    kwargs: dict[str, Any] = {}
    found = 0
    for key, kind, default in plain:
        if key in arguments:
            value = arguments[key]
            if type(value) is not kind:
                return None
            kwargs[key] = value
            found += 1
        elif default is _REQUIRED:
            return None
        else:
            kwargs[key] = default
    return kwargs if found == len(arguments) else None


class WorkerAbandoned(Exception):
    """A sync tool's worker thread was left running: a thread cannot be stopped, and the
    call was asked to stop twice (or timed out and did not stop in its grace period)."""


async def run_in_worker(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a worker thread and settle honestly when cancelled.

    A thread cannot be interrupted. A first cancellation therefore waits for the thread
    to finish and returns what it did (the caller records the real outcome); a second
    cancellation gives up on it and raises ``WorkerAbandoned``: the effect is unknown.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, contextvars.copy_context().run, fn)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if future.done():
            return future.result()
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if future.done():
            return future.result()
        raise WorkerAbandoned(
            "the worker thread was still running when the call was stopped"
        ) from None


def _visible_result(value: Any) -> Any:
    """A result with no lone surrogate in its text: a file name that is not UTF-8 is shown
    escaped (``lodger._core.text.visible_text``), since the log cannot store it as it is."""
    if isinstance(value, str):
        return visible_text(value)
    if isinstance(value, ToolOutput) and not is_valid_utf8(value.content):
        return dataclasses.replace(value, content=visible_text(value.content))
    return value


def _visible_error(exc: ToolCallError) -> ToolCallError:
    hint = None if exc.hint is None else visible_text(exc.hint)
    return ToolCallError(visible_text(exc.message), hint=hint, code=exc.code)


def _pydantic_message(name: str, exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return f"invalid arguments for {name}: " + "; ".join(parts)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    group: str = "default",
    deferred: bool = False,
    nestable: bool = False,
    recovery: RecoveryPolicy = "never_retry",
    probe: Probe | None = None,
    claims: Claims | None = None,
    approval: bool = False,
    expectations: Expectations | None = None,
    timeout: float | None = None,
    substrate: Substrate | None = None,
    writes: bool = False,
    poll: Poll | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    group: str = "default",
    deferred: bool = False,
    nestable: bool = False,
    recovery: RecoveryPolicy = "never_retry",
    probe: Probe | None = None,
    claims: Claims | None = None,
    approval: bool = False,
    expectations: Expectations | None = None,
    timeout: float | None = None,
    substrate: Substrate | None = None,
    writes: bool = False,
    poll: Poll | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a sync or async Python function as a tool.

    The argument schema comes from the type hints, the description from the docstring.
    A parameter annotated ``ToolContext`` receives the call's context and is not part of
    the schema. Raise ``lodger.errors.ToolCallError`` for an error the model should see.
    """
    options: dict[str, Any] = {
        "group": group,
        "deferred": deferred,
        "nestable": nestable,
        "recovery": recovery,
        "probe": probe,
        "claims": claims,
        "approval": approval,
        "expectations": expectations,
        "timeout": timeout,
        "substrate": substrate,
        "writes": writes,
        "poll": poll,
    }

    def decorate(f: Callable[..., Any]) -> Tool:
        return _build(f, name=name, description=description, options=options)

    if fn is not None:
        return decorate(fn)
    return decorate
