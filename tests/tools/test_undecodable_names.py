"""File names that are not UTF-8, made with real bytes paths on a real filesystem.

Python reads ``b'caf\\xe9.txt'`` as ``'caf\\udce9.txt'`` (surrogateescape). The log stores
UTF-8, which has no encoding for that lone surrogate: a result or a T1 record holding it
cannot be committed, which used to fail the turn. The tools show such a name as
``caf\\xe9.txt`` and say how to deal with it; nothing that names it may crash.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lodger.engine.settings import Services
from lodger.errors import ToolCallError
from lodger.events import ProposedCall, ToolResponded, canonical_json
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage
from lodger.providers.scripted import FunctionModel
from lodger.runtime.agent import Agent
from lodger.runtime.builtin import workspace_tools
from lodger.storage import EventLog, SqliteLogStore, Storage
from lodger.testing import MemoryArtifactStore
from lodger.tools.files import read_file
from lodger.tools.find import grep, list_files
from lodger.tools.spec import Tool, ToolContext, ToolOutput


def make_file(path: bytes, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


@pytest.fixture
def hostile(ws: Path) -> Path:
    """``caf\\xe9.txt`` (Latin-1 name), directory ``d\\xff`` holding ``in.txt``, and
    symlinks ``link`` and ``dlink`` to them; contents are plain UTF-8."""
    root = os.fsencode(ws)
    make_file(root + b"/caf\xe9.txt", b"hello from cafe\n")
    os.mkdir(root + b"/d\xff")
    make_file(root + b"/d\xff/in.txt", b"hello from inside\n")
    os.symlink(b"caf\xe9.txt", root + b"/link")
    os.symlink(b"d\xff", root + b"/dlink")
    return ws


def utf8(text: str) -> str:
    text.encode("utf-8")  # raises on a lone surrogate
    return text


async def call(t: Tool, ctx: ToolContext, **arguments: object) -> str:
    result = await t.handler(dict(arguments), ctx)
    content = result.content if isinstance(result, ToolOutput) else result
    assert isinstance(content, str)
    return utf8(content)


async def test_list_files_shows_undecodable_names_escaped(hostile: Path, ctx: ToolContext) -> None:
    lines = (await call(list_files, ctx)).splitlines()
    assert lines[:6] == ["caf\\xe9.txt", "d\\xff/", "d\\xff/in.txt", "dlink", "link", lines[5]]
    assert lines[5].startswith("[names shown with \\xNN hold bytes that are not UTF-8")
    assert "mv $'caf\\xe9.txt' <new name>" in lines[5]
    # Globs match the name as shown.
    assert (await call(list_files, ctx, pattern="caf*")).splitlines()[0] == "caf\\xe9.txt"
    assert (await call(list_files, ctx, pattern="*/in.txt")).splitlines()[0] == "d\\xff/in.txt"
    assert (await call(list_files, ctx, path="dlink")).splitlines() == ["d\\xff/in.txt"]


async def test_grep_shows_undecodable_names_escaped(hostile: Path, ctx: ToolContext) -> None:
    lines = (await call(grep, ctx, pattern="hello")).splitlines()
    assert lines[:2] == ["caf\\xe9.txt:1: hello from cafe", "d\\xff/in.txt:1: hello from inside"]
    assert lines[2].startswith("[names shown with \\xNN")
    assert (await call(grep, ctx, pattern="hello", glob="caf*")).splitlines()[0] == (
        "caf\\xe9.txt:1: hello from cafe"
    )
    through_link = (await call(grep, ctx, pattern="hello", path="link")).splitlines()
    assert through_link[0] == "caf\\xe9.txt:1: hello from cafe"
    assert through_link[1].startswith("[names shown with \\xNN")


async def test_read_file_of_undecodable_names_gives_results_not_crashes(
    hostile: Path, ctx: ToolContext
) -> None:
    assert await call(read_file, ctx, path="link") == "     1\thello from cafe"
    assert await call(read_file, ctx, path="caf\udce9.txt") == "     1\thello from cafe"
    for path, problem in [("caf\\xe9.txt", "does not exist"), ("dlink", "is a directory")]:
        with pytest.raises(ToolCallError, match=problem) as caught:
            await call(read_file, ctx, path=path)
        utf8(str(caught.value))


async def test_a_session_over_undecodable_names_completes_and_continues(
    hostile: Path, tmp_path: Path
) -> None:
    """Through the real pipeline and SQLite log: every result and T1 is committed, the
    session reopens and takes another turn."""
    calls = [
        ("list", "list_files", "{}"),
        ("grep", "grep", '{"pattern": "hello"}'),
        ("read", "read_file", '{"path": "link"}'),
        ("shown", "read_file", '{"path": "caf\\\\xe9.txt"}'),
        ("dir", "list_files", '{"path": "dlink"}'),
        ("write", "write_file", '{"path": "dlink/new.txt", "content": "x"}'),
    ]
    requests: list[ModelRequest] = []

    def model(request: ModelRequest) -> ModelResponse:
        requests.append(request)
        if len(requests) == 1:
            return ModelResponse(
                calls=tuple(ProposedCall(call_id=c, name=n, arguments=a) for c, n, a in calls)
            )
        return ModelResponse(text="done")

    def agent() -> Agent:
        return Agent(
            model=FunctionModel(model),
            tools=workspace_tools(),
            workspace=hostile,
            storage=Storage(
                log=EventLog(SqliteLogStore(tmp_path / "state")), artifacts=MemoryArtifactStore()
            ),
            services=Services(clock=ManualClock(tick_us=10), ids=SequentialIds("id")),
        )

    first = agent()
    assert (await first.run("look around", session="s")).status == "completed"
    await first.close()
    results = {m.call_id: m for m in requests[1].messages if isinstance(m, ToolResultMessage)}
    assert results["list"].content.startswith("caf\\xe9.txt\nd\\xff/\n")
    assert results["grep"].content.startswith("caf\\xe9.txt:1: hello from cafe")
    assert results["read"].content == "     1\thello from cafe"
    assert results["shown"].is_error and "does not exist" in results["shown"].content
    assert results["dir"].content == "d\\xff/in.txt"
    assert results["write"].is_error and "not valid UTF-8" in results["write"].content
    assert not (hostile / "dlink" / "new.txt").exists()

    second = agent()  # a fresh process's view: reopen the log and continue the session
    assert (await second.run("again", session="s")).status == "completed"
    events = await second.session("s").events()
    await second.close()
    responded = [e for e in events if isinstance(e.body, ToolResponded)]
    assert len(responded) == 5  # the write was refused before dispatch
    for event in events:
        canonical_json(event.model_dump(mode="json"))
