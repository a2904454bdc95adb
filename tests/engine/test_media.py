"""Images and documents in a turn's input and in tool results, end to end.

The model is a FunctionModel that records every request; storage is a real SQLite log
with file artifacts (and the object store for forks). What is checked: the parts reach
the model with the bytes that were given, the bytes are artifacts listed by the
``turn_started`` (or ``tool_responded``) fact, a reopened, checkpointed or forked session
projects the same parts from the artifact store, and bad media are refused before
anything is written or sent.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger import (
    Agent,
    BinaryContent,
    DocumentUrl,
    FunctionModel,
    ImageUrl,
    Limits,
    MediaLimits,
    ToolOutput,
    tool,
    tool_call,
)
from lodger.context import Projector, _message_plain, _messages_from, project_messages
from lodger.engine.checkpoint import open_fold, save_checkpoint
from lodger.engine.media import load_media
from lodger.engine.settings import Hooks, Services
from lodger.errors import StorageError, UsageError
from lodger.events import Event, ToolResponded, TurnEnded, TurnStarted
from lodger.ids import ManualClock, SequentialIds
from lodger.providers.base import (
    MediaPart,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    UserMessage,
)
from lodger.runtime.sessions import Binding, Sessions
from lodger.runtime.streaming import TurnFinished
from lodger.storage import EventLog, MemoryLogStore, Storage
from lodger.storage.forks import fork_session
from lodger.testing import MemoryArtifactStore

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
JPEG = b"\xff\xd8\xff\xe0" + b"jfif" * 8
PDF = b"%PDF-1.7\n" + b"0" * 40


class Recorder:
    """Answers with text; records every request."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return ModelResponse(text="seen")

    def user_parts(self, index: int = -1) -> list[tuple[MediaPart, ...]]:
        return [m.parts for m in self.requests[index].messages if isinstance(m, UserMessage)]


def agent(storage: Storage | Path, model: FunctionModel, **kwargs: object) -> Agent:
    return Agent(
        model=model,
        storage=storage,  # type: ignore[arg-type]
        services=Services(clock=ManualClock(tick_us=1), ids=SequentialIds("m")),
        **kwargs,  # type: ignore[arg-type]
    )


async def test_parts_reach_the_model_with_their_bytes_and_are_artifacts(tmp_path: Path) -> None:
    recorder = Recorder()
    image = tmp_path / "cat.png"
    image.write_bytes(PNG)
    async with agent(tmp_path / "state", FunctionModel(recorder)) as a:
        result = await a.run(
            [
                "what is in",
                BinaryContent.from_path(image),
                "and in",
                ImageUrl("https://example.com/dog.jpg"),
                BinaryContent(PDF, "application/pdf", name="paper.pdf"),
                DocumentUrl("https://example.com/spec.pdf"),
            ],
            session="s",
        )
        assert result.status == "completed"
        (parts,) = recorder.user_parts()
        assert parts == (
            MediaPart(media_type="image/png", data=PNG, name="cat.png"),
            MediaPart(media_type="image/jpeg", url="https://example.com/dog.jpg"),
            MediaPart(media_type="application/pdf", data=PDF, name="paper.pdf"),
            MediaPart(media_type="application/pdf", url="https://example.com/spec.pdf"),
        )
        user = next(m for m in recorder.requests[0].messages if isinstance(m, UserMessage))
        assert user.text == "what is in\n\nand in"
        events = await a.log.read_all("s")
        started = next(e.body for e in events if isinstance(e.body, TurnStarted))
        assert started.input == "what is in\n\nand in"
        refs = [att.artifact for att in started.attachments]
        assert [att.url for att in started.attachments] == [
            None,
            "https://example.com/dog.jpg",
            None,
            "https://example.com/spec.pdf",
        ]
        assert refs[0] is not None and refs[0].media_type == "image/png"
        assert await a.artifacts.get(refs[0].sha256) == PNG
        assert refs[2] is not None and await a.artifacts.get(refs[2].sha256) == PDF
        # the turn's result projects them too
        assert [m.parts for m in result.messages if isinstance(m, UserMessage)] == [parts]


def test_run_sync_takes_media(tmp_path: Path) -> None:
    recorder = Recorder()
    with agent(tmp_path / "state", FunctionModel(recorder)) as a:
        a.run_sync(["look", BinaryContent(PNG, "image/png")])
    assert recorder.user_parts() == [(MediaPart(media_type="image/png", data=PNG),)]


async def test_stream_takes_media(tmp_path: Path) -> None:
    recorder = Recorder()
    async with agent(tmp_path / "state", FunctionModel(recorder)) as a:
        items = [item async for item in a.stream(["look", BinaryContent(JPEG, "image/jpeg")])]
    assert isinstance(items[-1], TurnFinished)
    assert recorder.user_parts() == [(MediaPart(media_type="image/jpeg", data=JPEG),)]


async def test_a_reopened_session_projects_the_same_parts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with agent(state, FunctionModel(Recorder())) as a:
        await a.run(["one", BinaryContent(PNG, "image/png", name="p.png")], session="s")
    recorder = Recorder()
    async with agent(state, FunctionModel(recorder)) as b:  # a new process's agent
        await b.run("two", session="s")
    assert recorder.user_parts() == [
        (MediaPart(media_type="image/png", data=PNG, name="p.png"),),
        (),
    ]


async def test_a_checkpointed_session_projects_the_same_parts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with agent(state, FunctionModel(Recorder())) as a:
        await a.run(["one", BinaryContent(PNG, "image/png")], session="s")
        await a.run("two", session="s")
        fold = await open_fold(a.log, "s")
        # a fold's checkpoint holds its parts by reference, once their bytes are read
        assert not await save_checkpoint(a.log, fold)
        await load_media(fold, a.artifacts)
        assert await save_checkpoint(a.log, fold)
    recorder = Recorder()
    async with agent(state, FunctionModel(recorder)) as b:
        opened = await open_fold(b.log, "s")
        assert opened.checkpoint_offset > 0  # restored from the checkpoint
        await b.run("three", session="s")
    assert recorder.user_parts() == [(MediaPart(media_type="image/png", data=PNG),), (), ()]


async def test_a_fork_projects_the_parents_parts(tmp_path: Path) -> None:
    storage = Storage.from_url(f"file://{tmp_path / 'objects'}")
    try:
        async with agent(storage, FunctionModel(Recorder())) as a:
            await a.run(["one", BinaryContent(PNG, "image/png")], session="parent")
        events = await storage.log.read_all("parent")
        end = next(e.offset for e in events if isinstance(e.body, TurnEnded)) + 1
        await fork_session(
            storage.log,
            "parent",
            fork_id="fork",
            at=end,
            clock=ManualClock(),
            ids=SequentialIds("f"),
        )
        recorder = Recorder()
        async with agent(storage, FunctionModel(recorder)) as b:
            await b.run("two", session="fork")
        assert recorder.user_parts() == [(MediaPart(media_type="image/png", data=PNG),), ()]
    finally:
        await storage.close()


async def test_a_missing_artifact_fails_closed_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with agent(state, FunctionModel(Recorder())) as a:
        await a.run(["one", BinaryContent(PNG, "image/png", name="p.png")], session="s")
        events = await a.log.read_all("s")
    started = next(e.body for e in events if isinstance(e.body, TurnStarted))
    ref = started.attachments[0].artifact
    assert ref is not None
    shutil.rmtree(state / "artifacts")
    recorder = Recorder()
    async with agent(state, FunctionModel(recorder)) as b:
        with pytest.raises(StorageError) as caught:
            await b.run("two", session="s")
    assert ref.sha256 in str(caught.value) and "'p.png'" in str(caught.value)
    assert caught.value.code == "artifact_missing"
    assert recorder.requests == []  # nothing was sent without it


@pytest.mark.parametrize(
    ("item", "limits", "message"),
    [
        (BinaryContent(JPEG, "image/png"), MediaLimits(), "are not image/png data"),
        (BinaryContent(b"GIF00a", "image/gif"), MediaLimits(), "are not image/gif data"),
        (BinaryContent(PNG, "image/webp"), MediaLimits(), "are not image/webp data"),
        (BinaryContent(PNG, "image/png"), MediaLimits(max_bytes=10), "more than the 10 allowed"),
        (BinaryContent(b"MZ", "application/x-msdownload"), MediaLimits(), "is not one lodger"),
        (ImageUrl("file:///etc/passwd"), MediaLimits(), "is not http or https"),
        (DocumentUrl("ftp://example.com/a.pdf"), MediaLimits(), "is not http or https"),
        (ImageUrl("https://example.com/photo"), MediaLimits(), "cannot tell the media type"),
        (ImageUrl("https://example.com/a.pdf"), MediaLimits(), "not an image"),
        (DocumentUrl("http://[::1/a.pdf"), MediaLimits(), "cannot be read"),
        (
            ImageUrl("https://example.com/a.exe", media_type="application/x-sh"),
            MediaLimits(),
            "is not one lodger",
        ),
        (b"raw bytes", MediaLimits(), "holds a bytes"),
    ],
)
async def test_hostile_media_are_refused_before_anything_is_written(
    tmp_path: Path, item: object, limits: MediaLimits, message: str
) -> None:
    recorder = Recorder()
    async with agent(tmp_path / "state", FunctionModel(recorder), limits=Limits(media=limits)) as a:
        with pytest.raises(UsageError, match=message):
            await a.run(["look", item], session="s")  # type: ignore[list-item]
        assert not await a.log.exists("s")
    assert recorder.requests == []


async def test_a_turn_over_its_media_budget_is_refused(tmp_path: Path) -> None:
    limits = Limits(media=MediaLimits(max_bytes=100, max_turn_bytes=100))
    async with agent(tmp_path / "state", FunctionModel(Recorder()), limits=limits) as a:
        with pytest.raises(UsageError, match="more than the 100 allowed a turn"):
            await a.run([BinaryContent(PNG, "image/png"), BinaryContent(PNG, "image/png")])


def test_from_path_guesses_and_refuses_what_it_cannot_tell(tmp_path: Path) -> None:
    (tmp_path / "a.webp").write_bytes(b"RIFF\0\0\0\0WEBPVP8 ")
    (tmp_path / "notes.md").write_text("# hi")
    (tmp_path / "blob").write_bytes(b"?")
    assert BinaryContent.from_path(tmp_path / "a.webp").media_type == "image/webp"
    assert BinaryContent.from_path(tmp_path / "notes.md").media_type == "text/markdown"
    with pytest.raises(UsageError, match="cannot tell the media type"):
        BinaryContent.from_path(tmp_path / "blob")
    with pytest.raises(UsageError, match="cannot read"):
        BinaryContent.from_path(tmp_path / "absent.png")


class TextOnly(FunctionModel):
    media_kinds: frozenset[str] = frozenset()


class ImagesOnly(FunctionModel):
    media_kinds: frozenset[str] = frozenset({"image"})


async def test_a_model_that_takes_no_images_fails_the_turn_before_sending(tmp_path: Path) -> None:
    recorder = Recorder()
    async with agent(tmp_path / "state", TextOnly(recorder, name="plain")) as a:
        result = await a.run(["look", BinaryContent(PNG, "image/png")], session="s")
    assert result.status == "failed"
    assert result.error is not None
    assert "'function:plain'" in result.error and "image/png" in result.error
    assert recorder.requests == []


async def test_a_model_that_takes_images_refuses_a_pdf(tmp_path: Path) -> None:
    recorder = Recorder()
    async with agent(tmp_path / "state", ImagesOnly(recorder, name="eyes")) as a:
        ok = await a.run(["look", BinaryContent(PNG, "image/png")], session="s")
        assert ok.status == "completed"
        refused = await a.run(["read", DocumentUrl("https://example.com/a.pdf")], session="s")
    assert refused.status == "failed" and refused.error is not None
    assert "application/pdf" in refused.error and "image/png" not in refused.error
    assert len(recorder.requests) == 1


@tool
def screenshot(kind: str) -> BinaryContent | ToolOutput:
    """Take a screenshot."""
    if kind == "pair":
        return ToolOutput(
            content="two views",
            parts=(BinaryContent(PNG, "image/png"), BinaryContent(JPEG, "image/png")),
        )
    if kind == "long":
        return ToolOutput(content="pixels " * 300, parts=(BinaryContent(PNG, "image/png"),))
    return BinaryContent(PNG, "image/png", name="screen.png")


class ToolCaller:
    """Calls ``screenshot`` once per turn, then answers; records every request."""

    def __init__(self, kind: str = "one") -> None:
        self.kind = kind
        self.requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if isinstance(request.messages[-1], UserMessage):
            return ModelResponse(calls=(tool_call("screenshot", kind=self.kind),))
        return ModelResponse(text="done")

    def result_parts(self, index: int = -1) -> list[tuple[MediaPart, ...]]:
        messages = self.requests[index].messages
        return [m.parts for m in messages if isinstance(m, ToolResultMessage)]


async def test_a_tools_image_is_an_artifact_and_a_part_of_its_result(tmp_path: Path) -> None:
    state = tmp_path / "state"
    caller = ToolCaller()
    async with agent(state, FunctionModel(caller), tools=[screenshot]) as a:
        await a.run("shoot", session="s")
        events = await a.log.read_all("s")
        responded = next(e.body for e in events if isinstance(e.body, ToolResponded))
        (ref,) = responded.artifacts
        assert ref.media_type == "image/png" and await a.artifacts.get(ref.sha256) == PNG
        assert "image/png 'screen.png': 72 bytes" in responded.content
    assert caller.result_parts() == [(MediaPart(media_type="image/png", data=PNG),)]
    again = ToolCaller()
    async with agent(state, FunctionModel(again), tools=[screenshot]) as b:
        await b.run("shoot again", session="s")
    # the reopened session projects the first result's image from the artifact store
    assert again.result_parts(0) == [(MediaPart(media_type="image/png", data=PNG),)]


async def test_a_tools_bad_image_is_noted_not_attached(tmp_path: Path) -> None:
    caller = ToolCaller("pair")
    async with agent(tmp_path / "state", FunctionModel(caller), tools=[screenshot]) as a:
        await a.run("shoot", session="s")
        events = await a.log.read_all("s")
    responded = next(e.body for e in events if isinstance(e.body, ToolResponded))
    assert [r.media_type for r in responded.artifacts] == ["image/png"]
    assert "screenshot's image/png was not attached" in responded.content
    assert caller.result_parts() == [(MediaPart(media_type="image/png", data=PNG),)]


@tool(approval=True)
def publish(target: str) -> str:
    """Publish (needs approval)."""
    return f"published {target}"


class Parker:
    """Answers "park" first, then allows."""

    def __init__(self) -> None:
        self.answers = ["park", True]

    async def __call__(self, t: object, arguments: object) -> object:
        return self.answers.pop(0)


async def test_a_resumed_turn_projects_its_parts(tmp_path: Path) -> None:
    state = tmp_path / "state"

    def first(request: ModelRequest) -> ModelResponse:
        return ModelResponse(calls=(tool_call("publish", target="site"),))

    parker = Parker()
    async with agent(
        state, FunctionModel(first), tools=[publish], hooks=Hooks(approver=parker)
    ) as a:
        parked = await a.run(["publish it", BinaryContent(PNG, "image/png")], session="s")
    assert parked.status == "waiting"  # the turn is open, its call parked
    recorder = Recorder()
    async with agent(
        state, FunctionModel(recorder), tools=[publish], hooks=Hooks(approver=parker)
    ) as b:
        resumed = await b.resume("s")
    assert resumed.status == "completed"
    assert recorder.user_parts() == [(MediaPart(media_type="image/png", data=PNG),)]


def _media_session() -> tuple[list[Event], dict[str, bytes]]:
    """Two turns with attachments (bytes and a URL) and a tool's image result."""

    async def build() -> tuple[list[Event], dict[str, bytes]]:
        artifacts = MemoryArtifactStore()
        storage = Storage(log=EventLog(MemoryLogStore()), artifacts=artifacts)
        async with agent(storage, FunctionModel(ToolCaller("long")), tools=[screenshot]) as a:
            await a.run(["one", BinaryContent(PNG, "image/png", name="a.png")], session="s")
            await a.run(["two", ImageUrl("https://example.com/b.gif")], session="s")
            await a.run(["three", BinaryContent(PDF, "application/pdf")], session="s")
            return await a.log.read_all("s"), dict(artifacts.blobs)

    return asyncio.run(build())


MEDIA_EVENTS, MEDIA = _media_session()


@settings(max_examples=len(MEDIA_EVENTS) + 1, deadline=None)
@given(st.integers(min_value=0, max_value=len(MEDIA_EVENTS)), st.sampled_from([None, 10, 5000]))
def test_incremental_projection_of_media_equals_the_full_one(n: int, budget: int | None) -> None:
    growing: list[Event] = []
    projector = Projector(growing, media=dict(MEDIA))
    for event in MEDIA_EVENTS[:n]:
        growing.append(event)
        projector.project(budget_tokens=budget)
    got = projector.project(budget_tokens=budget)
    assert got == project_messages(MEDIA_EVENTS[:n], budget_tokens=budget, media=MEDIA)
    # the plain form a checkpoint stores reads back to the same messages (parts by sha256)
    plain = json.loads(json.dumps([_message_plain(m) for m in got.messages]))
    assert _messages_from(plain, MEDIA) == list(got.messages)


def test_the_media_session_holds_every_kind_of_part() -> None:
    full = project_messages(MEDIA_EVENTS, media=MEDIA).messages
    user = [p.media_type for m in full if isinstance(m, UserMessage) for p in m.parts]
    results = [p.media_type for m in full if isinstance(m, ToolResultMessage) for p in m.parts]
    assert user == ["image/png", "image/gif", "application/pdf"]
    assert results == ["image/png"] * 3
    # eliding old results to fit a budget shortens their text, never drops their media
    tight = project_messages(MEDIA_EVENTS, media=MEDIA, budget_tokens=10)
    assert tight.elided_call_ids
    kept = [m.parts for m in tight.messages if isinstance(m, ToolResultMessage)]
    assert kept == [(MediaPart(media_type="image/png", data=PNG),)] * 3
    with pytest.raises(StorageError, match=r"\(artifact [0-9a-f]{64}\) is not loaded"):
        project_messages(MEDIA_EVENTS)  # without the bytes: fails closed


async def test_the_composed_sessions_path_takes_media(tmp_path: Path) -> None:
    # what the CLI, the host and the workers call
    recorder = Recorder()
    async with Sessions(Storage.local(tmp_path / "state")) as sessions:  # closes it
        binding = Binding(model=FunctionModel(recorder))
        result = await sessions.run(
            ["look", BinaryContent(PNG, "image/png")], binding=binding, session="s"
        )
    assert result.status == "completed"
    assert recorder.user_parts() == [(MediaPart(media_type="image/png", data=PNG),)]
