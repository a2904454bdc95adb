"""``Storage``: the persistence a session needs, as one object.

An event log and an artifact store, opened together and closed together. The embedded
default keeps both in a state directory (``Storage.local(".lodger")``); tests and
throw-away sessions keep both in memory (``Storage.memory()``). The object-store and
control-plane backends compose into the same object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lodger.storage.artifacts import ArtifactStore, FileArtifactStore, MemoryArtifactStore
from lodger.storage.eventlog import EventLog
from lodger.storage.logkey import key_required_from_env, log_key_from_env
from lodger.storage.memory import MemoryLogStore
from lodger.storage.sqlite import SqliteLogStore

__all__ = ["STORE_ENVVAR", "Storage"]

STORE_ENVVAR = "LODGER_STORE"


@dataclass(kw_only=True)
class Storage:
    log: EventLog
    artifacts: ArtifactStore
    #: the directory that holds the state, if it is on this machine (never shown to tools)
    state_dir: Path | None = None
    #: where processes on this machine that share these sessions leave each other
    #: requests for a running turn (cancel, permission mode: ``lodger.runtime``'s local
    #: control); the embedded default's state directory, None elsewhere (a worker's
    #: turns take them from the control plane)
    control_dir: Path | None = None

    @classmethod
    def local(
        cls, state_dir: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
    ) -> Storage:
        """SQLite log and file artifacts in ``state_dir`` (created on first write).

        The log key, if any, comes from ``LODGER_LOG_KEY`` or ``LODGER_LOG_KEY_FILE``
        (see :mod:`lodger.storage.logkey`).
        """
        root = Path(state_dir)
        key = log_key_from_env(root, environ)
        return cls(
            log=EventLog(SqliteLogStore(root), key=key, require_key=key_required_from_env(environ)),
            artifacts=FileArtifactStore(root / "artifacts"),
            state_dir=root,
            control_dir=root,
        )

    def hidden_paths(self) -> tuple[Path, ...]:
        """What no tool may see: the state directory and the log key's file."""
        paths: list[Path] = []
        if self.state_dir is not None:
            paths.append(self.state_dir.resolve())
        key = self.log.key
        if key is not None and key.path is not None:
            paths.append(Path(key.path).resolve())
        return tuple(paths)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        environ: Mapping[str, str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Storage:
        """The log and artifacts in an object store: ``file:///path``, ``memory://`` or
        ``s3://bucket/prefix?endpoint=...`` (credentials from the AWS environment
        variables). ``cache_dir`` keeps immutable objects read once on local disk."""
        from lodger.storage._object_lease import lease_ttl_from_env
        from lodger.storage.objectartifacts import ObjectArtifactStore
        from lodger.storage.objectstore import ObjectLogStore, open_object_store

        where = open_object_store(url)
        key = log_key_from_env(where.local_root or Path.cwd() / ".lodger", environ)
        store = ObjectLogStore(
            where.store,
            identity=where.identity,
            local_root=where.local_root,
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            lease_ttl_s=lease_ttl_from_env(environ),
            probe_scope=url,  # endpoint included: one bucket name on two servers is two stores
        )
        return cls(
            log=EventLog(store, key=key, require_key=key_required_from_env(environ)),
            artifacts=ObjectArtifactStore(where.store),
            state_dir=where.local_root,
        )

    @classmethod
    def open(
        cls,
        state_dir: str | os.PathLike[str],
        *,
        store: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Storage:
        """``from_url(store)`` when a store URL is given (or ``LODGER_STORE`` is set),
        else the embedded default ``local(state_dir)``."""
        url = store or (os.environ if environ is None else environ).get(STORE_ENVVAR) or None
        if url:
            return cls.from_url(url, environ=environ)
        return cls.local(state_dir, environ=environ)

    @classmethod
    def memory(cls) -> Storage:
        return cls(log=EventLog(MemoryLogStore()), artifacts=MemoryArtifactStore())

    async def close(self) -> None:
        await self.log.close()
