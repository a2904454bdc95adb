"""The secrets file: credentials the egress proxy injects, kept out of ``lodger.toml``.

    # ~/.config/lodger/secrets.toml   (chmod 600)
    ["api.example.com"]
    Authorization = "Bearer sk-..."
    ["*.internal.example.com"]
    X-Api-Key = "..."

Named by ``secrets_file`` in the ``[sandbox]`` table or by ``LODGER_SECRETS_FILE``. Each
table is a domain pattern and the headers the proxy adds to that domain's requests
(plain HTTP, and HTTPS where the policy terminates TLS), merged with the
``[sandbox.network.credentials]`` of ``lodger.toml``.

The file is refused unless it is safe to hold secrets: a regular file owned by this
user, readable by nobody else (no group or other permission bits), and neither inside
the workspace nor under a system directory the sandbox mounts (``/etc``, ``/usr``...),
so no sandbox ever sees it. Errors name the file, the domain and the header, never a
value.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path

from lodger.errors import ConfigError

__all__ = ["SECRETS_VARIABLE", "load_secrets_file"]

SECRETS_VARIABLE = "LODGER_SECRETS_FILE"
_MAX_BYTES = 1 << 20


def load_secrets_file(
    path: str | Path, *, workspace: Path, mounted: Sequence[str] = ()
) -> dict[str, dict[str, str]]:
    """The domain -> headers table of the secrets file at ``path`` (see the module doc);
    ``mounted``: the system directories every sandbox sees, where it must not lie."""
    given = Path(os.path.expanduser(str(path)))
    if not given.is_absolute():
        raise ConfigError(
            f"the secrets file {str(path)!r} is a relative path",
            hint="name it by its absolute path, outside the workspace",
            code="secrets_file_unsafe",
        )
    real = Path(os.path.realpath(given))
    root = Path(os.path.realpath(workspace))
    if real.is_relative_to(root):
        raise ConfigError(
            f"the secrets file {given} lies inside the workspace {root}, "
            "where sandboxed commands can read it",
            hint="move it outside the workspace, e.g. to ~/.config/lodger/secrets.toml",
            code="secrets_file_unsafe",
        )
    for system in mounted:
        if real.is_relative_to(os.path.realpath(system)):
            raise ConfigError(
                f"the secrets file {given} lies under {system}, which every sandbox mounts",
                hint="move it to a private directory, e.g. ~/.config/lodger/secrets.toml",
                code="secrets_file_unsafe",
            )
    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang lodger in open().
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the secrets file {given}: {exc.strerror}",
            code="secrets_file_unsafe",
        ) from None
    try:
        # Checked on the open file: what is read is what was checked.
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"the secrets file {given} is not a regular file", code="secrets_file_unsafe"
            )
        if info.st_uid != os.geteuid():
            raise ConfigError(
                f"the secrets file {given} belongs to uid {info.st_uid}, not to this user",
                hint=f"chown {os.geteuid()} {given}",
                code="secrets_file_unsafe",
            )
        if info.st_mode & 0o077:
            raise ConfigError(
                f"the secrets file {given} can be read by others "
                f"(mode {stat.S_IMODE(info.st_mode):o})",
                hint=f"chmod 600 {given}",
                code="secrets_file_unsafe",
            )
        with os.fdopen(fd, "rb", closefd=False) as file:
            raw = file.read(_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_BYTES:
        raise ConfigError(f"the secrets file {given} is larger than 1 MiB", code="config")
    return _parse(raw, given)


def _parse(raw: bytes, where: Path) -> dict[str, dict[str, str]]:
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"the secrets file {where} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        # The parser's message names a line and column, not the text there.
        raise ConfigError(f"the secrets file {where} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"the secrets file {where} is nested too deeply to read") from None
    out: dict[str, dict[str, str]] = {}
    for domain, headers in data.items():
        if not isinstance(headers, dict):
            raise ConfigError(
                f"{domain!r} in the secrets file {where} must be a table of headers",
                hint='["api.example.com"]\nAuthorization = "Bearer ..."',
            )
        for name, value in headers.items():
            if not isinstance(value, str):
                raise ConfigError(
                    f"header {name!r} of {domain!r} in the secrets file {where} must be a string"
                )
            if any(c in value or c in name for c in "\r\n\0") or ":" in name:
                raise ConfigError(
                    f"header {name!r} of {domain!r} in the secrets file {where} "
                    "holds a line break, a NUL or (in its name) a colon"
                )
        out[domain] = dict(headers)
    return out
