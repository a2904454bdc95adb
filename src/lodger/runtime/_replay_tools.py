"""The tools of a replay: each bound tool's declaration, answered without the world.

A replay binds the same tools as its source (same names, descriptions and schemas, so
each step records the same schema digests) with another handler that decides, per call:

1. ``recorded``: the source made the same call (tool and canonical arguments) and its T2
   is in the log: the recorded status and content, each recorded call used once;
2. ``live``: the tool only reads (declared ``writes=False`` and ``recovery="idempotent"``,
   as the built-in read, list and grep tools are): it runs, on the replay's workspace;
3. ``sandbox``: the tool runs confined to the replay's workspace, a scratch directory
   restored from what the log recorded at the fork point: a sandboxed process (shell,
   run_python) whose policy confines it, its network taken away, or a tool named in
   ``ReplayPolicy.confined`` (the built-in file tools, which never leave their workspace);
4. ``parked``: anything else; it does not run, and the model reads that it did not.

The decision is committed as a ``call_replayed`` fact in the call's T2 append, before T2.
Nothing a replay runs has an effect outside its scratch workspace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger.events import CallReplayed, Event, ToolDispatched, ToolResponded, canonical_json
from lodger.substrates.select import Executors
from lodger.tools.spec import Execution, Tool, ToolContext, ToolOutput

__all__ = ["RecordedCalls", "ReplayPolicy", "replay_tools"]

_DEFAULT_TIME_LIMIT = 120.0


@dataclass(frozen=True, kw_only=True)
class ReplayPolicy:
    """How a replay answers calls (see the module docstring); every answer that is not
    ``recorded`` can be turned off, and what is off parks."""

    #: answer a call the source made from its recorded result
    recorded: bool = True
    #: run read-only tools (``writes=False``, ``recovery="idempotent"``) on the replay's
    #: workspace
    live: bool = True
    #: run confined tools in the scratch workspace restored from the recorded snapshot
    sandbox: bool = True
    #: in-process tools known to stay inside their workspace (they run under ``sandbox``)
    confined: frozenset[str] = frozenset({"write_file", "edit_file"})

    def describe(self) -> str:
        """What ``replay_started.policy`` records: the answers allowed, joined by ``+``."""
        allowed = [name for name in ("recorded", "live", "sandbox") if getattr(self, name)] or [
            "parked"
        ]
        return "+".join(allowed)


@dataclass(frozen=True, slots=True)
class _Recorded:
    status: str
    content: str
    offset: int


@dataclass
class RecordedCalls:
    """The source's completed calls after the fork point, by tool and canonical arguments,
    in log order; each answers one replayed call."""

    calls: dict[tuple[str, str], list[_Recorded]] = field(default_factory=dict)

    @classmethod
    def of(cls, events: Sequence[Event]) -> RecordedCalls:
        dispatched: dict[str, ToolDispatched] = {}
        found = cls()
        for event in events:
            body = event.body
            if isinstance(body, ToolDispatched):
                dispatched[body.operation_id] = body
            elif isinstance(body, ToolResponded) and body.operation_id in dispatched:
                t1 = dispatched.pop(body.operation_id)
                key = (t1.tool, canonical_json(t1.arguments).decode())
                found.calls.setdefault(key, []).append(
                    _Recorded(body.status, body.content, event.offset)
                )
        return found

    def take(self, tool: str, arguments: dict[str, Any]) -> _Recorded | None:
        queue = self.calls.get((tool, canonical_json(arguments).decode()))
        return queue.pop(0) if queue else None


def _reads_only(t: Tool) -> bool:
    return not t.schema().writes and t.recovery == "idempotent" and t.substrate is None


def _confined(t: Tool, policy: ReplayPolicy) -> Tool | None:
    """The tool as it runs in the replay's sandbox (None: it cannot be confined)."""
    substrate = t.substrate
    if substrate is None:
        return t if t.name in policy.confined else None
    sandbox_policy = getattr(substrate, "policy", None)
    if substrate.kind != "sandboxed_process" or not getattr(sandbox_policy, "confined", False):
        return None  # a host process, a code cell, remote work: not ours to confine
    from lodger.substrates.sandbox.policy import NetworkPolicy  # only a sandboxed tool

    offline = dataclasses.replace(sandbox_policy, network=NetworkPolicy())  # type: ignore[type-var]
    return t.with_options(substrate=dataclasses.replace(substrate, policy=offline))  # type: ignore[type-var]


def _as_output(execution: Execution, answer: CallReplayed) -> ToolOutput:
    status = execution.status
    content = execution.content
    if execution.suspended or execution.accepted is not None:
        content = f"{content}\n[the replay does not follow work handed off elsewhere]"
        status = "error"
    elif status not in ("ok", "error"):
        content = f"[{status}] {content}"
    return ToolOutput(
        content=content,
        is_error=status != "ok",
        parts=execution.parts,
        facts=(*execution.facts, answer),
    )


def _parked(t: Tool, operation_id: str) -> ToolOutput:
    return ToolOutput(
        content=(
            f"not run: {t.name} may have effects outside the workspace and this replay "
            "runs none; the source session made no call with these arguments"
        ),
        is_error=True,
        facts=(CallReplayed(operation_id=operation_id, source="parked"),),
    )


def _replaying(t: Tool, recorded: RecordedCalls, policy: ReplayPolicy, sandboxed: bool) -> Tool:
    confined = _confined(t, policy) if sandboxed and policy.sandbox else None
    reads = policy.live and _reads_only(t)
    time_limit = t.timeout if t.timeout is not None else _DEFAULT_TIME_LIMIT
    executors = Executors()

    async def answer(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        found = recorded.take(t.name, arguments) if policy.recorded else None
        if found is not None:
            fact = CallReplayed(
                operation_id=ctx.operation_id, source="recorded", source_offset=found.offset
            )
            return ToolOutput(content=found.content, is_error=found.status != "ok", facts=(fact,))
        runner = t if reads else confined
        if runner is None:
            return _parked(t, ctx.operation_id)
        execution = await executors.for_tool(runner).execute(
            tool=runner, arguments=arguments, context=ctx, time_limit=time_limit
        )
        how = "live" if reads else "sandbox"
        return _as_output(execution, CallReplayed(operation_id=ctx.operation_id, source=how))

    # Same name, description and schema: each step records the source's schema digests.
    return t.with_options(
        handler=answer,
        substrate=None,
        probe=None,
        poll=None,
        expectations=None,
        approval=False,
        writes=t.schema().writes,  # the model is told the same as the source's was
        recovery="never_retry",  # a replay killed mid-call parks the call; nothing reruns
    )


def replay_tools(
    tools: Sequence[Tool],
    source_events: Sequence[Event],
    policy: ReplayPolicy,
    *,
    sandboxed: bool,
) -> list[Tool]:
    """``tools`` answered as a replay answers them (``sandboxed``: the replay works in a
    scratch workspace restored from the log, where confined tools may run)."""
    recorded = RecordedCalls.of(source_events)
    return [_replaying(t, recorded, policy, sandboxed) for t in tools]
