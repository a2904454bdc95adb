"""Where MCP OAuth logins are kept: host-side only, never in a workspace or a log.

A login is one JSON record per server name (``lodger.tools._mcp_oauth.Login``), kept by a
``CredentialStore``:

- ``FileCredentialStore``: ``<config dir>/mcp-logins/<name>.json`` (the config dir is
  ``$LODGER_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/lodger``, else ``~/.config/lodger``).
  The directory is made mode 700 and each file mode 600, written whole and renamed into
  place; a file another user owns, or one that group or others can read, is refused
  rather than read (someone else may have planted or read it).
- ``KeyringCredentialStore``: the OS keyring, when the ``keyring`` package and a real
  backend are present (``default_credential_store`` prefers it then).
- ``SealedCredentialStore``: a control plane's secret table (for workers), each value
  sealed with AES-GCM under a key that is never in the store: ``LODGER_MCP_KEY`` (64 hex
  digits) or a key file (``LODGER_MCP_KEY_FILE``, 32 random bytes or their hex, mode 600).
  The record's name is the AES-GCM associated data, so a value copied under another
  server's name does not open.

Errors name the file or the server, never a value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from lodger.errors import ConfigError

__all__ = [
    "KEY_ENVVAR",
    "KEY_FILE_ENVVAR",
    "CredentialStore",
    "FileCredentialStore",
    "KeyringCredentialStore",
    "SealedCredentialStore",
    "SecretTable",
    "config_directory",
    "default_credential_store",
    "load_key",
]

KEY_ENVVAR = "LODGER_MCP_KEY"
KEY_FILE_ENVVAR = "LODGER_MCP_KEY_FILE"
_MAX_RECORD_BYTES = 256 * 1024
_KEYRING_SERVICE = "lodger-mcp"


class CredentialStore(Protocol):
    """Records of logins by server name (JSON objects; values are secrets)."""

    async def load(self, name: str) -> dict[str, Any] | None: ...

    async def save(self, name: str, record: Mapping[str, Any]) -> None: ...

    async def delete(self, name: str) -> bool: ...

    async def names(self) -> list[str]: ...


def config_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The user's lodger config directory (the one ``lodger trust`` keeps its records in)."""
    env = os.environ if environ is None else environ
    named = env.get("LODGER_CONFIG_DIR")
    if named:
        return Path(named)
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "lodger"


def _decode(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise ConfigError(f"the MCP login {where} is not valid JSON", code="config") from None
    if not isinstance(value, dict):
        raise ConfigError(f"the MCP login {where} is not a JSON object", code="config")
    return value


class FileCredentialStore:
    """One mode-600 file per server under a mode-700 directory (see the module doc)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> FileCredentialStore:
        return cls(config_directory(environ) / "mcp-logins")

    def _path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ConfigError(f"{name!r} is not an MCP server name")
        return self.directory / f"{name}.json"

    async def load(self, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._load, name)

    def _load(self, name: str) -> dict[str, Any] | None:
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(
                f"cannot read the MCP login file {path}: {exc.strerror}",
                code="secrets_file_unsafe",
            ) from None
        try:
            info = os.fstat(fd)  # checked on the open file: what is read is what was checked
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(
                    f"the MCP login file {path} is not a regular file", code="secrets_file_unsafe"
                )
            if info.st_uid != os.geteuid():
                raise ConfigError(
                    f"the MCP login file {path} belongs to uid {info.st_uid}, not to this user",
                    hint="delete it and log in again",
                    code="secrets_file_unsafe",
                )
            if info.st_mode & 0o077:
                raise ConfigError(
                    f"the MCP login file {path} can be read by others "
                    f"(mode {stat.S_IMODE(info.st_mode):o}), so lodger does not use it",
                    hint="delete it and log in again (its tokens may have been read)",
                    code="secrets_file_unsafe",
                )
            with os.fdopen(fd, "rb", closefd=False) as file:
                raw = file.read(_MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)
        if len(raw) > _MAX_RECORD_BYTES:
            raise ConfigError(f"the MCP login file {path} is too large", code="config")
        return _decode(raw, f"file {path}")

    async def save(self, name: str, record: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self._save, name, dict(record))

    def _private_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(self.directory, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise ConfigError(
                f"{self.directory} is not a directory of this user's",
                code="secrets_file_unsafe",
            )
        if info.st_mode & 0o077:
            os.chmod(self.directory, 0o700)

    def _save(self, name: str, record: dict[str, Any]) -> None:
        path = self._path(name)
        self._private_directory()
        data = json.dumps(record, sort_keys=True).encode()
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        self._sweep(name)
        with contextlib.suppress(OSError):  # the rename is durable once the directory is
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _sweep(self, name: str) -> None:
        """Drop the temporary files of writes killed midway (a minute old: a write under
        way elsewhere is younger), so no old token lingers in them."""
        now = time.time()
        for entry in os.scandir(self.directory):
            if entry.name.startswith(f".{name}.") and entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > 60:
                        os.unlink(entry.path)

    async def delete(self, name: str) -> bool:
        def drop() -> bool:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                return False
            return True

        return await asyncio.to_thread(drop)

    async def names(self) -> list[str]:
        def listed() -> list[str]:
            try:
                entries = os.listdir(self.directory)
            except FileNotFoundError:
                return []
            return sorted(e[:-5] for e in entries if e.endswith(".json") and e[0] != ".")

        return await asyncio.to_thread(listed)


class KeyringCredentialStore:
    """The OS keyring (service ``lodger-mcp``), through the ``keyring`` package. The
    keyring lists nothing, so the names logged in are kept under one more entry."""

    _INDEX = "__names__"

    def __init__(self) -> None:
        pass  # type: ignore[import-not-found, unused-ignore]

    @staticmethod
    def usable() -> bool:
        """Whether ``keyring`` is installed with a backend that stores anything."""
        try:
            import keyring  # type: ignore[import-not-found, unused-ignore]
            from keyring.backends import fail  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return False
        backend = keyring.get_keyring()
        return (
            not isinstance(backend, fail.Keyring) and "null" not in type(backend).__name__.lower()
        )

    async def load(self, name: str) -> dict[str, Any] | None:
        import keyring  # type: ignore[import-not-found, unused-ignore]

        raw = await asyncio.to_thread(keyring.get_password, _KEYRING_SERVICE, name)
        return None if raw is None else _decode(raw.encode(), f"of {name!r} in the keyring")

    async def save(self, name: str, record: Mapping[str, Any]) -> None:
        import keyring  # type: ignore[import-not-found, unused-ignore]

        await asyncio.to_thread(
            keyring.set_password, _KEYRING_SERVICE, name, json.dumps(dict(record))
        )
        names = set(await self.names()) | {name}
        await asyncio.to_thread(
            keyring.set_password, _KEYRING_SERVICE, self._INDEX, json.dumps(sorted(names))
        )

    async def delete(self, name: str) -> bool:
        import keyring  # type: ignore[import-not-found, unused-ignore]
        from keyring.errors import PasswordDeleteError  # type: ignore[import-not-found, unused-ignore]

        try:
            await asyncio.to_thread(keyring.delete_password, _KEYRING_SERVICE, name)
        except PasswordDeleteError:
            return False
        names = set(await self.names()) - {name}
        await asyncio.to_thread(
            keyring.set_password, _KEYRING_SERVICE, self._INDEX, json.dumps(sorted(names))
        )
        return True

    async def names(self) -> list[str]:
        import keyring  # type: ignore[import-not-found, unused-ignore]

        raw = await asyncio.to_thread(keyring.get_password, _KEYRING_SERVICE, self._INDEX)
        try:
            names = json.loads(raw) if raw else []
        except ValueError:
            return []
        return sorted(n for n in names if isinstance(n, str))


def default_credential_store(environ: Mapping[str, str] | None = None) -> CredentialStore:
    """The OS keyring when usable (and ``LODGER_MCP_STORE`` is not ``file``), else the
    user's config directory."""
    env = os.environ if environ is None else environ
    if env.get("LODGER_MCP_STORE", "") != "file" and KeyringCredentialStore.usable():
        return KeyringCredentialStore()
    return FileCredentialStore.default(env)


# ---------------------------------------------------------------- sealed, in a control plane


class SecretTable(Protocol):
    """The control plane's secret table: opaque sealed values by name."""

    async def put_secret(self, *, name: str, value: bytes) -> None: ...

    async def get_secret(self, *, name: str) -> bytes | None: ...

    async def delete_secret(self, *, name: str) -> bool: ...

    async def list_secrets(self, *, prefix: str) -> list[str]: ...


def load_key(
    *, key_file: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> bytes:
    """The 32-byte sealing key: from ``key_file``, else ``$LODGER_MCP_KEY`` (hex), else the
    file ``$LODGER_MCP_KEY_FILE``. A key file must be this user's and mode 600."""
    env = os.environ if environ is None else environ
    if key_file is None and env.get(KEY_ENVVAR):
        return _key_bytes(env[KEY_ENVVAR].strip().encode(), f"${KEY_ENVVAR}")
    path = key_file or env.get(KEY_FILE_ENVVAR)
    if not path:
        raise ConfigError(
            "no key to seal MCP logins in the control plane",
            hint=f"set {KEY_ENVVAR} (64 hex digits) or {KEY_FILE_ENVVAR} (a mode-600 file)",
            code="config",
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the MCP key file {path}: {exc.strerror}", code="key_file_unreadable"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ConfigError(
                f"the MCP key file {path} must be a regular file of this user's, mode 600",
                hint=f"chmod 600 {path}",
                code="secrets_file_unsafe",
            )
        raw = os.read(fd, 200)
    finally:
        os.close(fd)
    return _key_bytes(raw, f"the key file {path}")


def _key_bytes(raw: bytes, where: str) -> bytes:
    text = raw.strip()
    if len(raw) == 32:
        return raw
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != 32:
        raise ConfigError(
            f"{where} is not a 32-byte key (32 raw bytes or 64 hex digits)",
            hint="make one with: python -c 'import secrets; print(secrets.token_hex(32))'",
            code="config",
        )
    return key


class SealedCredentialStore:
    """Logins in a control plane's secret table, sealed with AES-GCM (see the module doc)."""

    _PREFIX = "mcp-login:"

    def __init__(self, table: SecretTable, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(key) != 32:
            raise ConfigError("the MCP sealing key must be 32 bytes", code="config")
        self._table = table
        self._aead = AESGCM(key)

    async def load(self, name: str) -> dict[str, Any] | None:
        from cryptography.exceptions import InvalidTag

        sealed = await self._table.get_secret(name=self._PREFIX + name)
        if sealed is None:
            return None
        try:
            raw = self._aead.decrypt(sealed[:12], sealed[12:], name.encode())
        except (InvalidTag, ValueError):
            raise ConfigError(
                f"the MCP login of {name!r} in the control plane does not open with this key",
                hint="give the worker the key the login was stored with, or log in again",
                code="config",
            ) from None
        return _decode(raw, f"of {name!r} in the control plane")

    async def save(self, name: str, record: Mapping[str, Any]) -> None:
        nonce = os.urandom(12)
        data = json.dumps(dict(record), sort_keys=True).encode()
        sealed = nonce + self._aead.encrypt(nonce, data, name.encode())
        await self._table.put_secret(name=self._PREFIX + name, value=sealed)

    async def delete(self, name: str) -> bool:
        return await self._table.delete_secret(name=self._PREFIX + name)

    async def names(self) -> list[str]:
        listed = await self._table.list_secrets(prefix=self._PREFIX)
        return sorted(n.removeprefix(self._PREFIX) for n in listed)
