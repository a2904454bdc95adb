"""Next steps as command lines: the CLI's rendering of an error's structured actions."""

from __future__ import annotations

from lodger.cli._common import storage_flags
from lodger.errors import NextStep

__all__ = ["command_for"]


def command_for(step: NextStep, flags: str | None = None) -> str:
    """The command that carries out ``step``, naming the storage the running command was
    given (``--state`` unless the default, ``--store``, ``--control``; ``flags`` instead)."""
    flag = storage_flags() if flags is None else flags
    session = step.session_id or "SESSION"
    if step.action == "decide":
        return (
            f"lodger decide {session} {step.call_id or 'CALL_ID'}{flag} "
            "--completed [--result JSON] | --not-applied | --abandon"
        )
    if step.action == "recover":
        return f"lodger recover {session}{flag}"
    if step.action == "resume":
        return f"lodger resume {session}{flag}"
    if step.action == "run":
        return f'lodger run "TASK" --session {session}{flag}'
    if step.action == "approve":
        return "run again with --yes, or answer the approval prompt"
    if step.action == "abandon":
        return f"lodger abandon {session}{flag} [--reason TEXT]"
    if step.action == "relocate":
        return f"lodger resume {session} --workspace DIR --relocate{flag}"
    if step.action == "fork":
        return f"lodger fork {session}{flag}"
    return f"lodger sessions{flag}"
