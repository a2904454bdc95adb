"""The host binds its budget settings through the one composition, over the lodger.toml
of a session's workspace (untrusted there: it only lowers them)."""

from __future__ import annotations

from pathlib import Path

from lodger.engine.budgets import Budgets, UsageLimits
from lodger.host import HostConfig, SqliteHostControl
from lodger.host.hub import Hub
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage


async def test_the_host_binds_its_limits_and_budgets(tmp_path: Path) -> None:
    workspaces = tmp_path / "ws"
    (workspaces / "s1").mkdir(parents=True)
    (workspaces / "s1" / "lodger.toml").write_text(
        "[limits]\nrequest_limit = 3\n[budgets]\nsession_usd = 9\n"
    )
    config = HostConfig(
        workspaces=workspaces,
        usage=UsageLimits(request_limit=20, total_tokens_limit=5000),
        budgets=Budgets(session_usd=1, daily_usd=4),
    )
    sessions = Sessions(Storage.local(tmp_path / "state"))
    control = SqliteHostControl(tmp_path / "host.sqlite3")
    try:
        binding = await Hub(sessions, control, config).binding("s1")
    finally:
        await sessions.close()
        await control.close()
    assert binding.usage == UsageLimits(request_limit=3, total_tokens_limit=5000)
    assert binding.budgets.micro("session_usd") == 1_000_000  # the file may not raise it
    assert binding.budgets.micro("daily_usd") == 4_000_000
