"""The engine's other compaction doors: a provider's context-length error (compact once,
ask again), ``Sessions.compact``, the ``[compaction]`` table of lodger.toml, and the
``recall`` tool's three ways back into the log."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
from compaction_world import SECRET, World, agent, fetch

from lodger import Agent, FunctionModel
from lodger.engine.compaction import CompactionPolicy
from lodger.engine.settings import Limits, Services
from lodger.errors import ConfigError
from lodger.events import Compacted
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import ModelRequest, ModelResponse, ToolResultMessage, UserMessage
from lodger.providers.scripted import tool_call
from lodger.runtime.composition import compose
from lodger.runtime.project import Project
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage
from lodger.tools.recall import MAX_CHARS


async def test_a_context_length_error_compacts_once_and_asks_again(tmp_path: Path) -> None:
    world = World(steps=12, context_window=12_000)
    only_on_error = CompactionPolicy(max_per_turn=10)  # no threshold, no budget
    async with agent(tmp_path / "state", world, only_on_error) as a:
        result = await a.run("read the pages", session="s")
        events = await a.log.read_all("s")
    assert result.status == "completed", result.error
    made = [e.body for e in events if isinstance(e.body, Compacted)]
    assert made and all(c.trigger == "context_error" for c in made)
    # each request refused as too long was followed by one that fit
    sizes = [messages for messages, _ in world.sizes]
    refused = [i for i, n in enumerate(sizes) if n > 12_000]
    assert refused and all(sizes[i + 1] <= 12_000 for i in refused)


async def test_a_context_length_error_that_persists_fails_the_turn(tmp_path: Path) -> None:
    world = World(steps=3, context_window=10)  # nothing fits, not even a summary
    async with agent(tmp_path / "state", world, CompactionPolicy()) as a:
        result = await a.run("read the pages", session="s")
        events = await a.log.read_all("s")
    assert result.status == "failed" and "maximum context length" in (result.error or "")
    assert [e.body.trigger for e in events if isinstance(e.body, Compacted)] == ["context_error"]


async def test_sessions_compact_takes_the_writer_and_the_binding(tmp_path: Path) -> None:
    world = World(steps=5)
    storage = Storage.local(tmp_path / "state")
    try:
        async with agent(storage, world) as a:
            await a.run("read the pages", session="s")
        sessions = Sessions(storage)
        made = await sessions.compact(
            "s",
            binding=Binding(model=FunctionModel(world, name="world")),
            instructions="name the pages",
        )
        assert "name the pages" in world.transcripts[-1]
        assert made.trigger == "manual" and "pages read: 5" in made.summary
        state = await sessions.state("s")
        assert state.events[-1].body == made
        await storage.log.verify("s")
    finally:
        await storage.close()


def test_the_compaction_table_of_lodger_toml(tmp_path: Path) -> None:
    (tmp_path / "lodger.toml").write_text(
        'model = "test"\n'
        "[compaction]\n"
        'model = "test"\n'
        "threshold_tokens = 20000\n"
        "budget_tokens = 30000\n"
        'required_sections = ["Goal", "Next step"]\n'
        'instructions = "keep paths"\n'
    )
    trusted = Project.load(tmp_path, trusted=True)
    assert trusted.compaction == CompactionPolicy(
        model="test",
        threshold_tokens=20_000,
        budget_tokens=30_000,
        required_sections=("Goal", "Next step"),
        instructions="keep paths",
    )
    assert compose(trusted).compaction == trusted.compaction
    untrusted = Project.load(tmp_path, trusted=False)
    assert untrusted.compaction is not None and untrusted.compaction.model is None
    assert "its [compaction] model" in untrusted.ignored
    (tmp_path / "lodger.toml").write_text("[compaction]\nbudget_tokens = -1\n")
    with pytest.raises(ConfigError, match="compaction"):
        Project.load(tmp_path, trusted=True)
    (tmp_path / "lodger.toml").write_text("[compaction]\nbudget = 1\n")
    with pytest.raises(ConfigError, match=r"compaction\.budget"):
        Project.load(tmp_path, trusted=True)


class Recaller:
    """Reads three pages, then recalls with ``args`` and answers with what came back."""

    def __init__(self, args: dict[str, object]) -> None:
        self.args = args

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if results and results[-1].name == "recall":
            return json.dumps({"error": results[-1].is_error, "text": results[-1].content})
        if len(results) < 6:
            return ModelResponse(calls=(tool_call("fetch", page=len(results) + 1),))
        args = dict(self.args)
        if args.get("call_id") == "FOURTH":
            args["call_id"] = results[3].call_id
        return ModelResponse(calls=(tool_call("recall", **args),))


_SESSIONS = itertools.count()


async def _recall(tmp_path: Path, args: dict[str, object]) -> tuple[bool, str]:
    """One new session that reads and then recalls with ``args``: (is_error, text)."""
    model = FunctionModel(Recaller(args))
    session = f"s-{next(_SESSIONS)}"
    async with Agent(
        model=model,
        tools=[fetch],
        storage=tmp_path / "state",
        limits=Limits(max_steps=20),
        services=Services(clock=ManualClock(), ids=SequentialIds()),
        compaction=CompactionPolicy(),
    ) as a:
        assert not await a.log.exists(session)
        result = await a.run("read", session=session)
    answer = json.loads(result.answer or "{}")
    return answer["error"], answer["text"]


async def test_recall_by_offset_call_and_search(tmp_path: Path) -> None:
    error, text = await _recall(tmp_path, {"query": "secret code"})
    assert not error and SECRET in text and "tool_responded" in text
    error, text = await _recall(tmp_path, {"call_id": "FOURTH"})
    assert not error and "fetch" in text and len(text) <= MAX_CHARS + 100
    error, text = await _recall(tmp_path, {"offset": 0})
    assert not error and text.startswith("offset 0: session_started")
    error, text = await _recall(tmp_path, {"offset": 9999})
    assert error and "no fact at offset 9999" in text
    error, text = await _recall(tmp_path, {"offset": 1, "query": "x"})
    assert error and "exactly one" in text
    error, text = await _recall(tmp_path, {"query": "nothing-like-this"})
    assert not error and "no fact" in text
    error, text = await _recall(tmp_path, {"call_id": "FOURTH", "max_chars": 300})
    assert not error and len(text) < 400 and "more characters" in text


class Planner:
    """Writes a todo list and a file, then answers."""

    def __call__(self, request: ModelRequest) -> ModelResponse | str:
        results = [m for m in request.messages if isinstance(m, ToolResultMessage)]
        if not results:
            items = [
                {"text": "write notes.txt", "status": "done"},
                {"text": "check the notes", "status": "in_progress"},
                {"text": "report", "status": "pending"},
            ]
            return ModelResponse(
                calls=(
                    tool_call("todo_write", items=items, expected_revision=0),
                    tool_call("write_file", path="notes.txt", content="hello"),
                )
            )
        return "written"


async def test_a_compaction_pins_open_todos_edited_files_and_the_open_turn(
    tmp_path: Path,
) -> None:
    from lodger.runtime.builtin import write_file
    from lodger.tools.todo import todo_tools

    workspace = tmp_path / "work"
    workspace.mkdir()
    summaries = World()
    planner = Planner()

    def model(request: ModelRequest) -> ModelResponse | str:
        if request.system.startswith("You are compacting"):
            return summaries(request)
        return planner(request)

    async with Agent(
        model=FunctionModel(model),
        tools=[*todo_tools(), write_file],
        workspace=workspace,
        storage=tmp_path / "state",
        services=Services(clock=ManualClock(), ids=SequentialIds()),
        compaction=CompactionPolicy(),
    ) as a:
        await a.run("plan and write", session="s")
        made = await a.compact("s")
        events = await a.log.read_all("s")
    assert "todo:[in_progress] check the notes" in made.pinned
    assert "todo:[pending] report" in made.pinned
    assert not any("write notes.txt" in p for p in made.pinned)  # done: not pinned
    assert "file:notes.txt" in made.pinned and "turn_input" not in made.pinned  # turn ended
    from lodger.context import project_messages

    head = project_messages(events).messages[0]
    assert isinstance(head, UserMessage)
    assert "## Open todo items" in head.text and "- [pending] report" in head.text
    digest = hashlib.sha256(b"hello").hexdigest()[:12]
    assert f"- notes.txt (sha256 {digest})" in head.text


async def test_recall_reads_the_log_when_no_fold_is_in_memory(tmp_path: Path) -> None:
    """Another process's recall (a worker's): the log and its artifacts, a fork's
    inherited history too; a long result comes back whole from its artifact."""
    from lodger.storage.forks import fork_session
    from lodger.tools.recall import recall_tool
    from lodger.tools.spec import ToolContext, ToolOutput

    world = World(steps=6)
    storage = Storage.local(tmp_path / "state")
    try:
        async with agent(storage, world) as a:
            await a.run("read the pages", session="p")
            await fork_session(storage.log, "p", fork_id="f", clock=a.clock, ids=a.ids)
        recall = recall_tool(storage.log, storage.artifacts)
        ctx = ToolContext(session_id="f", turn_id="t", run_id="r", call_id="c", operation_id="o")
        out = await recall.handler({"query": "secret code"}, ctx)
        text = out.content if isinstance(out, ToolOutput) else str(out)
        assert SECRET in text
        page = [e for e in await storage.log.read_all("p") if e.kind == "tool_responded"][4]
        out = await recall.handler({"call_id": page.call_id, "max_chars": MAX_CHARS}, ctx)
        text = out.content if isinstance(out, ToolOutput) else str(out)
        assert SECRET in text and "result (ok)" in text
    finally:
        await storage.close()


async def test_recall_reads_a_long_result_back_from_its_artifact(tmp_path: Path) -> None:
    from lodger import tool
    from lodger.tools.recall import recall_tool
    from lodger.tools.spec import ToolContext, ToolOutput

    @tool
    async def big() -> str:
        """A long result."""
        return "filler " * 5000 + "the buried value is 31337"

    def model(request: ModelRequest) -> ModelResponse | str:
        if any(isinstance(m, ToolResultMessage) for m in request.messages):
            return "ok"
        return ModelResponse(calls=(tool_call("big"),))

    storage = Storage.local(tmp_path / "state")
    try:
        async with Agent(model=FunctionModel(model), tools=[big], storage=storage) as a:
            await a.run("go", session="s")
        responded = [e for e in await storage.log.read_all("s") if e.kind == "tool_responded"]
        assert responded[0].body.truncated and "31337" not in responded[0].body.content
        recall = recall_tool(storage.log, storage.artifacts)
        ctx = ToolContext(session_id="s", turn_id="t", run_id="r", call_id="c", operation_id="o")
        found = await recall.handler({"query": "buried value"}, ctx)
        text = found.content if isinstance(found, ToolOutput) else str(found)
        assert "31337" in text
        whole = await recall.handler({"offset": responded[0].offset}, ctx)
        text = whole.content if isinstance(whole, ToolOutput) else str(whole)
        assert "31337" not in text and "recall again with start=8000" in text  # bounded
        rest = await recall.handler({"offset": responded[0].offset, "start": 32_000}, ctx)
        text = rest.content if isinstance(rest, ToolOutput) else str(rest)
        assert text.endswith("the buried value is 31337")
    finally:
        await storage.close()


async def test_sessions_compact_refuses_a_session_another_writer_holds(tmp_path: Path) -> None:
    from lodger.errors import SessionLockedError

    world = World(steps=3)
    storage = Storage.local(tmp_path / "state")
    try:
        async with agent(storage, world) as a:
            await a.run("read the pages", session="s")
        held = await storage.log.open_writer("s")  # a run in progress elsewhere
        try:
            with pytest.raises(SessionLockedError):
                await Sessions(storage).compact(
                    "s", binding=Binding(model=FunctionModel(world, name="world"))
                )
        finally:
            await held.close()
        assert world.summaries == 0
        assert not any(e.kind == "compacted" for e in await storage.log.read_all("s"))
    finally:
        await storage.close()
