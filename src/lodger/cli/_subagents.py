"""Subagents in the log commands: a delegation's child inline under its call in
``lodger log show`` (one folded line, or its whole timeline with ``--children``), and the
family of sessions in ``lodger sessions --tree``.

Only reads. A child is found from its parent's T1 (``actor:subagent:<id>``) and read (and
verified) like any session; a child that cannot be read is shown with the reason instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.text import Text

from lodger.cli._render import CallExtra, clip, render_timeline
from lodger.cli._timeline import CallNode, SessionSummary, build_timeline
from lodger.errors import CorruptLogError, SessionNotFoundError
from lodger.events import Event, ToolDispatched
from lodger.runtime.subagents.family import FamilyNode
from lodger.runtime.subagents.link import ChildOutcome, child_outcome, session_from_resources
from lodger.storage import EventLog

__all__ = ["ChildView", "children_extra", "load_children", "render_family"]

_ANSWER = 120
_MAX_UNFOLD = 4  # levels of children unfolded under one another

_STYLES = {"completed": "green", "open": "yellow", "never started": "yellow"}


@dataclass(kw_only=True)
class ChildView:
    call_id: str
    session_id: str
    outcome: ChildOutcome | None = None
    problem: str | None = None
    events: list[Event] = field(default_factory=list)
    children: dict[str, ChildView] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.problem is not None:
            return self.problem
        if self.outcome is None:
            return "never started"
        return self.outcome.status or "open"


async def load_children(
    log: EventLog, events: Sequence[Event], *, unfold: bool, level: int = 0
) -> dict[str, ChildView]:
    """The child session of each delegation among ``events``, by call id (with their own
    children when ``unfold``)."""
    found: dict[str, ChildView] = {}
    for e in events:
        body = e.body
        if not isinstance(body, ToolDispatched) or e.call_id is None:
            continue
        child_id = session_from_resources(body.resources)
        if child_id is None:
            continue
        view = ChildView(call_id=e.call_id, session_id=child_id)
        try:
            view.events = await log.read_all(child_id)
        except SessionNotFoundError:
            pass  # the delegation never wrote the child's first event
        except CorruptLogError as exc:
            view.problem = f"unreadable: {exc.message}"
        else:
            view.outcome = child_outcome(child_id, view.events)
            if unfold and level + 1 < _MAX_UNFOLD:
                view.children = await load_children(log, view.events, unfold=True, level=level + 1)
        found[e.call_id] = view
    return found


def _folded(view: ChildView, full: bool) -> Text:
    status = view.status
    line = Text.assemble(
        ("subagent ", "bold"),
        (view.session_id, "cyan"),
        "  ",
        (status, _STYLES.get(status, "red")),
    )
    outcome = view.outcome
    if outcome is not None:
        line.append(f"  {outcome.steps} steps", "dim")
        if outcome.answer is not None:
            line.append("  answer: " + clip(outcome.answer, None if full else _ANSWER))
        elif outcome.error is not None:
            line.append("  error: " + clip(outcome.error, None if full else _ANSWER), "red")
    return line


def children_extra(children: Mapping[str, ChildView], *, full: bool, unfold: bool) -> CallExtra:
    """What ``render_timeline`` shows under each delegation: the child's line, and with
    ``unfold`` its timeline (each line marked with a bar)."""

    def extra(call: CallNode) -> Sequence[Text]:
        view = children.get(call.call_id)
        if view is None:
            return ()
        lines = [_folded(view, full)]
        if unfold and view.events:
            inner = render_timeline(
                build_timeline(view.events),
                full=full,
                call_extra=children_extra(view.children, full=full, unfold=True),
            )
            lines.extend(Text.assemble(("│ ", "dim"), line) for line in inner)
        return lines

    return extra


def render_family(
    roots: Sequence[FamilyNode], summaries: Mapping[str, SessionSummary]
) -> list[Text]:
    """One line per session, children under their parent: relation, status, events."""
    lines: list[Text] = []
    for root in roots:
        for depth, node in root.walk():
            lines.append(_family_line(node, depth, summaries.get(node.session_id)))
    return lines


def _family_line(node: FamilyNode, depth: int, summary: SessionSummary | None) -> Text:
    indent = "   " * max(depth - 1, 0) + ("└─ " if depth else "")
    line = Text.assemble(indent, (node.session_id, "cyan"))
    if node.relation == "subagent" and node.link is not None:
        how = "forked" if node.link.history == "fork" else "empty history"
        line.append(f"  subagent of call {node.link.parent_call} ({how})", "magenta")
    elif node.relation == "fork":
        line.append(f"  fork at offset {node.at}", "magenta")
    if summary is not None:
        status = summary.last_status or "-"
        line.append("  ")
        line.append(status, _STYLES.get(status, "red" if status != "-" else "dim"))
        line.append(f"  {summary.events} events", "dim")
    return line
