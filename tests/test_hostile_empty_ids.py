"""Adversarial audit of the Python API's session ids: ``session=""`` is an invalid id,
never "not given". ``Agent.run(task, session="")`` started a new session under a fresh
id and ``Sessions.fork(parent, session="")`` forked into one: a caller whose id came out
empty (a missing setting, a blank form field) wrote a session it could not find again."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger import Agent, TestModel
from lodger.errors import UsageError
from lodger.runtime.sessions import Sessions
from lodger.storage import Storage


async def test_run_with_an_empty_session_id_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    storage = Storage.local(tmp_path / "state")
    agent = Agent(model=TestModel(), storage=storage, workspace=tmp_path)
    with pytest.raises(UsageError) as caught:
        await agent.run("hi", session="")
    assert caught.value.code == "invalid_session_id"
    assert await storage.log.list_sessions() == []
    await storage.close()


async def test_fork_into_an_empty_session_id_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    storage = Storage.local(tmp_path / "state")
    made = await Agent(model=TestModel(), storage=storage, workspace=tmp_path).run(
        "hi", session="parent"
    )
    assert made.session_id == "parent"
    async with Sessions(storage) as sessions:
        with pytest.raises(UsageError) as caught:
            await sessions.fork("parent", session="")
        assert caught.value.code == "invalid_session_id"
        assert await storage.log.list_sessions() == ["parent"]
