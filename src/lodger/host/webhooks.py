"""Webhooks: an external event becomes a message for a session.

A hook is configured with a secret and a target: one session, or a new session per
event. The sender signs the raw body with HMAC-SHA256 under the secret and sends
``X-Hub-Signature-256: sha256=<hex>`` (GitHub's form); the signature is the hook's
authentication. The sender's delivery id (``X-GitHub-Delivery``, else
``X-Delivery-Id`` or ``Idempotency-Key``) is the message's idempotency key, so a
replayed delivery finds its message and wakes nothing.

A hooks file (``lodger serve --hooks FILE.toml``)::

    [hooks.github]
    secret_env = "GITHUB_WEBHOOK_SECRET"   # or: secret = "..."
    session = "01J..."                     # or: session = "new" (a session per event)
    model = "script:triage.json"            # optional, for new sessions
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lodger.errors import ConfigError, HostAuthError, UsageError
from lodger.storage.logstore import check_session_id

__all__ = ["MAX_BODY", "HookConfig", "check_signature", "delivery_id", "load_hooks", "sign"]

MAX_BODY = 256 * 1024
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True, kw_only=True)
class HookConfig:
    name: str
    secret: bytes
    #: the session every delivery goes to; None: a new session per delivery
    session: str | None = None
    model: str | None = None

    def __repr__(self) -> str:  # never show the secret
        return f"HookConfig(name={self.name!r}, session={self.session!r})"


def sign(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value of ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def check_signature(hook: HookConfig, body: bytes, header: str | None) -> None:
    if not header:
        raise HostAuthError(
            f"webhook {hook.name!r} needs an X-Hub-Signature-256 header",
            hint="sign the body with HMAC-SHA256 under the hook's secret",
            code="bad_signature",
        )
    if not hmac.compare_digest(sign(hook.secret, body).encode(), header.strip().encode()):
        raise HostAuthError(
            f"the signature of this delivery to webhook {hook.name!r} does not match its body",
            hint="sign the exact body bytes with the hook's secret: sha256=<hex>",
            code="bad_signature",
        )


def delivery_id(headers: Mapping[str, str]) -> str:
    for name in ("x-github-delivery", "x-delivery-id", "idempotency-key"):
        value = headers.get(name)
        if value:
            if len(value) > 200:
                break
            return value
    raise UsageError(
        "a webhook delivery needs a delivery id of at most 200 characters",
        hint="send X-GitHub-Delivery, X-Delivery-Id or Idempotency-Key",
        code="invalid_request",
    )


def load_hooks(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, HookConfig]:
    env = os.environ if environ is None else environ
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read hooks file {path}: {exc}", hint="check the file") from exc
    unknown = set(data) - {"hooks"}
    if unknown:
        raise ConfigError(f"hooks file {path}: unknown key {sorted(unknown)[0]!r}")
    hooks: dict[str, HookConfig] = {}
    for name, table in dict(data.get("hooks", {})).items():
        if not isinstance(table, dict) or not name or not set(name) <= _NAME_OK:
            raise ConfigError(f"hooks file {path}: hook {name!r} must be a table with a plain name")
        extra = set(table) - {"secret", "secret_env", "session", "model"}
        if extra:
            raise ConfigError(
                f"hooks file {path}: hook {name!r} has unknown key {sorted(extra)[0]!r}"
            )
        secret = table.get("secret")
        if secret is None and "secret_env" in table:
            secret = env.get(str(table["secret_env"]))
            if not secret:
                raise ConfigError(
                    f"hook {name!r}: environment variable {table['secret_env']!r} is not set"
                )
        if not isinstance(secret, str) or len(secret) < 8:
            raise ConfigError(f"hook {name!r} needs a secret of at least 8 characters")
        session = table.get("session", "new")
        if session != "new":  # refused here, not on each delivery as a 400 to the sender
            try:
                check_session_id(session if isinstance(session, str) else "")
            except UsageError as exc:
                raise ConfigError(
                    f"hooks file {path}: hook {name!r} names session {session!r}: {exc.message}",
                    hint=exc.hint or 'name a session id, or "new" for a session per event',
                ) from exc
        model = table.get("model")
        hooks[name] = HookConfig(
            name=name,
            secret=secret.encode(),
            session=None if session == "new" else str(session),
            model=None if model is None else str(model),
        )
    return hooks
