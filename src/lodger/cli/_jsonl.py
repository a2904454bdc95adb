"""Machine output: the versioned JSON shapes of every ``--json``.

Every ``--json`` document is one JSON object with ``"v": JSON_VERSION`` and named fields
(never a bare list), so a field can be added without breaking a reader; a change that
would break one bumps ``v``. ``lodger run --json`` writes JSON Lines instead: one object
per line, flushed as it happens, each with ``v`` and a ``type``:

- ``{"v": 1, "type": "text", "delta": "..."}``: streamed model text (not durable);
- ``{"v": 1, "type": "fact", "offset": N, "kind": "...", "event": {...}}``: a fact just
  committed to the session's log, ``event`` as ``lodger log show --json`` shows it;
- ``{"v": 1, "type": "result", ...}``: the last line: how the turn settled.

Errors under ``--json`` go to stderr as ``{"v": 1, "error": {"code", "message", "hint",
"next_steps": [...]}}`` and the command exits with the documented code.
"""

from __future__ import annotations

import json
from typing import Any

import click

from lodger.cli._common import document
from lodger.cli._live import TurnWatcher
from lodger.cli._next import command_for
from lodger.errors import LodgerError
from lodger.events import Event
from lodger.runtime.agent import TurnResult

__all__ = [
    "JsonlView",
    "echo_error",
    "error_document",
    "json_notice",
    "result_document",
    "usage_error_document",
]


def error_document(exc: LodgerError, flags: str | None = None) -> dict[str, Any]:
    """What ``--json`` prints on stderr for an error: its code, message, hint and next
    steps (each with the command line the human output would print)."""
    error: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.hint:
        error["hint"] = exc.hint
    for key in ("session_id", "offset", "call_id"):
        value = getattr(exc, key)
        if value is not None:
            error[key] = value
    error["next_steps"] = [
        {**step.to_dict(), "command": command_for(step, flags)} for step in exc.next_steps
    ]
    blockers = getattr(exc, "blockers", None)
    if blockers:
        error["blockers"] = list(blockers)
    notes = getattr(exc, "__notes__", None)
    if notes:  # what failed after it (closing the writer, say), reported second
        error["notes"] = [str(note) for note in notes]
    return document({"error": error})


def usage_error_document(exc: click.UsageError) -> dict[str, Any]:
    """A bad command line under ``--json``: code ``usage``, click's message."""
    command = exc.ctx.command_path if exc.ctx is not None else "lodger"
    return document(
        {
            "error": {
                "code": "usage",
                "message": exc.format_message(),
                "hint": f"see `{command} --help`",
                "next_steps": [],
            }
        }
    )


def echo_error(error: dict[str, Any]) -> None:
    click.echo(json.dumps(error, ensure_ascii=False), err=True)


def json_notice(text: str) -> None:
    """A notice on stderr under ``--json`` (stopping, exiting): ``{"v": 1, "notice": ...}``."""
    echo_error(document({"notice": text}))


def result_document(result: TurnResult, exit_code: int) -> dict[str, Any]:
    usage = result.usage
    output = result.output
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        output = repr(
            output
        )  # a validated value the caller's type made; its log form is in turn_ended
    return document(
        {
            "type": "result",
            "session_id": result.session_id,
            "turn_id": result.turn_id,
            "run_id": result.run_id,
            "status": result.status,
            "answer": result.answer,
            "output": output,
            "error": result.error,
            # the limit a parked turn reached (a budget_reached body), else null
            "budget": result.budget.model_dump(mode="json") if result.budget else None,
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
                "requests": [u.model_dump(mode="json") for u in usage.requests],
            },
            "commits": result.commits,
            "exit_code": exit_code,
        }
    )


class JsonlView(TurnWatcher):
    """``lodger run --json``: one JSON line per streamed text delta and committed fact."""

    def _emit(self, line: dict[str, Any]) -> None:
        click.echo(json.dumps(line, ensure_ascii=False, separators=(",", ":")))

    def on_text(self, delta: str) -> None:
        self._emit(document({"type": "text", "delta": delta}))

    def on_event(self, event: Event) -> None:
        self.track(event)
        self._emit(
            document(
                {
                    "type": "fact",
                    "offset": event.offset,
                    "kind": event.kind,
                    "event": event.model_dump(mode="json"),
                }
            )
        )

    def finish(self, result: TurnResult, exit_code: int) -> None:
        self._emit(result_document(result, exit_code))
