"""The host index on its own: one message per idempotency key, one answer per approval
even from two connections racing on the same file, tokens kept only as hashes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lodger.errors import HostConflictError, UsageError
from lodger.storage.control.host_index import SqliteHostControl, hash_token


async def test_submit_is_idempotent_per_session_and_key(tmp_path: Path) -> None:
    control = SqliteHostControl(tmp_path / "host.sqlite3")
    try:
        made = await asyncio.gather(
            *(
                control.submit("s1", key="k", kind="message", text="hi", created_us=i)
                for i in range(10)
            )
        )
        assert sum(created for _, created in made) == 1
        assert len({m.id for m, _ in made}) == 1
        other, created = await control.submit(
            "s2", key="k", kind="message", text="hi", created_us=0
        )
        assert created and other.id != made[0][0].id  # keys are per session
        with pytest.raises(HostConflictError):
            await control.submit("s1", key="k", kind="resume", text="hi", created_us=0)
        assert [m.id for m in await control.messages(status="queued")] == [made[0][0].id, other.id]
    finally:
        await control.close()


async def test_two_connections_answering_at_once_give_one_decision(tmp_path: Path) -> None:
    path = tmp_path / "host.sqlite3"
    first, second = SqliteHostControl(path), SqliteHostControl(path)
    try:
        for n in range(20):
            call = f"call-{n}"
            await first.park("s1", call, tool="deploy", summary="{}", created_us=n)
            results = await asyncio.gather(
                first.answer("s1", call, allow=True, by="a"),
                second.answer("s1", call, allow=False, by="b"),
                return_exceptions=True,
            )
            wins = [r for r in results if not isinstance(r, BaseException)]
            losses = [r for r in results if isinstance(r, HostConflictError)]
            assert len(wins) == 1 and len(losses) == 1, results
            (stored,) = [
                a for a in await first.approvals(session_id="s1", status=None) if a.call_id == call
            ]
            assert stored.answered_by == ("a" if wins[0].status == "allow" else "b")
        with pytest.raises(UsageError) as missing:
            await first.answer("s1", "never-parked", allow=True, by="a")
        assert missing.value.code == "no_such_call"
        await first.park("s1", "left", tool="deploy", summary="{}", created_us=0)
        assert await second.expire_pending() == 1
        with pytest.raises(HostConflictError, match="expired"):
            await first.answer("s1", "left", allow=True, by="a")
    finally:
        await first.close()
        await second.close()


async def test_tokens_are_kept_as_hashes(tmp_path: Path) -> None:
    path = tmp_path / "host.sqlite3"
    control = SqliteHostControl(path)
    try:
        await control.add_token("lgr_secret-value", scope="session", session_id="s1", label="x")
        grant = await control.grant("lgr_secret-value")
        assert grant is not None and grant.allows("s1") and not grant.allows("s2")
        assert await control.grant("lgr_other") is None
    finally:
        await control.close()
    data = await asyncio.to_thread(lambda: b"".join(p.read_bytes() for p in tmp_path.iterdir()))
    assert b"lgr_secret-value" not in data
    assert hash_token("lgr_secret-value").encode() in data


async def test_a_delivery_keeps_its_session(tmp_path: Path) -> None:
    control = SqliteHostControl(tmp_path / "host.sqlite3")
    try:
        first = await control.delivery_session("gh", "d1", new_session="a")
        again = await control.delivery_session("gh", "d1", new_session="b")
        other = await control.delivery_session("gh", "d2", new_session="c")
        assert (first, again, other) == ("a", "a", "c")
    finally:
        await control.close()
