"""Per-call timing of each step's batch, computed from the log: ``lodger log show --timing``.

A pure function of the events (DESIGN L6). For every call that reached T1:

- ``ready``: when it could start, the step's model output (the batch began) or, if a
  person decided its permission, that decision;
- ``wait``: ready -> T1, time spent queued for leases, hashing expectations and waiting
  for the journal;
- ``run``: T1 -> T2, the tool itself plus the T1 commit.

A step line sums the run times and divides by the batch's span (first T1 to last T2):
above 1x the calls overlapped. Each call gets a bar on the step's time axis (``.`` wait,
``#`` run), so overlap and serialization are visible at a glance. The authorities' live
statistics are an API (``ToolRuntime.authority_stats``), since they exist only in the
running process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from rich.text import Text

from lodger.events import (
    Event,
    ModelOutput,
    PermissionDecided,
    StepStarted,
    ToolDispatched,
    ToolResponded,
)

__all__ = ["CallTiming", "StepTiming", "render_timings", "step_timings"]

_BAR = 32


@dataclass(frozen=True, slots=True)
class CallTiming:
    call_id: str
    tool: str
    ready_us: int
    dispatched_us: int
    responded_us: int | None
    status: str

    @property
    def wait_us(self) -> int:
        return max(self.dispatched_us - self.ready_us, 0)

    @property
    def run_us(self) -> int | None:
        return None if self.responded_us is None else self.responded_us - self.dispatched_us


@dataclass(slots=True)
class StepTiming:
    step_id: str
    index: int
    start_us: int
    calls: list[CallTiming] = field(default_factory=list)

    @property
    def span_us(self) -> int:
        """First T1 to last T2 (or last T1 when nothing responded)."""
        if not self.calls:
            return 0
        ends = [c.responded_us or c.dispatched_us for c in self.calls]
        return max(ends) - min(c.dispatched_us for c in self.calls)

    @property
    def busy_us(self) -> int:
        return sum(c.run_us or 0 for c in self.calls)

    @property
    def parallelism(self) -> float | None:
        """Total run time over the batch's span: 1x is serial, Nx is N calls at once."""
        return self.busy_us / self.span_us if self.span_us > 0 else None

    def to_json(self) -> dict[str, object]:
        calls = [{**asdict(c), "wait_us": c.wait_us, "run_us": c.run_us} for c in self.calls]
        return {
            "step_id": self.step_id,
            "index": self.index,
            "span_us": self.span_us,
            "busy_us": self.busy_us,
            "parallelism": self.parallelism,
            "calls": calls,
        }


def step_timings(events: Sequence[Event]) -> list[StepTiming]:
    """Every step that dispatched at least one call, with its calls in T1 order."""
    steps: dict[str, StepTiming] = {}
    index: dict[str, int] = {}
    decided: dict[str, int] = {}
    dispatched: dict[str, Event] = {}
    responded: dict[str, Event] = {}
    for e in events:
        body = e.body
        if isinstance(body, StepStarted) and e.step_id is not None:
            index[e.step_id] = body.index
        elif isinstance(body, ModelOutput) and e.step_id is not None:
            steps[e.step_id] = StepTiming(e.step_id, index.get(e.step_id, -1), e.ts)
        elif e.call_id is None:
            continue
        elif isinstance(body, PermissionDecided) and body.by == "user":
            decided[e.call_id] = e.ts
        elif isinstance(body, ToolDispatched):
            dispatched.setdefault(e.call_id, e)  # a recovery retry keeps the first
        elif isinstance(body, ToolResponded):
            responded[e.call_id] = e
    for call_id, t1 in dispatched.items():
        step = steps.get(t1.step_id or "")
        if step is None or not isinstance(t1.body, ToolDispatched):
            continue  # recovery re-dispatches and code-mode calls have no batch of their own
        t2 = responded.get(call_id)
        status = t2.body.status if t2 is not None and isinstance(t2.body, ToolResponded) else ""
        step.calls.append(
            CallTiming(
                call_id=call_id,
                tool=t1.body.tool,
                ready_us=max(step.start_us, decided.get(call_id, step.start_us)),
                dispatched_us=t1.ts,
                responded_us=t2.ts if t2 is not None else None,
                status=status or "dispatched",
            )
        )
    return [s for s in steps.values() if s.calls]


def _ms(us: int | None) -> str:
    return "      -" if us is None else f"{us / 1000:7.1f}"


def _bar(step: StepTiming, call: CallTiming) -> str:
    start = min(min(c.ready_us for c in step.calls), step.start_us)
    end = max(c.responded_us or c.dispatched_us for c in step.calls)
    scale = _BAR / max(end - start, 1)
    cells = [" "] * _BAR

    def cell(us: int) -> int:
        return min(int((us - start) * scale), _BAR - 1)

    for i in range(cell(call.ready_us), cell(call.dispatched_us)):
        cells[i] = "."
    stop = call.responded_us if call.responded_us is not None else end
    for i in range(cell(call.dispatched_us), max(cell(stop), cell(call.dispatched_us) + 1)):
        cells[i] = "#"
    return "".join(cells)


def render_timings(steps: Sequence[StepTiming]) -> list[Text]:
    """One header line per step, one line per call: wait and run in ms, and a bar."""
    if not steps:
        return [Text("no calls were dispatched in this session")]
    lines: list[Text] = []
    width = max(len(c.call_id) for s in steps for c in s.calls)
    name_width = max(len(c.tool) for s in steps for c in s.calls)
    for step in steps:
        ratio = step.parallelism
        overlap = f"  {ratio:.1f}x parallel" if ratio is not None else ""
        lines.append(
            Text.assemble(
                ("step ", "blue"),
                (str(step.index), "bold blue"),
                f"  {len(step.calls)} call(s), span {step.span_us / 1000:.1f} ms, "
                f"run time {step.busy_us / 1000:.1f} ms in total",
                (overlap, "bold magenta"),
            )
        )
        for call in step.calls:
            lines.append(
                Text.assemble(
                    "  ",
                    (call.call_id.ljust(width), "dim"),
                    "  ",
                    (call.tool.ljust(name_width), "yellow"),
                    f"  wait {_ms(call.wait_us)} ms  run {_ms(call.run_us)} ms  ",
                    ("|", "dim"),
                    (_bar(step, call), "magenta"),
                    ("|", "dim"),
                    f" {call.status}",
                )
            )
    return lines
