"""Which ``lodger.toml`` files the user trusts, recorded outside every workspace.

A workspace's ``lodger.toml`` can start programs on the host (MCP servers), allow calls
and open the sandbox's network. Anything that can write the workspace (a sandboxed
command, a cloned repository) can write that file, so lodger applies a file whole only
once the user has trusted that exact content, as direnv's ``allow`` does: a record keyed
by the file's canonical path and holding the SHA-256 of its bytes. A new or changed file
is still read for what only narrows (``lodger.runtime.project``).

Records live in ``$LODGER_CONFIG_DIR/trusted.json`` (default
``$XDG_CONFIG_HOME/lodger``, else ``~/.config/lodger``), never in a workspace or a state
directory. ``lodger trust [DIR]`` records the file of DIR as it is now;
``lodger trust --revoke`` drops it; ``lodger run --trust`` trusts it for one run only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lodger.errors import ConfigError

__all__ = ["CONFIG_DIR_ENVVAR", "TrustStore", "content_digest"]

CONFIG_DIR_ENVVAR = "LODGER_CONFIG_DIR"
_FILE = "trusted.json"


def content_digest(path: Path) -> str | None:
    """The SHA-256 of the file's bytes (None when there is no such regular file)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TrustStore:
    """The user's trust records: ``{canonical path of a lodger.toml: sha256 of it}``."""

    directory: Path

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> TrustStore:
        env = os.environ if environ is None else environ
        named = env.get(CONFIG_DIR_ENVVAR)
        if named:
            return cls(Path(named))
        base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return cls(Path(base) / "lodger")

    @property
    def path(self) -> Path:
        return self.directory / _FILE

    def trusts(self, config_file: Path) -> bool:
        """Whether ``config_file`` holds exactly what the user trusted at its path."""
        digest = content_digest(config_file)
        if digest is None:
            return False
        return self._records().get(_key(config_file)) == digest

    def trust(self, config_file: Path) -> str:
        """Record the file's current content as trusted; returns its digest."""
        digest = content_digest(config_file)
        if digest is None:
            raise ConfigError(
                f"there is no {config_file.name} at {config_file.parent}",
                hint="trust a directory that holds one (lodger trust DIR)",
            )
        records = self._records()
        records[_key(config_file)] = digest
        self._write(records)
        return digest

    def revoke(self, config_file: Path) -> bool:
        """Forget the file's record; True when there was one."""
        records = self._records()
        if records.pop(_key(config_file), None) is None:
            return False
        self._write(records)
        return True

    def _records(self) -> dict[str, str]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(
                f"cannot read the trust records {self.path}: {exc.strerror}"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise ConfigError(
                f"the trust records {self.path} are damaged",
                hint="delete the file and trust your projects again (lodger trust DIR)",
            )
        return data

    def _write(self, records: dict[str, str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".trusted-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(records, out, indent=2, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)  # a reader sees the old records or the new, whole
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _key(config_file: Path) -> str:
    # the directory resolved, the name kept: a lodger.toml that is a symlink to a trusted
    # file elsewhere is another record (its MCP servers would start in another directory)
    return str(config_file.parent.resolve() / config_file.name)
