"""``lodger log show`` lines for a rewind's facts: ``rewound`` and ``file_checkpoint``."""

from __future__ import annotations

from lodger.events import Event, FileCheckpoint, Rewound

__all__ = ["describe_rewind"]

Part = str | tuple[str, str]


def _short(sha256: str | None) -> str:
    return sha256[:12] if sha256 is not None else "absent"


def describe_rewind(event: Event) -> list[Part] | None:
    """A rewind that made this branch, or a file tool's checkpoint before an edit."""
    body = event.body
    if isinstance(body, Rewound):
        forced = f"; overwrote {', '.join(body.forced)}" if body.forced else ""
        who = f" by {body.who}" if body.who else ""
        return [
            ("rewound", "bold magenta"),
            f"  to offset {body.to.high_water}; left {body.left.session_id} at offset "
            f"{body.left.high_water}; {body.restored} file(s) restored, {body.removed} "
            f"removed{forced}{who}",
        ]
    if isinstance(body, FileCheckpoint):
        return [
            ("file checkpoint", "cyan"),
            f"  {body.path} {_short(body.before_sha256)} -> {_short(body.after_sha256)} "
            f"op={body.operation_id}",
        ]
    return None
