"""The host's index when several hosts share one control plane (distributed mode).

Behind one load balancer, a request may reach any host: a token made through host A must
open host B, and a webhook delivery retried to B after A took it must find the session A
gave it (and so the same idempotency key, which the control plane's wake queue already
shares). ``SharedHostControl`` keeps those two things in the control plane (schema
version 4, ``host_tokens`` and ``webhook_deliveries``) and the rest of the host's index
(the model a session was created here with, the embedded mode's messages and approvals,
unused in distributed mode) in the host's own SQLite file, as ``SqliteHostControl`` does.

Tokens reach the control plane as their SHA-256 only (``hash_token``); the plain token
stays in the process that made it and the response that shows it once. A session's model
is read from the control plane's session index when this host did not bind it, so every
host shows the model a session was created with, whichever host created it.

>>> control = SharedHostControl(".lodger/host.sqlite3", plane)
>>> await control.add_token(token, scope="admin", session_id=None, label="serve")
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lodger.errors import HostConflictError
from lodger.storage.control.host_index import (
    SqliteHostControl,
    TokenGrant,
    TokenInfo,
    hash_token,
    token_revoked,
)
from lodger.storage.control.interface import ControlPlane

__all__ = ["SharedHostControl"]


class SharedHostControl(SqliteHostControl):
    """``HostControl`` with tokens and webhook deliveries in ``plane`` (which the caller
    started and closes; ``close`` closes only the local index)."""

    def __init__(self, path: str | Path, plane: ControlPlane) -> None:
        super().__init__(path)
        self.plane = plane

    # ------------------------------------------------------------ tokens

    async def add_token(
        self, token: str, *, scope: Literal["admin", "session"], session_id: str | None, label: str
    ) -> None:
        """Record ``token`` for every host. The same token added again with the same grant
        is a no-op (each host that starts with ``$LODGER_HOST_TOKEN`` adds it); a revoked
        token, or one recorded with another grant, is refused: adding never widens or
        revives a token."""
        row = await self.plane.add_token(
            token_hash=hash_token(token), scope=scope, session_id=session_id, label=label
        )
        if row.revoked_at is not None:
            raise token_revoked(" by any host")
        if (row.scope, row.session_id) != (scope, session_id):
            # name the grants, never the token
            raise HostConflictError(
                f"this token is recorded already with scope {row.scope!r}"
                + (f" for session {row.session_id!r}" if row.session_id else "")
                + f", not {scope!r}"
                + (f" for session {session_id!r}" if session_id else ""),
                hint="make a new token for the new grant",
                code="token_conflict",
            )

    async def grant(self, token: str) -> TokenGrant | None:
        row = await self.plane.get_token(token_hash=hash_token(token))
        if row is None or row.revoked_at is not None:
            return None
        scope: Literal["admin", "session"] = "admin" if row.scope == "admin" else "session"
        return TokenGrant(scope=scope, session_id=row.session_id, label=row.label)

    async def revoke(self, token: str) -> bool:
        """Revoke ``token`` on every host (each host's cache forgets it within its TTL)."""
        return await self.revoke_hash(hash_token(token))

    async def revoke_hash(self, token_hash: str) -> bool:
        return await self.plane.revoke_token(token_hash=token_hash)

    async def tokens(self) -> list[TokenInfo]:
        return [
            TokenInfo(
                token_hash=row.token_hash,
                scope="admin" if row.scope == "admin" else "session",
                session_id=row.session_id,
                label=row.label,
                revoked=row.revoked_at is not None,
                created_at=row.created_at,
            )
            for row in await self.plane.list_tokens()
        ]

    # ------------------------------------------------------------ deliveries

    async def delivery_session(self, hook: str, delivery: str, *, new_session: str) -> str:
        return await self.plane.claim_delivery(hook=hook, delivery=delivery, session_id=new_session)

    # ------------------------------------------------------------ sessions

    async def session_model(self, session_id: str) -> str | None:
        model = await super().session_model(session_id)
        if model is not None:
            return model
        row = await self.plane.get_session(session_id=session_id)
        return None if row is None else row.model
