"""Replay over real logs (SQLite and a file:// object store), a real workspace, real
bubblewrap sandboxes: a recorded session's inputs run again with another model, matching
calls are answered from the log, and no effect reaches the world, counted outside the
process's view (a file outside the workspace and a loopback HTTP server)."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from lodger.errors import UsageError
from lodger.events import CallReplayed, ReplayStarted, ToolDispatched, ToolResponded
from lodger.providers.base import ModelRequest, ModelResponse
from lodger.providers.scripted import FunctionModel, ScriptedModel, outputs_so_far, tool_call
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.replay import ReplayPolicy, replay, replay_offset
from lodger.runtime.replay_report import replay_report
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools import tool
from lodger.tools.spec import Tool

HAVE_BWRAP = shutil.which("bwrap") is not None


class Counter(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self) -> None:
        type(self).hits += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[Counter]]]:
    handler = type("Hits", (Counter,), {"hits": 0})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", handler
    finally:
        httpd.shutdown()
        thread.join()
        httpd.server_close()


def notify_tool(outside: Path, url: str) -> Tool:
    """A tool with effects on the world: a line in a file outside the workspace, and a
    POST to a server."""

    @tool(writes=True)
    def notify(message: str) -> str:
        "Tell the team."
        import urllib.request

        with outside.open("a") as handle:
            handle.write(message + "\n")
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=5)
        return f"told the team: {message}"

    return notify


SOURCE = [
    {"calls": [{"name": "read_file", "args": {"path": "a.txt"}}]},
    {"calls": [{"name": "notify", "args": {"message": "starting"}}]},
    {"calls": [{"name": "write_file", "args": {"path": "b.txt", "content": "from source\n"}}]},
    {"text": "source done"},
]


def candidate(request: ModelRequest) -> ModelResponse | str:
    """Agrees with the source for two steps, then goes its own way (step 3 on)."""
    plan: list[ModelResponse | str] = [
        ModelResponse(calls=(tool_call("read_file", path="a.txt"),)),
        ModelResponse(calls=(tool_call("notify", message="starting"),)),
        ModelResponse(calls=(tool_call("notify", message="something else"),)),
        ModelResponse(calls=(tool_call("shell", command="echo sandboxed > c.txt; cat a.txt"),)),
        ModelResponse(calls=(tool_call("write_file", path="d.txt", content="replay\n"),)),
        ModelResponse(calls=(tool_call("read_file", path="d.txt"),)),
        "replay done",
    ]
    return plan[outputs_so_far(request)]


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".lodger" not in p.parts
    }


class World:
    def __init__(self, root: Path, storage: Storage, url: str) -> None:
        self.ws = root / "ws"
        self.ws.mkdir(exist_ok=True)
        (self.ws / "a.txt").write_text("alpha\n")
        self.outside = root / "effects.log"
        self.sessions = Sessions(storage)
        self.tools = [*workspace_tools(), notify_tool(self.outside, url)]

    def binding(self, model: Any) -> Binding:
        return Binding(model=model, tools=self.tools, workspace=self.ws)

    async def record(self) -> str:
        result = await self.sessions.run(
            "do the thing", binding=self.binding(ScriptedModel(SOURCE)), session="src"
        )
        assert result.status == "completed", result
        return result.session_id


@pytest.fixture(params=["sqlite", "store"])
async def world(
    request: pytest.FixtureRequest, tmp_path: Path, server: tuple[str, type[Counter]]
) -> AsyncIterator[tuple[World, type[Counter]]]:
    url, hits = server
    if request.param == "sqlite":
        storage = Storage.local(tmp_path / "ws" / ".lodger")
    else:
        storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    made = World(tmp_path, storage, url)
    yield made, hits
    await made.sessions.close()


@pytest.mark.skipif(not HAVE_BWRAP, reason="needs bubblewrap")
async def test_a_replay_that_diverges_at_step_3_says_so_and_touches_nothing(
    world: tuple[World, type[Counter]],
) -> None:
    w, hits = world
    await w.record()
    assert w.outside.read_text() == "starting\n" and hits.hits == 1  # the source's effect
    before, effects_before = tree(w.ws), (w.outside.read_text(), hits.hits)

    done = await replay(
        w.sessions, "src", binding=w.binding(FunctionModel(candidate, name="candidate"))
    )

    # 0 effects on the world: the file outside, the server and the real workspace
    assert (w.outside.read_text(), hits.hits) == effects_before
    assert tree(w.ws) == before
    report = done.report
    assert report.diverged_at is not None and report.diverged_at.step == 3
    assert report.diverged_at.source is not None and report.diverged_at.replay is not None
    assert report.diverged_at.source.calls[0][0] == "write_file"
    assert report.diverged_at.replay.calls == (("notify", '{"message":"something else"}'),)
    as_json = report.to_dict()
    assert as_json["answers"] == [{"turn": 1, "source": "source done", "replay": "replay done"}]
    removed = [c["tool"] for c in as_json["calls"]["removed"]]
    added = sorted(c["tool"] for c in as_json["calls"]["added"])
    assert removed == ["write_file"]
    assert added == ["notify", "read_file", "shell", "write_file"]
    assert as_json["usage"]["source"]["requests"] == 4
    assert as_json["usage"]["replay"]["requests"] == 7
    assert as_json["answered"] == {"recorded": 2, "live": 1, "sandbox": 2, "parked": 1}

    events = await w.sessions.storage.log.read_all(done.session_id)
    started = events[1].body
    assert isinstance(started, ReplayStarted)
    assert (started.source_session, started.model) == ("src", "function:candidate")
    assert started.source_offset == replay_offset("src", await _source(w), None, None)
    # each call's call_replayed is committed before its T2, in the same append
    answers = {}
    for i, event in enumerate(events):
        if isinstance(event.body, CallReplayed):
            nxt = events[i + 1].body
            assert isinstance(nxt, ToolResponded) and nxt.operation_id == event.body.operation_id
            answers[event.body.operation_id] = (event.body.source, nxt.content)
    tools = {e.body.operation_id: e.body.tool for e in events if isinstance(e.body, ToolDispatched)}
    by_tool = [(tools[op], how) for op, (how, _) in answers.items()]
    assert by_tool == [
        ("read_file", "recorded"),
        ("notify", "recorded"),
        ("notify", "parked"),
        ("shell", "sandbox"),
        ("write_file", "sandbox"),
        ("read_file", "live"),
    ]
    contents = [content for _, content in answers.values()]
    assert "told the team: starting" in contents[1]  # the recorded answer, not a new one
    assert contents[2].startswith("not run: notify")
    assert "alpha" in contents[3]  # the sandbox saw the restored workspace
    assert "replay" in contents[5]  # and the replay's own writes in it
    # the report is a function of the two logs: computed again, it is the same
    again = replay_report(await _source(w), events)
    assert again.to_dict() == as_json


async def _source(w: World) -> list[Any]:
    return list(await w.sessions.storage.log.read_all("src"))


async def test_a_replay_that_agrees_does_not_diverge_and_answers_every_call_from_the_log(
    world: tuple[World, type[Counter]],
) -> None:
    w, hits = world
    await w.record()
    done = await replay(w.sessions, "src", binding=w.binding(ScriptedModel(SOURCE)))
    assert done.report.diverged_at is None
    assert done.report.added == () and done.report.removed == ()
    assert done.report.to_dict()["answered"]["recorded"] == 3
    assert hits.hits == 1 and w.outside.read_text() == "starting\n"


async def test_a_policy_without_sandbox_parks_every_effect(
    world: tuple[World, type[Counter]],
) -> None:
    w, hits = world
    await w.record()
    policy = ReplayPolicy(recorded=False, sandbox=False)
    assert policy.describe() == "live"
    done = await replay(w.sessions, "src", binding=w.binding(ScriptedModel(SOURCE)), policy=policy)
    answered = done.report.to_dict()["answered"]
    assert answered == {"recorded": 0, "live": 1, "sandbox": 0, "parked": 2}
    assert hits.hits == 1 and not (w.ws / "b.txt").read_text().startswith("replay")


async def test_replay_points_are_turn_boundaries(world: tuple[World, type[Counter]]) -> None:
    w, _ = world
    await w.record()
    await w.sessions.run("again", binding=w.binding(ScriptedModel([{"text": "ok"}])), session="src")
    events = await _source(w)
    starts = [e.offset for e in events if e.kind == "turn_started"]
    assert replay_offset("src", events, None, 2) == starts[1]
    assert replay_offset("src", events, starts[1], None) == starts[1]
    with pytest.raises(UsageError, match="inside a turn"):
        replay_offset("src", events, starts[0] + 2, None)
    with pytest.raises(UsageError, match="no turn 3"):
        replay_offset("src", events, None, 3)
    with pytest.raises(UsageError, match="outside its log"):
        replay_offset("src", events, len(events) + 5, None)
    done = await replay(
        w.sessions, "src", turn=2, binding=w.binding(ScriptedModel([{"text": "other"}]))
    )
    report = done.report.to_dict()
    assert report["answers"] == [{"turn": 1, "source": "ok", "replay": "other"}]
    assert report["diverged_at"]["step"] == 1


@pytest.mark.skipif(not HAVE_BWRAP, reason="needs bubblewrap")
async def test_a_sandboxed_call_reaches_no_server_and_an_unconfined_one_is_parked(
    world: tuple[World, type[Counter]], server: tuple[str, type[Counter]]
) -> None:
    from lodger.substrates.sandbox.policy import SandboxPolicy
    from lodger.substrates.shell import shell_tool

    w, _ = world
    url, hits = server
    await w.record()
    assert hits.hits == 1  # the source's notify
    post = f"import urllib.request as u; u.urlopen(u.Request({url!r}, data=b'x'), timeout=3)"
    host_shell = shell_tool(SandboxPolicy(backend="none"), name="host_shell")
    steps = [
        {"calls": [{"name": "run_python", "args": {"code": post}}]},
        {"calls": [{"name": "host_shell", "args": {"command": f"touch {w.outside}.2"}}]},
        {"text": "tried"},
    ]
    binding = Binding(model=ScriptedModel(steps), tools=[*w.tools, host_shell], workspace=w.ws)
    done = await replay(w.sessions, "src", binding=binding)
    assert hits.hits == 1 and not w.outside.with_name("effects.log.2").exists()
    assert done.report.to_dict()["answered"] == {
        "recorded": 0,
        "live": 0,
        "sandbox": 1,
        "parked": 1,
    }
    events = await w.sessions.storage.log.read_all(done.session_id)
    results = [e.body for e in events if isinstance(e.body, ToolResponded)]
    assert "[exit code 1]" in results[0].content  # the sandbox has no network
    assert "urlopen error" in results[0].content
    assert results[1].content.startswith("not run: host_shell")


async def test_a_replay_session_runs_no_turn_outside_a_replay_and_can_be_replayed(
    world: tuple[World, type[Counter]],
) -> None:
    w, hits = world
    await w.record()
    first = await replay(w.sessions, "src", binding=w.binding(ScriptedModel(SOURCE)))
    with pytest.raises(UsageError, match="is a replay of 'src'"):
        await w.sessions.run(
            "now for real", binding=w.binding(ScriptedModel(SOURCE)), session=first.session_id
        )
    again = await replay(
        w.sessions, first.session_id, binding=w.binding(FunctionModel(candidate, name="c2"))
    )
    report = again.report.to_dict()
    assert report["source_session"] == first.session_id
    assert report["diverged_at"]["step"] == 3
    assert hits.hits == 1  # the source's own call, nothing since


async def test_a_replay_session_is_not_rewound_over_the_real_workspace(
    world: tuple[World, type[Counter]],
) -> None:
    w, _ = world
    await w.record()
    before = tree(w.ws)
    steps = [write_step("x.txt", "scratch\n"), {"text": "wrote"}]
    done = await replay(w.sessions, "src", binding=w.binding(ScriptedModel(steps)))
    assert done.report.to_dict()["answered"]["sandbox"] == 1
    with pytest.raises(UsageError, match="is a replay of 'src'"):
        await w.sessions.rewind(done.session_id, turn=1)
    assert tree(w.ws) == before


def write_step(path: str, content: str) -> dict[str, Any]:
    return {"calls": [{"name": "write_file", "args": {"path": path, "content": content}}]}


async def test_a_source_whose_workspace_is_gone_replays_from_the_log(
    world: tuple[World, type[Counter]],
) -> None:
    w, hits = world
    await w.record()
    second = [{"calls": [{"name": "read_file", "args": {"path": "b.txt"}}]}, {"text": "read"}]
    await w.sessions.run("again", binding=w.binding(ScriptedModel(second)), session="src")
    state = w.sessions.storage.state_dir
    kept = {state, *state.parents} if isinstance(state, Path) else set()
    for entry in w.ws.iterdir():  # every file of the workspace; its state directory stays
        if entry not in kept:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    steps = [
        {"calls": [{"name": "read_file", "args": {"path": "b.txt"}}]},
        {"calls": [{"name": "read_file", "args": {"path": "a.txt"}}]},
        {"calls": [{"name": "write_file", "args": {"path": "c.txt", "content": "new"}}]},
        {"text": "read both"},
    ]
    done = await replay(w.sessions, "src", turn=2, binding=w.binding(ScriptedModel(steps)))
    events = await w.sessions.storage.log.read_all(done.session_id)
    contents = [e.body.content for e in events if isinstance(e.body, ToolResponded)]
    assert "from source" in contents[0]  # recorded
    assert "alpha" in contents[1]  # live, on the workspace restored from the log's snapshot
    assert done.report.to_dict()["answered"] == {
        "recorded": 1,
        "live": 1,
        "sandbox": 1,
        "parked": 0,
    }
    assert {e for e in w.ws.iterdir() if e not in kept} == set() and hits.hits == 1
