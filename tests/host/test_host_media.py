"""A turn's attachments through the HTTP host: a real server, a real SQLite log and
artifact store. The bytes sent in base64 are the artifacts the ``turn_started`` fact
lists, and a library agent on the same storage projects them for its next request."""

from __future__ import annotations

import base64
import random
import re
from pathlib import Path

import httpx2

from lodger import Agent, BinaryContent, FunctionModel, ImageUrl
from lodger.errors import UsageError
from lodger.events import TurnStarted
from lodger.host.routes.messages import _DATA_PATTERNS
from lodger.media import MediaLimits, check_media
from lodger.providers.base import MediaPart, ModelRequest, ModelResponse, UserMessage
from lodger.storage import Storage

from ._support import running_host, write_script

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(48))


async def test_a_message_with_attachments_runs_a_turn_with_them(tmp_path: Path) -> None:
    model = write_script(tmp_path / "s.json", [{"text": "a picture"}])
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        attachments = [
            BinaryContent(PNG, "image/png", name="pic.png"),
            ImageUrl("https://example.com/b.webp"),
        ]
        sent = await c.send(sid, "what is it?", key="m1", attachments=attachments)
        again = await c.send(sid, "what is it?", key="m1", attachments=attachments)
        assert not again["created"]  # the same message: it runs once
        done = await c.wait_message(sid, sent["message"]["id"])
        assert done["status"] == "done", done
    storage = Storage.local(state)
    try:
        events = await storage.log.read_all(sid)
        started = [e.body for e in events if isinstance(e.body, TurnStarted)]
        assert len(started) == 1 and started[0].input == "what is it?"
        (picture, link) = started[0].attachments
        assert picture.name == "pic.png" and picture.artifact is not None
        assert await storage.artifacts.get(picture.artifact.sha256) == PNG
        assert (link.url, link.media_type) == ("https://example.com/b.webp", "image/webp")
        requests: list[ModelRequest] = []

        def model_fn(request: ModelRequest) -> ModelResponse:
            requests.append(request)
            return ModelResponse(text="ok")

        async with Agent(model=FunctionModel(model_fn), storage=storage) as agent:
            await agent.run("and now?", session=sid)
        first = next(m for m in requests[0].messages if isinstance(m, UserMessage))
        assert first.parts == (
            MediaPart(media_type="image/png", data=PNG, name="pic.png"),
            MediaPart(media_type="image/webp", url="https://example.com/b.webp"),
        )
    finally:
        await storage.close()


async def test_bad_attachments_are_refused_by_the_schema(tmp_path: Path) -> None:
    # the contract says what is taken: each type's bytes start as its files do (the
    # library's magic check as a pattern), a URL is http(s), data or url, never both
    async with running_host(tmp_path / "state") as host, host.client() as c:
        sid = await c.create_session()
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as raw:

            async def post(*attachments: dict[str, str]) -> httpx2.Response:
                body = {"text": "look", "attachments": list(attachments)}
                return await raw.post(f"/v1/sessions/{sid}/messages", json=body)

            jpeg = base64.b64encode(b"\xff\xd8\xff\xe0 jpeg").decode()
            png = base64.b64encode(PNG).decode()
            refused = [
                {"media_type": "image/png", "data": jpeg},  # JPEG bytes declared PNG
                {"media_type": "image/jpeg", "data": png},
                {"url": "file:///etc/passwd"},
                {"url": "ftp://example.com/a.pdf"},
                {"url": "https://example.com/photo"},  # no type, and none in its path
                {"url": "http://[::1/a.png"},
                {"url": "https://example.com/a", "media_type": "image/bmp"},
                {"media_type": "image/png", "data": "%%%"},  # not base64
                {"media_type": "image/png", "data": png[:-1]},  # not padded
                {"data": jpeg},  # no media type
                {"media_type": "image/png", "data": png, "url": "https://a/b"},
                {"media_type": "application/x-sh", "data": base64.b64encode(b"#!").decode()},
            ]
            for attachment in refused:
                answer = await post(attachment)
                assert answer.status_code == 422, (attachment, answer.text)
                assert answer.json()["error"]["code"] == "invalid_request"
        # nothing of it reached the log or the queue
        assert (await c.show(sid))["events"] == 0
        assert await host.control.messages(session_id=sid) == []


def test_the_schema_patterns_are_the_librarys_magic_check() -> None:
    # every prefix length and both outcomes: the pattern matches the base64 of bytes
    # exactly when the library's check takes them
    rng = random.Random(30)
    heads = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"%PDF-", b"RIFF"]
    for media_type, pattern in _DATA_PATTERNS.items():
        matcher = re.compile(pattern)
        for n in range(600):
            head = rng.choice(heads) if n % 3 else b""
            data = head + rng.randbytes(n % 17)
            if media_type == "image/webp" and n % 2:
                data = b"RIFF" + rng.randbytes(4) + b"WEBP" + rng.randbytes(n % 5)
            try:
                check_media(data, media_type, name="", limits=MediaLimits())
                taken = True
            except UsageError:
                taken = False
            encoded = base64.b64encode(data).decode()
            assert bool(matcher.match(encoded)) == taken, (media_type, data, encoded)
