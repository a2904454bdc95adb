"""Live streams: every client sees the same facts in the same order, a cut stream
resumes from its last event id with no gap and no duplicate, and the host holds 50
streams and 20 senders at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest

from lodger.client import HostClient, StreamedFact

from ._support import running_host, write_script


async def _collect_until_end(client: HostClient, sid: str, turns: int = 1) -> list[StreamedFact]:
    seen: list[StreamedFact] = []
    async for fact in client.stream(sid):
        seen.append(fact)
        if sum(f.kind == "turn_ended" for f in seen) == turns:
            return seen
    raise AssertionError("the stream ended")


async def test_two_clients_see_the_same_facts_in_the_same_order(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {
                "calls": [
                    {"name": "gate", "args": {"name": "g1"}},
                    {"name": "echo", "args": {"text": "x"}},
                ]
            },
            {"text": "done"},
        ],
    )
    async with (
        running_host(tmp_path / "state", models=(model,)) as host,
        host.client() as a,
        host.client() as b,
    ):
        sid = await a.create_session()
        # both streams are open before the turn starts: they see it live
        first = asyncio.create_task(_collect_until_end(a, sid))
        second = asyncio.create_task(_collect_until_end(b, sid))
        sent = await a.send(sid, "go", key="1")
        await _wait_for_start(gates / "g1.starts")
        (gates / "g1").touch()
        seen_a, seen_b = await asyncio.wait_for(asyncio.gather(first, second), 60)
        assert [(f.offset, f.kind, f.data["digest"]) for f in seen_a] == [
            (f.offset, f.kind, f.data["digest"]) for f in seen_b
        ]
        assert [f.offset for f in seen_a] == list(range(len(seen_a)))
        stored = await a.events(sid)
        assert [f.data for f in stored] == [f.data for f in seen_a]
        await a.wait_message(sid, sent["message"]["id"])


async def _wait_for_start(path: Path) -> None:
    async with asyncio.timeout(30):
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 - a tool's file
            await asyncio.sleep(0.02)


async def test_a_cut_stream_resumes_from_its_last_event_id(tmp_path: Path, gates: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {"calls": [{"name": "echo", "args": {"text": "a"}}]},
            {"calls": [{"name": "gate", "args": {"name": "g2"}}]},
            {"calls": [{"name": "echo", "args": {"text": "b"}}]},
            {"text": "done"},
        ],
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "go", key="1")
        await _wait_for_start(gates / "g2.starts")
        # read with a raw connection and cut it mid-way, after a few facts
        got: list[int] = []
        async with (
            httpx2.AsyncClient(
                base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
            ) as raw,
            raw.stream("GET", f"/v1/sessions/{sid}/stream") as response,
        ):
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    got.append(int(line[4:]))
                if len(got) == 5:
                    break  # the connection closes here, mid-stream
        assert got == [0, 1, 2, 3, 4]
        (gates / "g2").touch()  # the turn goes on while nobody listens
        await c.wait_message(sid, sent["message"]["id"])
        rest: list[StreamedFact] = []
        async for fact in c.stream(sid, after=got[-1], follow=False):
            rest.append(fact)
        offsets = got + [f.offset for f in rest]
        total = len(await c.events(sid))
        assert offsets == list(range(total))  # no gap, no duplicate
        assert rest[-1].kind == "turn_ended"
        # the Last-Event-ID header is what a browser's EventSource sends on reconnect
        async with httpx2.AsyncClient(
            base_url=host.url, headers={"Authorization": f"Bearer {host.token}"}
        ) as raw:
            response = await raw.get(
                f"/v1/sessions/{sid}/stream",
                params={"follow": "false"},
                headers={"Last-Event-ID": str(total - 2)},
            )
            ids = [int(x[4:]) for x in response.text.splitlines() if x.startswith("id: ")]
            assert ids == [total - 1]


@pytest.mark.slow
async def test_fifty_streams_and_twenty_senders_hold(tmp_path: Path) -> None:
    model = write_script(
        tmp_path / "s.json", [{"calls": [{"name": "echo", "args": {"text": "x"}}]}, {"text": "ok"}]
    )
    async with running_host(tmp_path / "state", models=(model,)) as host, host.client() as c:
        sids = [await c.create_session() for _ in range(5)]
        clients = [host.client() for _ in range(10)]
        try:
            # 50 streams: 10 per session, each until its session has 4 settled turns
            streams = [
                asyncio.create_task(_collect_until_end(clients[i % 10], sids[i % 5], turns=4))
                for i in range(50)
            ]

            # 20 senders: 4 per session, one message each (and a retry of it)
            async def sender(i: int) -> dict[str, object]:
                sid, key = sids[i % 5], f"m{i}"
                sent = await clients[i % 10].send(sid, f"task {i}", key=key)
                retry = await clients[(i + 1) % 10].send(sid, f"task {i}", key=key)
                assert retry["message"]["id"] == sent["message"]["id"]
                return await clients[i % 10].wait_message(sid, sent["message"]["id"], within=120)

            results = await asyncio.wait_for(asyncio.gather(*(sender(i) for i in range(20))), 150)
            assert all(r["status"] == "done" for r in results), results
            seen = await asyncio.wait_for(asyncio.gather(*streams), 60)
            for i, facts in enumerate(seen):
                stored = await c.events(sids[i % 5])
                assert [f.data["digest"] for f in facts] == [f.data["digest"] for f in stored]
            for sid in sids:
                facts = await c.events(sid)
                assert sum(f.kind == "turn_started" for f in facts) == 4
        finally:
            for client in clients:
                await client.aclose()


@pytest.mark.slow
async def test_facts_another_process_commits_reach_open_streams(tmp_path: Path) -> None:
    """The stream tails the log when the host did not commit a fact itself (here a turn
    run on the same state directory by another ``Sessions``, as ``lodger run`` would)."""
    from lodger import ScriptedModel
    from lodger.runtime.sessions import Binding, Sessions
    from lodger.storage import Storage

    from . import host_tools

    model = write_script(tmp_path / "s.json", [{"text": "hosted"}])
    state = tmp_path / "state"
    async with running_host(state, models=(model,)) as host, host.client() as c:
        sid = await c.create_session()
        sent = await c.send(sid, "in the host", key="1")
        await c.wait_message(sid, sent["message"]["id"])
        before = len(await c.events(sid))
        seen: list[StreamedFact] = []

        async def follow() -> None:
            async for fact in c.stream(sid):
                seen.append(fact)
                if fact.kind == "turn_ended" and fact.offset >= before:
                    return

        following = asyncio.create_task(follow())
        async with Sessions(Storage.local(state)) as outside:
            result = await outside.run(
                "outside the host",
                binding=Binding(
                    model=ScriptedModel(
                        [{"calls": [{"name": "echo", "args": {"text": "o"}}]}, {"text": "out"}]
                    ),
                    tools=[host_tools.echo],
                ),
                session=sid,
            )
        assert result.status == "completed"
        await asyncio.wait_for(following, 30)
        stored = await c.events(sid)
        assert [f.offset for f in seen] == list(range(len(stored)))
        assert seen[-1].data["body"]["answer"] == "out"
