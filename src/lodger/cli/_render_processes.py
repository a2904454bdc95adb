"""``lodger log show`` lines for background processes: ``process_started`` and
``process_ended`` (``lodger.substrates.processes``)."""

from __future__ import annotations

from collections.abc import Callable

from lodger.events import Event, ProcessEnded, ProcessStarted

__all__ = ["describe_processes"]

Part = str | tuple[str, str]

_ENDED_STYLE = {"exited": "green", "stopped": "yellow", "unknown": "bold red"}


def describe_processes(event: Event, clip: Callable[[str], str]) -> list[Part] | None:
    """A background process started (its command clipped by ``clip``) or ended."""
    body = event.body
    if isinstance(body, ProcessStarted):
        pid = f" pid={body.pid}" if body.pid is not None else ""
        return [
            ("process started", "bold cyan"),
            f"  {body.process_id}{pid} keep={body.keep} op={body.operation_id}  ",
            clip(body.command),
        ]
    if isinstance(body, ProcessEnded):
        detail = f" exit={body.exit_code}" if body.exit_code is not None else ""
        if body.status == "limit":
            detail += f" limit={body.reason}"
        elif body.reason:
            detail += f" ({clip(body.reason)})"
        return [
            ("process ended", _ENDED_STYLE.get(body.status, "red")),
            f"  {body.process_id} ",
            (body.status, "bold"),
            f"{detail} output={body.output_bytes} bytes",
        ]
    return None
