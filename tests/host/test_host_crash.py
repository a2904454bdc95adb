"""A host SIGKILLed mid-turn (a real ``lodger serve`` subprocess) and started again loses
nothing: the turn is resumed (not retried) by the new process, and a client's stream
resumes from its last event id with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lodger.client import HostClient, StreamedFact
from lodger.errors import HostConflictError
from lodger.storage import open_log

from ._support import write_script

TOOLS = Path(__file__).parent / "host_tools.py"
TOKEN = "lgr_crash-test-admin-token-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start(state: Path, model: str, port: int, gates: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LODGER_HOST_TOKEN": TOKEN, "HOST_TEST_GATES": str(gates)}
    src = Path(__file__).parents[2] / "src"
    env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = state.parent / f"host-{port}-{len(list(state.parent.glob('host-*.out')))}.out"
    with out.open("w") as sink:
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [
                sys.executable,
                "-m",
                "lodger",
                "serve",
                "--state",
                str(state),
                "--port",
                str(port),
                "--model",
                model,
                "--tools",
                str(TOOLS),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    async with asyncio.timeout(60):
        while True:
            text = await asyncio.to_thread(out.read_text)
            assert TOKEN not in text  # the token is never printed
            if "lodger host on" in text:
                return proc
            if proc.poll() is not None:
                raise AssertionError(f"host exited {proc.returncode}: {text}")
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_host_killed_mid_turn_loses_nothing_and_the_stream_resumes(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {"calls": [{"name": "echo", "args": {"text": "before"}}]},
            {"calls": [{"name": "gate", "args": {"name": "crash"}}]},
            {"calls": [{"name": "echo", "args": {"text": "after"}}]},
            {"text": "finished"},
        ],
    )
    state, port = tmp_path / "state", _free_port()
    proc = await _start(state, model, port, gates)
    seen: list[StreamedFact] = []
    try:
        async with HostClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            sid = await client.create_session()
            sent = await client.send(sid, "go", key="crash-1")
            async with asyncio.timeout(30):
                async for fact in client.stream(sid, reconnect=False):
                    seen.append(fact)
                    if fact.kind == "tool_dispatched" and fact.data["body"]["tool"] == "gate":
                        break
            async with asyncio.timeout(30):
                while not (gates / "crash.starts").exists():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-turn: the gate tool is running
        proc.wait()
    (gates / "crash").touch()
    proc = await _start(state, model, port, gates)
    try:
        async with HostClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            rest: list[StreamedFact] = []
            async with asyncio.timeout(60):
                async for fact in client.stream(sid, after=seen[-1].offset):
                    rest.append(fact)
                    if fact.kind == "turn_ended":
                        break
            done = await client.wait_message(sid, sent["message"]["id"])
            assert done["status"] == "done", done
            assert done["result"]["status"] == "completed"
            stored = await client.events(sid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    offsets = [f.offset for f in seen + rest]
    assert offsets == list(range(len(stored)))  # no gap, no duplicate across the crash
    # nothing committed before the kill was lost or changed
    assert [f.data["digest"] for f in seen] == [f.data["digest"] for f in stored[: len(seen)]]
    kinds = [f.kind for f in rest]
    assert "run_started" in kinds  # a new run resumed the turn
    assert sum(f.kind == "turn_started" for f in stored) == 1  # the message ran once
    redispatch = [
        f for f in rest if f.kind == "tool_dispatched" and f.data["body"]["tool"] == "gate"
    ]
    assert redispatch and redispatch[0].data["body"]["retry_of"]  # idempotent: re-run, linked
    assert (gates / "crash.starts").read_text().count("start") == 2
    assert rest[-1].data["body"]["answer"] == "finished"
    for path in state.rglob("*"):  # no token in the log, the index or anything else kept
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    log = open_log(state)
    try:
        assert (await log.verify(sid)).high_water == len(stored)
    finally:
        await log.close()


@pytest.mark.slow
async def test_an_approval_pending_when_the_host_dies_expires_and_the_turn_goes_on(
    tmp_path: Path, gates: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"calls": [{"name": "deploy", "args": {"target": "prod"}}]}, {"text": "stopped there"}],
    )
    state, port = tmp_path / "state", _free_port()
    proc = await _start(state, model, port, gates)
    try:
        async with HostClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            sid = await client.create_session()
            sent = await client.send(sid, "ship", key="a-1")
            async with asyncio.timeout(30):
                while not await client.approvals(sid):  # noqa: ASYNC110 - over HTTP
                    await asyncio.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = await _start(state, model, port, gates)
    try:
        async with HostClient(f"http://127.0.0.1:{port}", token=TOKEN) as client:
            done = await client.wait_message(sid, sent["message"]["id"])
            facts = await client.events(sid)
            assert await client.approvals(sid) == []
            with pytest.raises(HostConflictError) as late:
                await client.answer(sid, facts[5].data["call_id"], allow=True)
            assert late.value.code == "already_answered"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert done["status"] == "done" and done["kind"] == "resume"
    observed = [f.data["body"] for f in facts if f.kind == "recovery_observed"]
    assert [o["reason"] for o in observed] == ["not_dispatched"]  # the model is told
    kinds = [f.kind for f in facts]
    assert kinds.count("turn_started") == 1 and kinds[-1] == "turn_ended"
    assert "tool_dispatched" not in kinds  # the call that waited never ran
