"""The control plane (leases, wake queue, indexes, global authorities) and workers.

``open_control(dsn)`` picks the implementation from the DSN: ``postgresql://...`` (or
``postgres://``, or a libpq ``key=value`` string) is PostgreSQL; ``sqlite:///path`` or a
plain file path is SQLite. See :mod:`lodger.storage.control.interface`.
"""

from __future__ import annotations

import os

from lodger.errors import UsageError
from lodger.storage.control.interface import (
    ApprovalRequest,
    ControlPlane,
    HostToken,
    NamedLease,
    ParkedCall,
    Schedule,
    SessionLease,
    SessionRow,
    Wake,
    WakeEnd,
)
from lodger.storage.control.sqlite import SqliteControlPlane

__all__ = [
    "CONTROL_ENVVAR",
    "ApprovalRequest",
    "ControlPlane",
    "HostToken",
    "NamedLease",
    "ParkedCall",
    "Schedule",
    "SessionLease",
    "SessionRow",
    "SqliteControlPlane",
    "Wake",
    "WakeEnd",
    "open_control",
]

CONTROL_ENVVAR = "LODGER_CONTROL"


def open_control(dsn: str) -> ControlPlane:
    """The control plane ``dsn`` names (not started: ``await control.start()``)."""
    text = dsn.strip()
    if text.startswith(("postgresql://", "postgres://")) or (
        "=" in text and not text.startswith(("sqlite:", "/", "."))
    ):
        from lodger.storage.control.postgres import PostgresControlPlane

        return PostgresControlPlane(text)
    if text.startswith("sqlite://"):
        path = text.removeprefix("sqlite://")
        if not path.startswith("/"):
            raise UsageError(
                f"invalid control plane DSN {dsn!r}",
                hint="use sqlite:///absolute/path.sqlite3 (three slashes) or a file path",
                code="invalid_control_dsn",
            )
        return SqliteControlPlane(path)
    if not text or "://" in text:
        raise UsageError(
            f"invalid control plane DSN {dsn!r}",
            hint="use postgresql://user@host:port/db, sqlite:///path/control.sqlite3 "
            "or a file path",
            code="invalid_control_dsn",
        )
    return SqliteControlPlane(os.path.abspath(text))
