"""The worker's look for cancel requests (``deliver_cancels``) ends with the wake's work,
on its own: a cancellation lost on the way (seen in a worker whose pool lent every
connection: the helper, asked to stop, kept looking every interval) cannot keep the
worker from stopping. Real SQLite control plane, real lease, real ``Sessions``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lodger.runtime._worker_cancel import deliver_cancels
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage
from lodger.storage.control.fencing import LeaseGuard
from lodger.storage.control.sqlite import SqliteControlPlane


async def test_the_cancel_look_ends_when_the_wake_is_done_without_being_cancelled(
    tmp_path: Path,
) -> None:
    control = SqliteControlPlane(str(tmp_path / "control.sqlite3"))
    await control.start()
    storage = Storage.local(tmp_path / "state")
    try:
        lease = await control.acquire_session(session_id="s1", holder="w1", ttl_s=60.0)
        assert lease is not None
        guard = LeaseGuard(control)
        guard.hold(lease)
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        look = asyncio.ensure_future(
            deliver_cancels(control, guard, Sessions(storage), "s1", turn, every=0.05)
        )
        await asyncio.sleep(0.2)  # a few looks while the turn runs
        assert not look.done()
        turn.set_result(None)  # the wake's work is over; nobody cancels the look
        await asyncio.wait_for(look, timeout=5.0)
        assert look.exception() is None
    finally:
        await storage.close()
        await control.close()
