"""Rich views of log projections: the session table and the timeline.

Every line of the timeline starts with the offset of the fact it shows and its local time,
then indentation for depth in the tree built by :mod:`lodger.cli._timeline`. Event text is
always passed to rich as plain text, never as markup: a tool result containing ``[red]``
must print as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from lodger._core.text import escape_matches
from lodger.cli._common import format_ts
from lodger.cli._render_extensions import describe_extensions
from lodger.cli._render_processes import describe_processes
from lodger.cli._render_rewind import describe_rewind
from lodger.cli._timeline import (
    CallNode,
    Item,
    Page,
    SessionSummary,
    Span,
    Timeline,
    number_runs,
)
from lodger.engine.budgets import describe
from lodger.events import (
    ArtifactStored,
    Attachment,
    BudgetReached,
    CallAccepted,
    CallRejected,
    CancelRequested,
    Compacted,
    CompactionFailed,
    ContextCompacted,
    Event,
    MessageQueued,
    ModelOutput,
    ModelSwitched,
    OperatorDecision,
    PermissionDecided,
    PermissionModeChanged,
    PermissionRequested,
    ProviderRetried,
    QueueChanged,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    SessionStarted,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    TurnEnded,
    TurnStarted,
    Usage,
    WorkspaceSnapshot,
)

if TYPE_CHECKING:  # the engine is imported when a usage is computed, not by `lodger log`
    from lodger.engine.loop import RunUsage

__all__ = [
    "hidden_note",
    "render_sessions",
    "render_timeline",
    "summarize_arguments",
    "usage_of",
    "usage_text",
]

Part = str | tuple[str, str]

_STATUS_STYLE = {
    "ok": "green",
    "completed": "green",
    "error": "red",
    "failed": "red",
    "denied": "red",
    "rejected": "red",
    "corrupt": "bold red",
    "unverified": "bold yellow",
    "abandoned": "red",
    "cancelled": "yellow",
    "interrupted": "yellow",
    "dispatched": "yellow",
    "running": "cyan",
    "parked": "yellow",
    "step_limit": "yellow",
}

# Clip limits for the default view; ``--all`` shows everything.
_TEXT = 160
_REASONING = 100
_ARGS = 80
_ARG_VALUE = 40
_PREVIEW = 80


# Control characters (ESC starts terminal sequences that clear the screen, move the
# cursor over earlier lines or set the title) and bidirectional overrides: what a log holds
# is data, often from a tool's output or a web page, and must never drive the terminal.
_UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every control character and direction override shown as an escape
    (``\\x1b``, ``\\u202e``) instead of sent to the terminal."""
    return escape_matches(_UNSEEN, text)


def visible_line(line: Text) -> Text:
    """``line`` as ``visible`` would print it: a line that holds a control character loses
    its colors (escaping changes where its styles fall), every other line is kept."""
    if _UNSEEN.search(line.plain) is None:
        return line
    return Text(visible(line.plain), style=line.style)


def clip(text: str, limit: int | None) -> str:
    """One line: whitespace collapsed, control characters shown as escapes (``visible``),
    cut at ``limit`` with a note of what was left out."""
    flat = visible(" ".join(text.split()))
    if limit is None or len(flat) <= limit:
        return flat
    return f"{flat[: limit - 3]}... (+{len(flat) - limit + 3} chars)"


def summarize_arguments(raw: str | None, limit: int | None = _ARGS) -> str:
    """``path="a.txt", mode="r"`` from the raw argument JSON the model proposed."""
    if raw is None:
        return ""
    try:
        value = json.loads(raw)
    except ValueError:
        return clip(raw, limit)
    if isinstance(value, dict):
        value_limit = None if limit is None else _ARG_VALUE
        text = ", ".join(
            f"{key}={clip(json.dumps(item, ensure_ascii=False), value_limit)}"
            for key, item in value.items()
        )
    else:
        text = json.dumps(value, ensure_ascii=False)
    return clip(text, limit)


def _status(status: str) -> tuple[str, str]:
    return (status, _STATUS_STYLE.get(status, "bold"))


def _duration(start: int, end: int) -> str:
    us = end - start
    return f"{us / 1000:.0f} ms" if abs(us) < 10_000_000 else f"{us / 1_000_000:.1f} s"


def _quoted(text: str, limit: int | None) -> str:
    # Quotes only mark where the text starts and ends; escaping would garble JSON results.
    return f'"{clip(text, limit)}"'


# Lines to show under a call after its own facts (a delegation's child session), indented
# one level below the call; given to ``render_timeline``.
CallExtra = Callable[[CallNode], Sequence[Text]]


class _TimelineView:
    def __init__(
        self,
        timeline: Timeline,
        *,
        full: bool,
        page: Page | None,
        last: Event | None,
        call_extra: CallExtra | None = None,
    ) -> None:
        self.call_extra = call_extra
        self.timeline = timeline
        self.full = full
        self.page = page
        last_offset = last.offset if last is not None else 0
        self.offset_width = max(len(str(last_offset)), 2)
        self.lines: list[Text] = []
        self.turn_numbers = {span.event.offset: n for n, span in enumerate(timeline.turns, 1)}

    def turn_number(self, event: Event) -> int | None:
        if self.page is not None:
            return self.page.index.number_at(event.offset)
        return self.turn_numbers.get(event.offset)

    def limit(self, default: int) -> int | None:
        return None if self.full else default

    def line(self, offset: int | None, ts: int | None, depth: int, *parts: Part | Text) -> None:
        column = "" if offset is None else str(offset)
        clock = "" if ts is None else format_ts(ts, date=False)
        self.lines.append(
            Text.assemble(
                (column.rjust(self.offset_width), "cyan"),
                "  ",
                (clock.ljust(12), "dim"),
                "  " * (depth + 1),
                *parts,
            )
        )

    # -- tree walk ---------------------------------------------------------------

    def items(self, items: Sequence[Item], depth: int) -> None:
        for item in items:
            if isinstance(item, Span):
                self.line(item.event.offset, item.event.ts, depth, *self.describe(item.event))
                self.items(item.children, depth + 1)
                if item.kind == "turn_started":
                    used = usage_of(_span_events(item))
                    if used.requests:
                        self.line(None, None, depth + 1, ("usage: " + usage_text(used), "dim"))
            elif isinstance(item, CallNode):
                self.call(item, depth)
            else:
                self.fact(item, depth)

    def call(self, call: CallNode, depth: int) -> None:
        start, end = call.interval()
        arguments = call.arguments if call.arguments is not None else call.dispatch_arguments()
        parts: list[Part] = [
            ("call ", "bold"),
            (call.name, "bold yellow"),
            f"({summarize_arguments(arguments, self.limit(_ARGS))})",
            ("  id=", "dim"),
            (call.call_id, "dim"),
            "  ",
            _status(call.status()),
        ]
        if call.hidden or call.origin == "code_mode":
            parts.append((f"  [{call.origin}, hidden]" if call.hidden else "  [code_mode]", "dim"))
        if start is not None:
            until = format_ts(end, date=False) if end is not None else "no response"
            parts.append((f"  {format_ts(start, date=False)} -> {until}", "magenta"))
            if end is not None:
                parts.append((f" ({_duration(start, end)})", "magenta"))
        first = call.proposed_by or (call.facts[0] if call.facts else None)
        self.line(call.offset, first.ts if first else None, depth, *parts)
        # Facts and nested calls interleave in log order under the call.
        nested: list[tuple[int, CallNode | Event]] = [(f.offset, f) for f in call.facts]
        nested += [(child.offset, child) for child in call.children]
        for _, entry in sorted(nested, key=lambda pair: pair[0]):
            if isinstance(entry, CallNode):
                self.call(entry, depth + 1)
            else:
                self.fact(entry, depth + 1)
        if self.call_extra is not None:
            for extra in self.call_extra(call):
                self.line(None, None, depth + 1, extra)

    def fact(self, event: Event, depth: int) -> None:
        self.line(event.offset, event.ts, depth, *self.describe(event))
        body = event.body
        if isinstance(body, ModelOutput) and body.reasoning:
            reasoning = clip(body.reasoning, self.limit(_REASONING))
            self.line(None, None, depth + 1, (f"reasoning: {reasoning}", "dim"))

    # -- one event, one line ----------------------------------------------------------

    def describe(self, event: Event) -> list[Part]:
        for describe_kind in (
            self._describe_lifecycle,
            self._describe_model_and_calls,
            self._describe_decisions,
            self._describe_records,
            self._describe_steering,
            describe_rewind,
            lambda event: describe_processes(event, lambda t: clip(t, self.limit(_TEXT))),
            lambda event: describe_extensions(event, lambda t: clip(t, self.limit(_TEXT))),
            self._describe_session_control,
        ):
            parts = describe_kind(event)
            if parts is not None:
                return parts
        return [event.kind]  # pragma: no cover - every kind is handled by a describer

    def _describe_lifecycle(self, event: Event) -> list[Part] | None:
        """A session, turn, run or step starting or ending."""
        body = event.body
        if isinstance(body, SessionStarted):
            parts: list[Part] = [("session started", "bold"), f"  workspace={body.workspace}"]
            if body.parent is not None:
                parent = body.parent
                parts.append(f"  fork of {parent.session_id} at offset {parent.high_water}")
            return parts
        if isinstance(body, TurnStarted):
            number = self.turn_number(event)
            return [
                ("turn ", "bold magenta"),
                (f"#{number} " if number is not None else "", "bold magenta"),
                (event.turn_id or "?", "magenta"),
                "  input ",
                _quoted(body.input, self.limit(_TEXT)),
                *(f"  + {_attachment(a)}" for a in body.attachments),
            ]
        if isinstance(body, RunStarted):
            parts = [("run ", "bold blue"), (event.run_id or "?", "blue"), f"  model={body.model}"]
            if body.parent_run_id is not None:
                parts.append(f"  parent run={body.parent_run_id}")
            if body.resumed_from is not None:
                prefix = body.resumed_from
                parts.append(f"  resumed from prefix [0, {prefix.high_water}) {prefix.digest[:12]}")
            return parts
        if isinstance(body, StepStarted):
            names = ", ".join(tool.name for tool in body.tools) or "none"
            return [
                ("step ", "blue"),
                (str(body.index), "bold blue"),
                f"  model={body.model}",
                ("  tools: ", "dim"),
                names,
            ]
        if isinstance(body, RunEnded):
            error = f"  {clip(body.error, self.limit(_TEXT))}" if body.error else ""
            return [("run ended ", "bold blue"), _status(body.status), error]
        if isinstance(body, TurnEnded):
            answer = f"  answer {_quoted(body.answer, self.limit(_TEXT))}" if body.answer else ""
            return [("turn ended ", "bold magenta"), _status(body.status), answer]
        return None

    def _compaction(self, body: Compacted | CompactionFailed) -> list[Part]:
        """What a compaction covered and dropped, or why it failed and what the step did."""
        covers = f"  covers [0, {body.covers.high_water}) {body.covers.digest[:12]}"
        if isinstance(body, CompactionFailed):
            return [
                ("compaction failed", "bold red"),
                covers,
                f"  after {body.attempts} attempt(s): ",
                clip(body.reason, self.limit(_TEXT)),
                ("  fallback=", "dim"),
                (body.fallback, "yellow"),
                (f"  trigger={body.trigger}", "dim"),
            ]
        calls = len(body.dropped_call_ids)
        parts: list[Part] = [
            ("compacted", "bold cyan"),
            covers,
            ("  tokens ", "bold"),
            f"{body.tokens_before:,} -> {body.tokens_after:,}",
            f"  dropped {calls} call{'s' if calls != 1 else ''}, {body.dropped_bytes:,} bytes"
            f" (~{body.dropped_tokens:,} tokens)",
            (f"  trigger={body.trigger}", "dim"),
            (f"  model={visible(body.model)}", "dim"),
        ]
        if body.previous is not None:
            parts.append((f"  chains #{body.previous}", "dim"))
        if body.pinned:
            parts.append(("  pinned: " + clip(", ".join(body.pinned), self.limit(_PREVIEW)), "dim"))
        if body.native_state is not None:
            parts.append(("  [native state]", "dim"))
        parts.append("  summary " + _quoted(body.summary, self.limit(_PREVIEW)))
        return parts

    def _describe_model_and_calls(self, event: Event) -> list[Part] | None:
        """What the model said and what became of the calls it proposed."""
        body = event.body
        if isinstance(body, ModelOutput):
            parts: list[Part] = [("output", "bold")]
            if body.text:
                parts.append(" " + _quoted(body.text, self.limit(_TEXT)))
            if body.calls:
                parts.append((f"  {len(body.calls)} call(s)", "yellow"))
            if body.finish_reason:
                parts.append((f"  finish={body.finish_reason}", "dim"))
            if body.usage is not None:
                usage = body.usage
                parts.append((f"  tokens in={usage.input_tokens} out={usage.output_tokens}", "dim"))
            return parts
        if isinstance(body, BudgetReached):
            return [
                ("budget reached ", "bold yellow"),
                (body.budget, "yellow"),
                "  " + describe(body),
            ]
        if isinstance(body, ProviderRetried):
            return [
                ("provider retry", "yellow"),
                f"  attempt {body.attempt} in {body.delay_ms} ms: ",
                clip(body.error, self.limit(_TEXT)),
            ]
        if isinstance(body, ModelSwitched):
            return [
                ("model switched", "yellow"),
                f"  {body.from_model} -> {body.to_model}: ",
                clip(body.error, self.limit(_TEXT)),
            ]
        if isinstance(body, ToolsActivated):
            return [
                ("tools activated", "cyan"),
                f"  query={_quoted(body.query, 60)}: ",
                ", ".join(body.names) or "none",
            ]
        if isinstance(body, CallRejected):
            return [
                ("rejected ", "red"),
                (body.reason, "bold red"),
                f"  {body.tool}: ",
                clip(body.message, self.limit(_TEXT)),
            ]
        if isinstance(body, ToolDispatched):
            parts = [("T1 dispatched", "yellow"), f"  op={body.operation_id}"]
            if body.attempt > 1 or body.retry_of:
                parts.append(f"  attempt {body.attempt} retry of {body.retry_of}")
            if body.resources:
                parts.append(("  resources: " + ", ".join(body.resources), "dim"))
            return parts
        if isinstance(body, CallAccepted):
            handle = json.dumps(body.handle, sort_keys=True, ensure_ascii=False)
            return [
                ("accepted", "bold cyan"),
                f"  op={body.operation_id}  running remotely, ",
                ("waits" if body.wait == "wait" else "turn continues", "cyan"),
                "  handle=" + clip(visible(handle), self.limit(_PREVIEW)),
            ]
        if isinstance(body, ToolResponded):
            parts = [
                ("T2 ", "bold"),
                _status(body.status),
                "  ",
                _quoted(body.content, self.limit(_PREVIEW)),
            ]
            if body.truncated:
                parts.append(("  (truncated)", "dim"))
            if body.artifacts:
                parts.append((f"  {len(body.artifacts)} artifact(s)", "dim"))
            return parts
        return None

    def _describe_decisions(self, event: Event) -> list[Part] | None:
        """A permission asked or decided, and recovery's or the operator's decisions."""
        body = event.body
        if isinstance(body, PermissionRequested):
            return [
                ("permission asked", "yellow"),
                f"  {body.tool}: ",
                clip(body.summary, self.limit(_TEXT)),
            ]
        if isinstance(body, PermissionDecided):
            style = {"allow": "green", "park": "yellow"}.get(body.decision, "red")
            reason = f" ({body.reason})" if body.reason and body.reason != body.who else ""
            who = f" {visible(body.who)}" if body.who else ""
            return [
                ("permission ", "bold"),
                (body.decision, style),
                f" by {body.by}{who}{visible(reason)}",
            ]
        if isinstance(body, RecoveryObserved):
            note = f"  {clip(body.observation, self.limit(_PREVIEW))}" if body.observation else ""
            return [
                ("recovery observed", "magenta"),
                f"  op={body.operation_id} ",
                _status(body.status),
                f" ({body.reason}){note}",
            ]
        if isinstance(body, RecoveryDecided):
            reason = f" ({body.reason})" if body.reason else ""
            return [
                ("recovery decided", "magenta"),
                f"  op={body.operation_id} ",
                (body.action, "bold"),
                reason,
            ]
        if isinstance(body, OperatorDecision):
            result = f"  result={_quoted(body.result, self.limit(_PREVIEW))}" if body.result else ""
            return [
                ("operator decision", "bold magenta"),
                f"  op={body.operation_id} ",
                (body.decision, "bold"),
                f" by {body.by}" + (f" {visible(body.who)}" if body.who else "") + result,
            ]
        return None

    def _describe_records(self, event: Event) -> list[Part] | None:
        """What was stored beside the log or done to the context."""
        body = event.body
        if isinstance(body, ArtifactStored):
            ref = body.artifact
            return [
                ("artifact", "cyan"),
                f"  {body.name or '-'} sha256={ref.sha256[:12]} {ref.size} bytes {ref.media_type}",
            ]
        if isinstance(body, WorkspaceSnapshot):
            return [
                ("workspace snapshot", "cyan"),
                f"  {body.ref} {body.files} files {body.size} bytes",
            ]
        if isinstance(body, ContextCompacted):
            return [
                ("context compacted", "cyan"),
                f"  {len(body.elided_call_ids)} result(s) elided, "
                f"~{body.estimated_tokens}/{body.budget_tokens} tokens",
            ]
        if isinstance(body, Compacted | CompactionFailed):
            return self._compaction(body)
        return None

    def _describe_session_control(self, event: Event) -> list[Part] | None:
        """A person's control of the session: a cancel, a permission-mode switch."""
        body = event.body
        if isinstance(body, CancelRequested):
            who = f" by {visible(body.who)}" if body.who else ""
            reason = f"  {_quoted(body.reason, self.limit(_TEXT))}" if body.reason else ""
            return [("cancel requested", "bold red"), who, reason]
        if isinstance(body, PermissionModeChanged):
            who = f" by {visible(body.who)}" if body.who else ""
            return [
                ("permission mode ", "bold"),
                f"{body.previous or 'none'} -> ",
                (body.mode, "bold yellow"),
                f"{who}  (from the next step)",
            ]
        return None

    def _describe_steering(self, event: Event) -> list[Part] | None:
        """Steers of a running turn and the follow-up queue (``lodger.engine.steering``)."""
        body = event.body
        if isinstance(body, SteerReceived):
            return [
                ("steer received", "bold yellow"),
                f"  {body.steer_id}  ",
                _quoted(body.text, self.limit(_TEXT)),
                _by(body.who),
            ]
        if isinstance(body, SteerDelivered):
            return [
                ("steer delivered", "yellow"),
                f"  at step {body.step}: ",
                ", ".join(body.steer_ids),
            ]
        if isinstance(body, MessageQueued):
            return [
                ("message queued", "bold cyan"),
                f"  {body.message_id}  policy={body.policy}  ",
                _quoted(body.text, self.limit(_TEXT)),
                _by(body.who),
            ]
        if isinstance(body, QueueChanged):
            detail = ""
            if body.action == "edit" and body.text is not None:
                detail = "  " + _quoted(body.text, self.limit(_TEXT))
            elif body.action == "move" and body.position is not None:
                detail = f"  to position {body.position}"
            return [
                ("queue ", "cyan"),
                (body.action, "bold"),
                f"  {body.message_id}{detail}{_by(body.who)}",
            ]
        return None


def _by(who: str | None) -> str:
    return f"  by {visible(who)}" if who else ""


def _numbers(runs: Sequence[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def hidden_note(page: Page, command: str) -> str | None:
    """One line naming the turns a page leaves out and how to see them, or None.

    ``command`` is the ``lodger log show`` command line of the session, options excluded.
    """
    hidden = page.hidden()
    if not hidden:
        return None
    plural = "s" if len(page.shown) > 1 else ""
    hidden_plural = "s" if sum(b - a + 1 for a, b in hidden) > 1 else ""
    return (
        f"showing turn{plural} {_numbers(number_runs(page.shown))} of {page.index.count}; "
        f"turn{hidden_plural} {_numbers(hidden)} hidden: `{command} --turn N` shows turn N, "
        "`--last-turns N` the last N turns, `--all` everything"
    )


def render_timeline(
    timeline: Timeline,
    *,
    full: bool = False,
    page: Page | None = None,
    first: Event | None = None,
    last: Event | None = None,
    command: str = "lodger log show SESSION",
    call_extra: CallExtra | None = None,
) -> list[Text]:
    """The timeline as lines of rich text; ``full`` turns off clipping of text and results.

    For a ``page`` of a longer log, ``first`` and ``last`` are the log's first and last
    events (for the header), turns are numbered as in the whole log, and a line after the
    header names the hidden turns and how to show them with ``command``.
    """
    events = timeline.events
    first = first or (events[0] if events else None)
    last = last or (events[-1] if events else None)
    view = _TimelineView(timeline, full=full, page=page, last=last, call_extra=call_extra)
    if first is not None and last is not None:
        view.lines.append(
            Text.assemble(
                ("session ", "bold"),
                (timeline.session_id, "bold cyan"),
                f"  {last.offset + 1} events, head digest {last.digest[:16]}",
                (f"  {format_ts(first.ts)} -> {format_ts(last.ts)}", "dim"),
            )
        )
    note = hidden_note(page, command) if page is not None else None
    if note is not None:
        view.lines.append(Text(note, "yellow"))
    view.items(timeline.items, 0)
    used = usage_of(events)
    if used.requests:
        label = "usage of the turns shown" if note is not None else "session usage"
        view.lines.append(Text(f"{label}: {usage_text(used)}", "dim"))
    return view.lines


def usage_of(events: Sequence[Event]) -> RunUsage:
    """The usage of every model request among ``events`` (a turn's, a session's)."""
    from lodger.engine.loop import RunUsage  # the engine's imports only when a usage is read

    return RunUsage(
        requests=tuple(
            e.body.usage or Usage()
            for e in events
            if e.origin == "provider" and isinstance(e.body, ModelOutput)
        )
    )


def usage_text(usage: RunUsage) -> str:
    """``1,200 in (900 from cache: 75% hit; 300 written), 80 out over 3 model calls``:
    the cache part only when the provider reported cached tokens."""
    calls = len(usage.requests)
    cache = ""
    if usage.cache_read_tokens or usage.cache_write_tokens:
        rate = usage.cache_hit_rate or 0.0
        cache = f" ({usage.cache_read_tokens:,} from cache: {rate:.0%} hit"
        if usage.cache_write_tokens:
            cache += f"; {usage.cache_write_tokens:,} written"
        cache += ")"
    return (
        f"{usage.input_tokens:,} in{cache}, {usage.output_tokens:,} out over {calls} model "
        f"call{'s' if calls != 1 else ''}"
    )


def _span_events(span: Span) -> list[Event]:
    """Every fact inside ``span``, its nested spans' too."""
    found: list[Event] = []
    for child in span.children:
        if isinstance(child, Span):
            found.append(child.event)
            found += _span_events(child)
        elif isinstance(child, CallNode):
            found += child.facts
        else:
            found.append(child)
    return found


def render_sessions(rows: Sequence[SessionSummary]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("session", style="cyan", no_wrap=True)
    table.add_column("events", justify="right")
    table.add_column("turns", justify="right")
    table.add_column("last turn")
    table.add_column("last activity", no_wrap=True)
    table.add_column("workspace", overflow="fold")
    for row in rows:
        status = row.last_status or "-"
        table.add_row(
            row.session_id,
            str(row.events),
            str(row.turns),
            Text(*_status(status)),
            format_ts(row.last_ts) if row.last_ts is not None else "-",
            Text(visible(row.workspace or "-")),
        )
    return table


def _attachment(a: Attachment) -> str:
    """An attachment as the timeline names it: its media type, and its file or URL."""
    if a.url is not None:
        return f"{a.media_type} {a.url}"
    size = f" {a.artifact.size} bytes" if a.artifact is not None else ""
    return f"{a.media_type} {a.name or 'attachment'}{size}"
