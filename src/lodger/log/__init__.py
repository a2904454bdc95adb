"""The event log: one interface, several backends, one conformance suite."""

from lodger.log._eventlog import EMPTY_PREFIX, EventLog, SessionWriter
from lodger.log._store import LogStore, Record, WriterLease, check_session_id
from lodger.log.memory import MemoryLogStore
from lodger.log.sqlite import SqliteLogStore

__all__ = [
    "EMPTY_PREFIX",
    "EventLog",
    "LogStore",
    "MemoryLogStore",
    "Record",
    "SessionWriter",
    "SqliteLogStore",
    "WriterLease",
    "check_session_id",
    "open_log",
]


def open_log(state_dir: str) -> EventLog:
    """The embedded default: a SQLite log in ``state_dir`` (usually ``.lodger``)."""
    return EventLog(SqliteLogStore(state_dir))
