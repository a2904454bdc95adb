"""Every persistence interface lodger has, each with a memory twin.

The event log (``LogStore`` bytes in and out, ``EventLog`` for the event semantics on top:
memory and SQLite backends) and the content-addressed artifact store. Every backend runs
the one conformance suite in ``lodger.testing``.
"""

import os
from collections.abc import Mapping

from lodger.storage._storage import Storage
from lodger.storage.artifacts import (
    ArtifactStore,
    FileArtifactStore,
    MemoryArtifactStore,
)
from lodger.storage.eventlog import EMPTY_PREFIX, EventLog, SessionChain, SessionWriter
from lodger.storage.logkey import LogKey, key_required_from_env, log_key_from_env
from lodger.storage.logstore import LogStore, Record, WriterLease, check_session_id
from lodger.storage.memory import MemoryLogStore
from lodger.storage.sqlite import SqliteLogStore

__all__ = [
    "EMPTY_PREFIX",
    "ArtifactStore",
    "EventLog",
    "FileArtifactStore",
    "LogKey",
    "LogStore",
    "MemoryArtifactStore",
    "MemoryLogStore",
    "Record",
    "SessionChain",
    "SessionWriter",
    "SqliteLogStore",
    "Storage",
    "WriterLease",
    "check_session_id",
    "key_required_from_env",
    "log_key_from_env",
    "open_log",
]


def open_log(
    state_dir: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    require_key: bool | None = None,
) -> EventLog:
    """The embedded default: a SQLite log in ``state_dir`` (usually ``.lodger``).

    The log key comes from ``LODGER_LOG_KEY`` or ``LODGER_LOG_KEY_FILE`` (a file outside
    ``state_dir``) in ``environ`` (default ``os.environ``); ``require_key`` defaults to
    ``LODGER_LOG_KEY_REQUIRED``. See :mod:`lodger.storage.logkey`.
    """
    key = log_key_from_env(state_dir, environ)
    if require_key is None:
        require_key = key_required_from_env(environ)
    return EventLog(SqliteLogStore(state_dir), key=key, require_key=require_key)
