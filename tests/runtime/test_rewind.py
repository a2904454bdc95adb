"""Rewind over real SQLite logs, a real artifact directory and a real workspace: the
conversation goes back by a copy-free branch, the files by the log's snapshots and
per-edit checkpoints, and a rewind is undone by rewinding back."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import ResumeBlockedError, SessionLockedError, StorageError, UsageError
from lodger.events import FileCheckpoint, Rewound, ToolResponded, TurnStarted, WorkspaceSnapshot
from lodger.providers.scripted import ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.storage.branches import current_branch, next_branch, root_of
from lodger.storage.forks import read_lineage
from lodger.tools import tool


def write(path: str, content: str) -> dict[str, Any]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


def edit(path: str, old: str, new: str) -> dict[str, Any]:
    args = {"path": path, "old_string": old, "new_string": new}
    return {"calls": [{"name": "edit_file", "args": args}]}


class World:
    def __init__(self, root: Path) -> None:
        self.ws = root / "ws"
        self.ws.mkdir()
        self.sessions = Sessions(Storage.local(self.ws / ".lodger"))

    async def turn(self, *steps: dict[str, Any], session: str = "s", extra: Any = ()) -> str:
        binding = Binding(
            model=ScriptedModel([*steps, {"text": "done"}]),
            tools=[*workspace_tools(), *extra],
            workspace=self.ws,
        )
        result = await self.sessions.run("go", binding=binding, session=session)
        assert result.status == "completed", result
        return result.session_id

    def files(self) -> dict[str, str]:
        return {
            p.relative_to(self.ws).as_posix(): p.read_text()
            for p in sorted(self.ws.rglob("*"))
            if p.is_file() and ".lodger" not in p.parts
        }


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    made = World(tmp_path)
    (made.ws / "a.txt").write_text("one\n")
    yield made
    await made.sessions.close()


async def test_rewind_to_a_turn_restores_files_and_the_next_turn_goes_on_the_branch(
    world: World,
) -> None:
    await world.turn(write("a.txt", "two\n"))
    await world.turn(edit("a.txt", "two", "three"), write("b/c.txt", "new\n"))
    assert world.files() == {"a.txt": "three\n", "b/c.txt": "new\n"}

    done = await world.sessions.rewind("s", turn=2, who="test")
    assert world.files() == {"a.txt": "two\n"}  # b/ stays (directories are never removed)
    assert (done.branch, done.source, done.restored, done.removed) == ("s..r1", "s", 1, 1)
    log = world.sessions.storage.log
    assert await current_branch(log, "s") == "s..r1"
    branch = await log.read_all("s..r1")
    assert [e.kind for e in branch] == ["session_started", "rewound"]
    rewound = branch[1].body
    assert isinstance(rewound, Rewound)
    assert (rewound.left.session_id, rewound.who, rewound.to) == ("s", "test", done.to)
    assert rewound.left.high_water == len(await log.read_all("s"))  # its head, kept whole
    # the branch shares the prefix before turn 2: one turn_started in its lineage
    lineage = (await read_lineage(log, "s..r1")).events
    assert sum(isinstance(e.body, TurnStarted) for e in lineage) == 1

    # the session's name now leads to the branch: the next turn is appended there
    assert await world.turn(write("a.txt", "four\n")) == "s..r1"
    assert world.files() == {"a.txt": "four\n"}
    state = await world.sessions.state("s")
    assert state.session_id == "s..r1" and state.turns == 1


async def test_undo_brings_back_the_branch_left_behind(world: World) -> None:
    await world.turn(write("a.txt", "two\n"))
    await world.turn(edit("a.txt", "two", "three"), write("b.txt", "bee\n"))
    first = await world.sessions.rewind("s", turn=2)
    assert world.files() == {"a.txt": "two\n"}
    undone = await world.sessions.rewind("s", undo=True)
    assert world.files() == {"a.txt": "three\n", "b.txt": "bee\n"}
    assert (undone.branch, undone.source) == ("s..r2", "s")
    assert undone.to.high_water == first.left.high_water  # the whole branch left behind
    # and the undo is undone in turn, by naming the branch it left
    again = await world.sessions.rewind("s", branch=undone.left.session_id)
    assert world.files() == {"a.txt": "two\n"}
    assert again.branch == "s..r3"
    for sid in ("s", "s..r1", "s..r2", "s..r3"):
        await world.sessions.storage.log.verify(sid)


async def test_a_file_changed_outside_lodger_refuses_naming_it_and_force_keeps_it_reachable(
    world: World,
) -> None:
    await world.turn(write("a.txt", "two\n"))
    await world.turn(edit("a.txt", "two", "three"))
    (world.ws / "a.txt").write_text("my own edit\n")
    (world.ws / "notes.txt").write_text("my notes\n")
    log = world.sessions.storage.log
    before = len(await log.read_all("s"))
    with pytest.raises(ResumeBlockedError) as refused:
        await world.sessions.rewind("s", turn=2)
    assert refused.value.code == "workspace_changed"
    assert "'a.txt'" in refused.value.message and "'notes.txt'" in refused.value.message
    assert sorted(refused.value.blockers) == [
        "a.txt: changed outside lodger",
        "notes.txt: changed outside lodger",
    ]
    # refused: nothing was written, nothing changed
    assert len(await log.read_all("s")) == before
    assert not await log.exists("s..r1")
    assert world.files() == {"a.txt": "my own edit\n", "notes.txt": "my notes\n"}

    forced = await world.sessions.rewind("s", turn=2, force=True)
    assert forced.forced == ("a.txt", "notes.txt")
    assert world.files() == {"a.txt": "two\n"}
    body = (await log.read_all(forced.branch))[1].body
    assert isinstance(body, Rewound) and body.forced == ("a.txt", "notes.txt")
    # the branch left behind snapshotted the user's files: undoing brings them back
    await world.sessions.rewind("s", undo=True)
    assert world.files() == {"a.txt": "my own edit\n", "notes.txt": "my notes\n"}


async def test_a_rewind_into_the_middle_of_a_turn_restores_each_edit_exactly(
    world: World,
) -> None:
    await world.turn(edit("a.txt", "one", "1"), edit("a.txt", "1", "2"), edit("a.txt", "2", "3"))
    log = world.sessions.storage.log
    events = await log.read_all("s")
    checkpoints = [e for e in events if isinstance(e.body, FileCheckpoint)]
    assert [c.body.before_sha256 is not None for c in checkpoints] == [True] * 3
    responded = [e.offset for e in events if isinstance(e.body, ToolResponded)]
    # just after the second edit's T2: the file holds that edit, not the turn's end
    await world.sessions.rewind("s", to=responded[1] + 1)
    assert world.files() == {"a.txt": "2\n"}
    await world.sessions.rewind("s", branch="s", to=responded[0] + 1)
    assert world.files() == {"a.txt": "1\n"}
    # before the turn: no snapshot before it, so the first edit's checkpoint says
    await world.sessions.rewind("s", branch="s", turn=1)
    assert world.files() == {"a.txt": "one\n"}


async def test_files_a_tool_changed_without_checkpoints_come_back_from_turn_end_snapshots(
    world: World,
) -> None:
    @tool
    def scribble(name: str, text: str) -> str:
        """Write a file behind the file tools' back (as a shell command would)."""
        (world.ws / name).write_text(text)
        return "ok"

    def call(name: str, text: str) -> dict[str, Any]:
        return {"calls": [{"name": "scribble", "args": {"name": name, "text": text}}]}

    await world.turn(call("a.txt", "two\n"), extra=[scribble])
    await world.turn(call("a.txt", "three\n"), call("z.txt", "zed\n"), extra=[scribble])
    events = await world.sessions.storage.log.read_all("s")
    assert sum(isinstance(e.body, WorkspaceSnapshot) for e in events) == 2
    await world.sessions.rewind("s", turn=2)
    assert world.files() == {"a.txt": "two\n"}


async def test_rewind_refuses_what_it_cannot_do(world: World) -> None:
    await world.turn(write("a.txt", "two\n"))
    sessions = world.sessions
    with pytest.raises(UsageError, match="has no turn 5: it holds turns 1 to 1"):
        await sessions.rewind("s", turn=5)
    with pytest.raises(UsageError, match="cannot rewind to offset 99"):
        await sessions.rewind("s", to=99)
    with pytest.raises(UsageError, match="no rewind to undo"):
        await sessions.rewind("s", undo=True)
    with pytest.raises(UsageError, match="already at offset"):
        await sessions.rewind("s", to=len(await sessions.storage.log.read_all("s")))
    with pytest.raises(UsageError, match="is not a branch of session 's'"):
        await sessions.rewind("s", branch="other", to=1)
    with pytest.raises(UsageError, match="give one of"):
        await sessions.rewind("s", to=1, turn=1)
    assert not await sessions.storage.log.exists("s..r1")


async def test_branches_are_found_by_galloping_and_name_their_session(tmp_path: Path) -> None:
    storage = Storage.local(tmp_path / "state")
    sessions = Sessions(storage)
    await sessions.run("go", binding=Binding(model=ScriptedModel([{"text": "hi"}])), session="s")
    assert await current_branch(storage.log, "s") == "s"
    for n in range(1, 12):
        done = await sessions.rewind("s", to=1, branch="s")
        assert done.branch == f"s..r{n}"
        assert await current_branch(storage.log, "s") == f"s..r{n}"
    assert await next_branch(storage.log, "s..r4") == "s..r12"
    assert await current_branch(storage.log, "s..r4") == "s..r4"  # a branch, exactly
    assert await current_branch(storage.log, "s..r0") == "s"  # the first log
    assert root_of("s..r11") == "s" and root_of("s..r0") == "s" and root_of("a..b") == "a..b"
    await sessions.close()


async def test_a_rewind_is_refused_while_a_writer_holds_the_branch(world: World) -> None:
    await world.turn(write("a.txt", "two\n"))
    log = world.sessions.storage.log
    async with await log.open_writer("s"):  # a turn running on the branch
        with pytest.raises(SessionLockedError):
            await world.sessions.rewind("s", turn=1)
    assert not await log.exists("s..r1") and world.files() == {"a.txt": "two\n"}


async def test_a_session_on_an_object_store_rewinds_and_undoes_the_same_way(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    sessions = Sessions(Storage.from_url(f"file://{tmp_path / 'objects'}"))

    async def turn(text: str) -> str:
        binding = Binding(
            model=ScriptedModel([write("a.txt", text), {"text": "done"}]),
            tools=workspace_tools(),
            workspace=ws,
        )
        return (await sessions.run("go", binding=binding, session="s")).session_id

    await turn("one\n")
    await turn("two\n")
    done = await sessions.rewind("s", turn=2)
    assert (done.branch, (ws / "a.txt").read_text()) == ("s..r1", "one\n")
    assert await turn("three\n") == "s..r1"
    await sessions.rewind("s", undo=True)
    assert (ws / "a.txt").read_text() == "two\n"
    for sid in ("s", "s..r1", "s..r2"):
        await sessions.storage.log.verify(sid)
    await sessions.close()


async def test_a_restore_that_cannot_finish_rolls_the_workspace_back(world: World) -> None:
    await world.turn(write("a.txt", "two\n"), write("b.txt", "bee\n"))
    await world.turn(write("a.txt", "three\n"), write("b.txt", "bzz\n"))
    # the bytes b.txt had after turn 1 are lost from the artifact store
    lost = hashlib.sha256(b"bee\n").hexdigest()
    (world.ws / ".lodger" / "artifacts" / lost[:2] / lost).unlink()
    with pytest.raises(StorageError, match="cannot rewind session 's'") as failed:
        await world.sessions.rewind("s", turn=2)
    assert failed.value.code == "artifact_missing"
    # a.txt was put back first, then undone: the workspace is as the rewind found it
    assert world.files() == {"a.txt": "three\n", "b.txt": "bzz\n"}
    log = world.sessions.storage.log
    assert not await log.exists("s..r1")
    assert not (world.ws / ".lodger" / "rewinds" / "s.json").exists()
    assert await world.turn(write("c.txt", "sea\n")) == "s"  # the session goes on
