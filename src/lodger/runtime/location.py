"""Where sessions live: a state directory, an object store, a control plane.

One value every door opens storage from, so ``lodger resume --store URL`` reads the
same log ``lodger run --store URL`` wrote, and every hint can name the same place.

>>> where = StorageLocation(state=".lodger", store="s3://bucket/lodger?endpoint=...")
>>> storage = where.open()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lodger.storage import Storage

__all__ = ["CONTROL_FILE", "DEFAULT_STATE", "StorageLocation"]

DEFAULT_STATE = ".lodger"
#: the control plane a state directory's workers keep when none is named
CONTROL_FILE = "control.sqlite3"


@dataclass(frozen=True, kw_only=True)
class StorageLocation:
    """A state directory, and optionally an object store and a control plane.

    ``store`` (``file://``, ``memory://``, ``s3://``) holds the logs and artifacts instead
    of ``state``; ``control`` is a PostgreSQL DSN or a SQLite file (default: the state
    directory's ``control.sqlite3``, where a worker made one).
    """

    state: str = DEFAULT_STATE
    store: str | None = None
    control: str | None = None

    def open(self) -> Storage:
        """The log and artifacts (not the control plane): the store's, else the state's."""
        if self.store:
            return Storage.from_url(self.store)
        return Storage.local(self.state)

    def control_dsn(self, *, create: bool = True) -> str | None:
        """The control plane to use: the one named, else the state directory's own
        (``create=False``: only when it exists; a session no worker ran has none)."""
        if self.control:
            return self.control
        default = Path(self.state) / CONTROL_FILE
        return str(default) if create or default.is_file() else None
