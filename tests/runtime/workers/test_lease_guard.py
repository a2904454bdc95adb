"""A slot that ended its wake forgets only its own grant of the session's lease.

Broke: ``end_wake`` releases the lease, and the release notifies; another slot of the same
worker could claim the session's next wake (a new epoch) before the first slot's cleanup
ran, and that cleanup dropped the guard's lease by session id, so the new turn's commits
were refused ("this worker holds no lease"), seen in
``test_a_notified_worker_claims_at_once_and_reuses_its_folds``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.errors import LeaseLostError
from lodger.storage.control import SqliteControlPlane
from lodger.storage.control.fencing import LeaseGuard


async def test_dropping_an_older_grant_keeps_the_newer_one(tmp_path: Path) -> None:
    control = SqliteControlPlane(tmp_path / "control.sqlite3")
    await control.start()
    try:
        guard = LeaseGuard(control)
        first = await control.acquire_session(session_id="s1", holder="w", ttl_s=60)
        assert first is not None
        guard.hold(first)
        await control.release_session(lease=first)
        second = await control.acquire_session(session_id="s1", holder="w", ttl_s=60)
        assert second is not None and second.epoch == first.epoch + 1
        guard.hold(second)  # another slot took the next wake
        guard.starting("s1", wake_id=1, offset=3)
        guard.drop("s1", epoch=first.epoch)  # the first slot's cleanup
        assert guard.lease("s1") == second
        await guard.check("s1")  # the new turn commits
        guard.drop("s1", epoch=second.epoch)
        assert guard.lease("s1") is None
        with pytest.raises(LeaseLostError):
            await guard.check("s1")
    finally:
        await control.close()
