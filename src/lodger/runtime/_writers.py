"""Closing a session writer after its block failed, without hiding why it failed.

A writer's close records the session's head (on an object store, a put). When the block
failed because the store refused a commit, the close usually fails the same way, and a
plain ``finally: await writer.close()`` would then raise the close's error ("could not
record its head") in place of the commit failure and what it left undecided. Here the
first failure is the one raised; the close's failure is a note on it (``__notes__``,
printed second by the CLI and listed under ``notes`` in ``--json``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from lodger.errors import LodgerError
from lodger.storage import SessionWriter

__all__ = ["close_after_failure", "closing_writer"]


def _described(exc: BaseException) -> str:
    if isinstance(exc, LodgerError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


async def close_after_failure(writer: SessionWriter, first: BaseException) -> None:
    """Close ``writer`` after ``first`` failed the block that used it; an error of the
    close becomes a note on ``first`` instead of replacing it."""
    try:
        await writer.close()
    except Exception as second:  # noqa: BLE001 - reported on the first failure, second
        first.add_note(f"then, closing the session's writer: {_described(second)}")


@contextlib.asynccontextmanager
async def closing_writer(writer: SessionWriter) -> AsyncIterator[SessionWriter]:
    """``writer`` for the block, closed after it (see the module docstring)."""
    try:
        yield writer
    except BaseException as first:
        await close_after_failure(writer, first)
        raise
    await writer.close()
