"""``lodger log show`` lines for schema 10's facts: MCP elicitation, sampling and
tool-list changes, and the facts replays and evals write."""

from __future__ import annotations

import json
from collections.abc import Callable

from lodger.events import (
    CallReplayed,
    ElicitationAnswered,
    ElicitationRequested,
    EvalScored,
    Event,
    ReplayStarted,
    SamplingAnswered,
    SamplingRequested,
    ToolsChanged,
)

__all__ = ["describe_extensions"]

Part = str | tuple[str, str]


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) or "none"


def _describe_mcp(event: Event, clip: Callable[[str], str]) -> list[Part] | None:
    body = event.body
    if isinstance(body, ElicitationRequested):
        target = f"  url={clip(body.url)}" if body.url else ""
        return [
            ("elicitation asked", "bold magenta"),
            f"  {body.elicitation_id} by {body.server} ({body.mode}) op={body.operation_id}  ",
            clip(body.message),
            target,
        ]
    if isinstance(body, ElicitationAnswered):
        shown = json.dumps(body.content, sort_keys=True, ensure_ascii=False)
        withheld = f"  withheld: {_names(body.withheld)}" if body.withheld else ""
        who = f" {body.who}" if body.who else ""
        return [
            ("elicitation answered", "magenta"),
            f"  {body.elicitation_id} ",
            (body.action, "bold"),
            f" by {body.by}{who}  {clip(shown)}{withheld}",
        ]
    if isinstance(body, SamplingRequested):
        reason = f" ({clip(body.reason)})" if body.reason else ""
        return [
            ("sampling asked", "bold magenta"),
            f"  {body.sampling_id} by {body.server} op={body.operation_id}  ",
            ("allowed" if body.decision == "allow" else "denied", "bold"),
            reason,
        ]
    if isinstance(body, SamplingAnswered):
        return [
            ("sampling answered", "magenta"),
            f"  {body.sampling_id} model={body.model} "
            f"tokens={body.usage.input_tokens}+{body.usage.output_tokens}  ",
            clip(body.content),
        ]
    if isinstance(body, ToolsChanged):
        parts: list[Part] = [
            ("tools changed", "cyan"),
            f"  {body.server}: +{_names(body.added)} -{_names(body.removed)}",
        ]
        if body.unusable:
            parts.append((f"  unusable: {_names(body.unusable)}", "yellow"))
        return parts
    return None


def describe_extensions(event: Event, clip: Callable[[str], str]) -> list[Part] | None:
    """A schema 10 fact's line, or None for any other kind."""
    body = event.body
    if isinstance(body, ReplayStarted):
        return [
            ("replay", "bold cyan"),
            f"  of {body.source_session} at {body.source_offset} model={body.model} "
            f"calls={body.policy}",
        ]
    if isinstance(body, CallReplayed):
        source = f" from offset {body.source_offset}" if body.source_offset is not None else ""
        return [("replayed", "cyan"), f"  op={body.operation_id} {body.source}{source}"]
    if isinstance(body, EvalScored):
        verdict = "" if body.passed is None else (" passed" if body.passed else " failed")
        score = "" if body.score is None else f" score={body.score:g}"
        reason = f"  {clip(body.reason)}" if body.reason else ""
        return [
            ("eval", "bold"),
            f"  {body.eval_run} case={body.case} {body.evaluator}{verdict}{score}{reason}",
        ]
    return _describe_mcp(event, clip)
