"""Every persistence interface lodger has, each with a memory twin.

The event log (``LogStore`` bytes in and out, ``EventLog`` for the event semantics on top:
memory and SQLite backends) and the content-addressed artifact store. Every backend runs
the one conformance suite in ``lodger.testing``.
"""

from lodger.storage._storage import Storage
from lodger.storage.artifacts import (
    ArtifactStore,
    FileArtifactStore,
    MemoryArtifactStore,
)
from lodger.storage.eventlog import EMPTY_PREFIX, EventLog, SessionWriter
from lodger.storage.logstore import LogStore, Record, WriterLease, check_session_id
from lodger.storage.memory import MemoryLogStore
from lodger.storage.sqlite import SqliteLogStore

__all__ = [
    "EMPTY_PREFIX",
    "ArtifactStore",
    "EventLog",
    "FileArtifactStore",
    "LogStore",
    "MemoryArtifactStore",
    "MemoryLogStore",
    "Record",
    "SessionWriter",
    "SqliteLogStore",
    "Storage",
    "WriterLease",
    "check_session_id",
    "open_log",
]


def open_log(state_dir: str) -> EventLog:
    """The embedded default: a SQLite log in ``state_dir`` (usually ``.lodger``)."""
    return EventLog(SqliteLogStore(state_dir))
