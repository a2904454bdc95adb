"""``LogKey``: the secret that keys a session's digest chain (DESIGN L10).

A plain chain proves integrity against accidents; anyone who can write the state
directory can also recompute it. With a key held outside the state directory, digests
are HMAC-SHA256 under that key, so an edit made without the key is detected.

The key comes from the environment where the CLI opens logs (``log_key_from_env``):

- ``LODGER_LOG_KEY``: the key itself, hex or base64 (at least 16 bytes), or
- ``LODGER_LOG_KEY_FILE``: a file outside the state directory holding the same text,

and ``LODGER_LOG_KEY_REQUIRED=1`` makes every read refuse a session whose chain is not
keyed (see ``EventLog``). A key made with ``openssl rand -hex 32`` is a good one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path

from lodger.errors import ConfigError
from lodger.events import HMAC_DIGEST_DOMAIN

__all__ = [
    "KEY_ENVVAR",
    "KEY_FILE_ENVVAR",
    "KEY_REQUIRED_ENVVAR",
    "MIN_KEY_BYTES",
    "LogKey",
    "key_required_from_env",
    "log_key_from_env",
]

KEY_ENVVAR = "LODGER_LOG_KEY"
KEY_FILE_ENVVAR = "LODGER_LOG_KEY_FILE"
KEY_REQUIRED_ENVVAR = "LODGER_LOG_KEY_REQUIRED"
MIN_KEY_BYTES = 16

_HEX = re.compile(r"[0-9a-fA-F]+")
_MAKE_ONE = "make one with `openssl rand -hex 32`"


class LogKey:
    """A log key: the HMAC state keyed once, and a public id that names the key.

    >>> key = LogKey(bytes.fromhex("00" * 32))
    >>> log = EventLog(SqliteLogStore(".lodger"), key=key)

    ``key_id`` is the hex of the first 8 bytes of ``sha256(secret)``: recorded in each
    keyed session, it names the key a session needs without revealing it. ``path`` is
    the key file it was read from (None otherwise): hide it from tools like the state
    directory, or a model could read the key and forge the log.
    """

    __slots__ = ("_mac", "key_id", "path")

    def __init__(self, secret: bytes, *, path: Path | None = None) -> None:
        self.path = path
        if len(secret) < MIN_KEY_BYTES:
            raise ConfigError(
                f"a log key needs at least {MIN_KEY_BYTES} bytes, this one has {len(secret)}",
                hint=_MAKE_ONE,
                code="log_key_too_short",
            )
        self.key_id = hashlib.sha256(secret).digest()[:8].hex()
        # Keyed once, with the domain tag already absorbed; each digest copies it.
        self._mac = hmac.new(secret, HMAC_DIGEST_DOMAIN, "sha256")

    @property
    def mac(self) -> hmac.HMAC:
        """The keyed HMAC state to ``copy()`` per event (see ``keyed_chain_digest``)."""
        return self._mac

    @classmethod
    def from_text(
        cls, text: str, *, source: str = "the log key", path: Path | None = None
    ) -> LogKey:
        """Parse a key written as hex or base64 (surrounding whitespace ignored)."""
        cleaned = "".join(text.split())
        secret = b""
        if _HEX.fullmatch(cleaned) and len(cleaned) % 2 == 0:
            secret = bytes.fromhex(cleaned)
        elif cleaned.isascii():
            # standard or URL-safe alphabet; validate=True refuses any other character
            standard = cleaned.replace("-", "+").replace("_", "/")
            try:
                secret = base64.b64decode(standard, validate=True)
            except binascii.Error:
                secret = b""
        if not secret:
            raise ConfigError(
                f"{source} is neither hex nor base64",
                hint=f"write the key as hex or base64 text; {_MAKE_ONE}",
                code="invalid_log_key",
            )
        return cls(secret, path=path)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, state_dir: str | os.PathLike[str]
    ) -> LogKey:
        """Read a key file, refusing one inside ``state_dir``: a key stored beside the log
        can be read by whoever can rewrite the log, and then proves nothing."""
        key_path = Path(path).expanduser().resolve()
        state = Path(state_dir).expanduser().resolve()
        if key_path == state or state in key_path.parents:
            raise ConfigError(
                f"the log key file {str(path)!r} is inside the state directory {str(state_dir)!r}",
                hint="a key beside the log it protects proves nothing; move the key file "
                "outside the state directory (e.g. ~/.config/lodger/log.key, mode 600)",
                code="key_in_state_dir",
            )
        try:
            text = key_path.read_text(encoding="ascii")
        except FileNotFoundError:
            raise ConfigError(
                f"the log key file {str(path)!r} does not exist",
                hint=f"check ${KEY_FILE_ENVVAR}; {_MAKE_ONE}",
                code="key_file_missing",
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"the log key file {str(path)!r} cannot be read: {exc}",
                hint=f"the file must hold the key as hex or base64 text; {_MAKE_ONE}",
                code="key_file_unreadable",
            ) from None
        return cls.from_text(text, source=f"the log key file {str(path)!r}", path=key_path)

    def __repr__(self) -> str:
        return f"LogKey(key_id={self.key_id!r})"


def log_key_from_env(
    state_dir: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> LogKey | None:
    """The key named by ``LODGER_LOG_KEY`` or ``LODGER_LOG_KEY_FILE`` (None when neither
    is set). Setting both is refused: which one is meant cannot be guessed."""
    env = os.environ if environ is None else environ
    inline = env.get(KEY_ENVVAR, "")
    file = env.get(KEY_FILE_ENVVAR, "")
    if inline and file:
        raise ConfigError(
            f"both ${KEY_ENVVAR} and ${KEY_FILE_ENVVAR} are set",
            hint="set only one of them",
            code="ambiguous_log_key",
        )
    if inline:
        return LogKey.from_text(inline, source=f"${KEY_ENVVAR}")
    if file:
        return LogKey.from_file(file, state_dir=state_dir)
    return None


def key_required_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``LODGER_LOG_KEY_REQUIRED`` asks every read to refuse unkeyed chains."""
    env = os.environ if environ is None else environ
    value = env.get(KEY_REQUIRED_ENVVAR, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ConfigError(
        f"${KEY_REQUIRED_ENVVAR} is {value!r}",
        hint="set it to 1 (require keyed chains) or 0",
        code="invalid_key_required",
    )
