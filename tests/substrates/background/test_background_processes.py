"""Background processes through the whole pipeline, in real bubblewrap sandboxes: a dev
server started in the background is reached from a later shell call and stopped; the turn's
end stops what it kept; a limit stops a runaway process and is named; the server is not
reachable from outside the session's sandbox."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from lodger import Agent, ScriptedModel
from lodger.events import Event, ProcessEnded, ProcessStarted, ToolDispatched, ToolResponded
from lodger.storage import Storage
from lodger.substrates.background import ProcessLimits
from lodger.substrates.processes import process_tools
from lodger.substrates.shell import shell_tool

#: a shell command that fetches the server's page, retrying while it starts
PROBE = (
    'python3 -c "import time, urllib.request as u\n'
    "for _ in range({tries}):\n"
    "    try:\n"
    "        print(u.urlopen('http://127.0.0.1:{port}/', timeout=2).read()[:300].decode()); break\n"
    "    except OSError: time.sleep(0.1)\n"
    "else: print('UNREACHABLE')\""
)


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"calls": [{"name": name, "args": args}]}


async def _run(
    ws: Path, script: list[Any], limits: ProcessLimits | None = None
) -> tuple[str, list[Event]]:
    agent = Agent(
        model=ScriptedModel(script),
        tools=[shell_tool(), *process_tools(limits=limits)],
        workspace=ws,
        storage=Storage.memory(),
    )
    result = await agent.run("go")
    assert result.status == "completed", result.error
    return result.session_id, list(await agent.session(result.session_id).events())


def _bodies(events: list[Event], kind: type) -> list[Any]:
    return [e.body for e in events if isinstance(e.body, kind)]


def _responses(events: list[Event]) -> list[str]:
    return [b.content for b in _bodies(events, ToolResponded)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


async def test_a_dev_server_in_the_background_is_reached_by_a_later_shell_call(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path)
    (ws / "index.html").write_text("hello from the workspace\n")
    port = _free_port()
    script: list[Any] = [
        _call("start_process", command=f"exec python3 -m http.server {port} --bind 127.0.0.1"),
        _call("shell", command=PROBE.format(tries=100, port=port)),
        _call("process_output", process_id="proc-call-0-1"),
        _call("process_stop", process_id="proc-call-0-1"),
        _call("shell", command=PROBE.format(tries=3, port=port)),
        {"text": "done"},
    ]
    _, events = await _run(ws, script)
    started = _bodies(events, ProcessStarted)
    assert [s.process_id for s in started] == ["proc-call-0-1"]
    assert started[0].keep == "turn" and started[0].sandbox.startswith("bubblewrap start=")
    (t1, *_) = _bodies(events, ToolDispatched)
    assert t1.resources == ("write file:./**", "actor:sandbox:bubblewrap")
    responses = _responses(events)
    assert "hello from the workspace" in responses[1]  # the later shell call reached it
    assert '"GET / HTTP/1.1" 200' in responses[2]  # the server's log, read back
    assert "next_offset" in responses[2]
    assert "ended: stopped" in responses[3]
    assert "UNREACHABLE" in responses[4]  # stopped means gone
    ended = _bodies(events, ProcessEnded)
    assert [(e.process_id, e.status) for e in ended] == [("proc-call-0-1", "stopped")]
    assert started[0].pid is not None and not _alive(started[0].pid)
    with socket.socket() as s:  # and it never listened on the host's loopback
        assert s.connect_ex(("127.0.0.1", port)) != 0


async def test_the_turn_end_stops_what_it_kept(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = [_call("start_process", command="exec sleep 600"), {"text": "done"}]
    _, events = await _run(ws, script)
    (started,) = _bodies(events, ProcessStarted)
    (ended,) = _bodies(events, ProcessEnded)
    assert (ended.process_id, ended.status) == (started.process_id, "stopped")
    kinds = [e.body.kind for e in events]
    # committed with the turn's end, in its append
    assert kinds.index("process_ended") > kinds.index("process_started")
    assert kinds[-1] == "turn_ended"
    assert not _alive(started.pid)


async def test_a_runaway_process_is_stopped_by_a_named_limit(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = [
        _call("start_process", command="exec python3 -c 'while True: pass'"),
        _call("start_process", command="exec sleep 600"),
        _call("start_process", command="exec sleep 600"),
        _call("process_wait", process_id="proc-call-0-1", timeout_s=30),
        {"text": "done"},
    ]
    limits = ProcessLimits(cpu_time_s=0.5, max_processes=2)
    _, events = await _run(ws, script, limits)
    responses = _responses(events)
    assert "process count limit" in responses[2]  # the third of two
    assert "ended: limit (cpu time limit reached)" in responses[3]
    ended = {e.process_id: e for e in _bodies(events, ProcessEnded)}
    assert (ended["proc-call-0-1"].status, ended["proc-call-0-1"].reason) == ("limit", "cpu_time")
    assert ended["proc-call-1-1"].status == "stopped"  # by the turn's end


async def test_input_reaches_the_process_and_output_is_bounded(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = [
        _call("start_process", command="while read line; do echo got:$line; done; seq 1 50000"),
        _call("process_input", process_id="proc-call-0-1", text="one\ntwo\n", close=True),
        _call("process_wait", process_id="proc-call-0-1", timeout_s=30),
        _call("process_output", process_id="proc-call-0-1"),
        {"text": "done"},
    ]
    _, events = await _run(ws, script, ProcessLimits(kept_bytes=1000))
    responses = _responses(events)
    assert "ended: exited, exit code 0" in responses[2]
    assert responses[3].startswith("got:one\ngot:two\n1\n2\n")
    assert "bytes past the kept 1000 were not kept" in responses[3]
    (ended,) = _bodies(events, ProcessEnded)
    assert ended.status == "exited" and ended.output_bytes > 1000


async def test_a_policy_with_network_or_another_backend_refuses_to_start(tmp_path: Path) -> None:
    from lodger.substrates.sandbox import NetworkPolicy, SandboxPolicy

    ws = _workspace(tmp_path)
    refused = []
    for policy in (
        SandboxPolicy(network=NetworkPolicy(allow=("example.com",))),
        SandboxPolicy(backend="none"),
    ):
        agent = Agent(
            model=ScriptedModel([_call("start_process", command="sleep 1"), {"text": "ok"}]),
            tools=process_tools(policy),
            workspace=ws,
            storage=Storage.memory(),
        )
        result = await agent.run("go")
        events = list(await agent.session(result.session_id).events())
        refused += _responses(events)
        assert not _bodies(events, ProcessStarted)
    assert all("only in a bubblewrap sandbox with no network policy" in r for r in refused)


async def test_a_process_kept_for_the_session_outlives_its_turn(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "index.html").write_text("still here\n")
    port = _free_port()
    server = f"exec python3 -m http.server {port} --bind 127.0.0.1"
    agent = Agent(
        model=ScriptedModel(
            turns=[
                [_call("start_process", command=server, keep="session"), {"text": "up"}],
                [
                    _call("shell", command=PROBE.format(tries=100, port=port)),
                    _call("process_stop", process_id="proc-call-0-1"),
                    {"text": "done"},
                ],
            ]
        ),
        tools=[shell_tool(), *process_tools()],
        workspace=ws,
        storage=Storage.memory(),
    )
    first = await agent.run("start it")
    events = list(await agent.session(first.session_id).events())
    assert not _bodies(events, ProcessEnded)  # the turn ended, the process did not
    second = await agent.run("test it", session=first.session_id)
    assert second.status == "completed", second.error
    events = list(await agent.session(first.session_id).events())
    assert "still here" in _responses(events)[1]
    (ended,) = _bodies(events, ProcessEnded)
    assert ended.status == "stopped"


async def test_a_process_writing_past_its_disk_limit_is_stopped_by_it(tmp_path: Path) -> None:
    """The disk watcher of shell commands covers background processes: one that keeps
    writing into the workspace is stopped with limit ``disk`` (and says so)."""
    ws = _workspace(tmp_path)
    writer = (
        'exec python3 -c "import time\n'
        "with open('grow.bin', 'wb') as f:\n"
        "    for _ in range(600):\n"
        '        f.write(bytes(256 * 1024)); f.flush(); time.sleep(0.01)"'
    )
    script = [
        _call("start_process", command=writer),
        _call("process_wait", process_id="proc-call-0-1", timeout_s=60),
        {"text": "done"},
    ]
    _, events = await _run(ws, script, ProcessLimits(disk_bytes=4 * 1024 * 1024))
    ended = {e.process_id: e for e in _bodies(events, ProcessEnded)}
    assert (ended["proc-call-0-1"].status, ended["proc-call-0-1"].reason) == ("limit", "disk")
    assert "ended: limit" in _responses(events)[1]
    assert (ws / "grow.bin").stat().st_size < 32 * 1024 * 1024  # stopped early, not at 150 MiB
