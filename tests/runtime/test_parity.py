"""Parity (DESIGN.md section 12): one scripted session gives the same facts through every
door: the library (``compose`` + ``Sessions``), ``lodger run``, the host (``lodger
serve``) and ``lodger send`` + ``lodger worker``, each on ``--state DIR`` and on ``--store
file://...``.

The session (``SCRIPT``) calls ``shell`` with ``rm victim.txt`` (refused by the
project's deny rule), ``shell`` with ``echo hi`` (sandboxed, allowed), ``shell`` with a
command that allocates past the project's ``[sandbox] memory_mb`` (T1 names only the
backend, ``actor:sandbox:bubblewrap``; the limit shows in the result: the allocation
fails), ``tiny__add`` of the project's MCP server (allowed by rule), ``launch`` (the
project's ask rule: it waits for approval), and ``settle`` (a queryable tool: an effect
counted outside every process, then a wait that is the crash point); then it answers.

Facts are compared normalized: without event ids, times, digests, offsets and paths
under the test's directory; run, turn, step and operation ids become ordinals (first
seen is 0), so the shape of the log is compared too. Everything else is kept: call
arguments, statuses, rejection reasons, permission decisions, T1 resources (the sandbox
backend), tool schemas (their digests), results. On ``--store`` each turn's end also
records its workspace snapshot, by design and on every door alike; the library's facts
on the two storages differ by exactly that.

Approvals: every door gets the user's "allow once", each through its own real channel:
the library program's approver, ``lodger run``'s prompt on its terminal (a pty, answered
``y``; ``--yes`` would record an allow by policy instead, and no question), the host's
HTTP API, and the control plane for a worker started with ``--approval-wait``.

The host and the worker run with ``--trust-projects``: without it the lodger.toml of a
workspace restored on them is untrusted (a sandboxed command may have written it), so it
starts no MCP server and adds no allow rule, by design. What holds even then is
``test_an_untrusted_project_on_a_worker_still_denies_and_starts_no_mcp_server``.

Kill and resume: each door is SIGKILLed inside ``settle`` (after its T1 and its effect)
and resumed through its own entry point: the library's ``Sessions.resume``, ``lodger
resume``, a new ``lodger serve`` over the same storage (a host adopts the turn its dead
process was running and resumes it, never retries it), a new ``lodger worker`` (it takes
the session once the dead one's lease expires). No effect runs twice and the log
verifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lodger.client import HostClient
from lodger.errors import ControlPlaneError
from lodger.events import Event
from lodger.runtime import StorageLocation
from lodger.storage.control import ApprovalRequest, ControlPlane, SessionRow, open_control
from lodger.storage.snapshots import restore_snapshot

from . import _library_door

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"
TOOLS = HERE / "_parity_tools.py"
MCP_SERVER = HERE / "_mcp_counted.py"
LIBRARY = HERE / "_library_door.py"
LODGER = [sys.executable, "-m", "lodger"]
TOKEN = "lgr_parity-test-admin-token-0123456789abcdef"
SID = "s-parity"
TASK = "tidy up, then launch"
ALLOCATE = "python3 -c 'x = b\"x\" * (256 << 20); print(len(x))'"

SCRIPT = [
    {"calls": [{"name": "shell", "args": {"command": "rm victim.txt"}}]},
    {"calls": [{"name": "shell", "args": {"command": "echo hi"}}]},
    {"calls": [{"name": "shell", "args": {"command": ALLOCATE}}]},
    {"calls": [{"name": "tiny__add", "args": {"a": 20, "b": 22}}]},
    {"calls": [{"name": "launch", "args": {"target": "rocket"}}]},
    {"calls": [{"name": "settle", "args": {"tag": "crash"}}]},
    {"text": "done"},
]

LODGER_TOML = """\
[permissions]
deny = ["shell(rm *)"]
ask = ["launch"]
allow = ["tiny__add"]

[sandbox]
memory_mb = 64

[mcp.servers.tiny]
command = {python}
args = [{server}, {starts}]
deferred = false
"""

DOORS = ("library", "cli", "host", "worker")
STORAGES = ("state", "store")

T = TypeVar("T")


# ---------------------------------------------------------------- one run's directory


@dataclass
class Scenario:
    """One run of the session: a project directory, the effects counted outside every
    lodger process, and where the session is kept (``--state`` or ``--store``)."""

    root: Path
    storage: str

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def effects(self) -> Path:
        return self.root / "effects"

    @property
    def model(self) -> str:
        return f"script:{self.root / 'script.json'}"

    @property
    def where(self) -> StorageLocation:
        if self.storage == "store":
            return StorageLocation(state=str(self.root / "state"), store=self.store)
        return StorageLocation(state=str(self.root / "state"))

    @property
    def store(self) -> str:
        return f"file://{self.root / 'objects'}"

    def flags(self) -> list[str]:
        """The storage flags every command of this run gets."""
        if self.storage == "store":
            return ["--store", self.store]
        return ["--state", str(self.root / "state")]

    @property
    def control(self) -> Path:
        """The workers' control plane: the state directory's own (no --control given),
        or a SQLite file named with --control next to the object store."""
        if self.storage == "store":
            return self.root / "control.sqlite3"
        return self.root / "state" / "control.sqlite3"

    def control_flags(self) -> list[str]:
        return ["--control", str(self.control)] if self.storage == "store" else []

    def lines(self, name: str) -> list[str]:
        path = self.effects / name
        return path.read_text().splitlines() if path.exists() else []

    def env(self) -> dict[str, str]:
        out = dict(os.environ)
        out["PYTHONPATH"] = f"{SRC}{os.pathsep}{out.get('PYTHONPATH', '')}"
        out["PARITY_DIR"] = str(self.effects)
        out["LODGER_HOST_TOKEN"] = TOKEN
        for name in ("LODGER_STORE", "LODGER_STATE", "LODGER_CONTROL", "LODGER_MODEL"):
            out.pop(name, None)
        return out

    def spawn(self, name: str, args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """A lodger process whose output goes to ``<name>.log`` (read by a failed test)."""
        with (self.root / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                [*LODGER, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                cwd=self.root, **kwargs,
            )  # fmt: skip

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def lodger(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*LODGER, *args], capture_output=True, text=True, env=self.env(), cwd=self.root,
            timeout=120, check=False,
        )  # fmt: skip

    def events(self) -> list[Event]:
        async def read() -> list[Event]:
            storage = self.where.open()
            try:
                return await storage.log.read_all(SID)
            finally:
                await storage.close()

        return asyncio.run(read())


def _scenario(root: Path, storage: str, *, kill: bool, script: list[Any] = SCRIPT) -> Scenario:
    scn = Scenario(root=root, storage=storage)
    scn.project.mkdir(parents=True)
    scn.effects.mkdir()
    (scn.project / "victim.txt").write_text("keep me\n")
    (scn.project / "lodger.toml").write_text(
        LODGER_TOML.format(
            python=json.dumps(sys.executable),
            server=json.dumps(str(MCP_SERVER)),
            starts=json.dumps(str(scn.effects / "mcp-starts")),
        )
    )
    (root / "script.json").write_text(json.dumps(script))
    if not kill:
        (scn.effects / "open").touch()  # settle goes straight through
    return scn


# ---------------------------------------------------------------- waiting, killing


def _wait_for(
    what: str, check: Callable[[], T | None], *, every: float = 0.05, timeout: float = 90.0
) -> T:
    """Poll ``check`` until it returns something (event-ordered: the bound is only a
    hang guard)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


async def _async_wait_for(what: str, check: Callable[[], Awaitable[T | None]]) -> T:
    try:
        async with asyncio.timeout(90):
            while not (found := await check()):  # noqa: ASYNC110 - over HTTP, files
                await asyncio.sleep(0.05)
            return found
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _alive(proc: subprocess.Popen[bytes], scn: Scenario, name: str) -> Callable[[], None]:
    def check() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}: {scn.log(name)}")

    return check


def _inside_settle(scn: Scenario) -> bool:
    """``settle`` applied its effect and waits: its T1 is committed (T1 comes first)."""
    return "settle crash" in scn.lines("effects")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(proc)


def _kill_inside_settle(scn: Scenario, proc: subprocess.Popen[bytes], name: str) -> None:
    alive = _alive(proc, scn, name)

    def inside() -> bool:
        alive()
        return _inside_settle(scn)

    _wait_for("the turn inside settle", inside)
    _kill(proc)
    (scn.effects / "open").touch()  # the resumed run's probe finds the effect


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---------------------------------------------------------------- the doors
# Each runs the session to its end (killing and resuming it when asked) and returns the
# directory that is the session's workspace afterwards.


def _library(scn: Scenario, kill: bool) -> Path:
    async def drive(command: str) -> str:
        result = await _library_door.drive(
            command, session=SID, task=TASK, workspace=scn.project, model=scn.model,
            where=scn.where,
        )  # fmt: skip
        return result.status

    if kill:  # the program runs as a child, to be SIGKILLed; it resumes here
        with (scn.root / "library.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(LIBRARY), "run", SID, TASK, str(scn.project), scn.model,
                 *scn.flags()],
                stdout=log, stderr=subprocess.STDOUT, env=scn.env(), cwd=scn.root,
            )  # fmt: skip
        _kill_inside_settle(scn, proc, "library")
    with _environ(PARITY_DIR=str(scn.effects)):
        assert asyncio.run(drive("resume" if kill else "run")) == "completed"
    return scn.project


def _cli(scn: Scenario, kill: bool) -> Path:
    # the user reads the project's lodger.toml and trusts it, as on any terminal
    trusted = scn.lodger("trust", str(scn.project))
    assert trusted.returncode == 0, trusted.stderr
    # stdin is a terminal (a pty): `lodger run` asks there, and the test answers "y"
    master, terminal = os.openpty()
    proc = scn.spawn(
        "cli",
        ["run", TASK, "--model", scn.model, "--workspace", str(scn.project),
         "--tools", str(TOOLS), "--session", SID, *scn.flags()],
        stdin=terminal,
    )  # fmt: skip
    os.close(terminal)
    try:
        alive = _alive(proc, scn, "cli")

        def asked() -> bool:
            alive()
            return "launch wants to run" in scn.log("cli")

        _wait_for("the approval prompt", asked)
        os.write(master, b"y\n")
        if kill:
            _kill_inside_settle(scn, proc, "cli")
            resumed = scn.lodger("resume", SID, "--tools", str(TOOLS), *scn.flags())
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr
            assert "turn completed" in resumed.stdout
        else:
            assert proc.wait(timeout=120) == 0, scn.log("cli")
    finally:
        os.close(master)
        if proc.poll() is None:
            _kill(proc)
    return scn.project


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(scn: Scenario, port: int, name: str) -> subprocess.Popen[bytes]:
    proc = scn.spawn(
        name,
        ["serve", "--port", str(port), "--model", scn.model, "--tools", str(TOOLS),
         "--workspaces", str(scn.root / "workspaces"), "--trust-projects",
         "--host-index", str(scn.root / "host.sqlite3"), "--poll", "0.1", *scn.flags()],
    )  # fmt: skip
    alive = _alive(proc, scn, name)

    async def up() -> bool:
        alive()
        return "lodger host on" in scn.log(name)

    await _async_wait_for("the host to listen", up)
    return proc


async def _host_run(scn: Scenario, kill: bool) -> Path:
    workspace = scn.root / "workspaces" / SID
    shutil.copytree(scn.project, workspace)  # the host works in <workspaces>/<session>
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = await _serve(scn, port, "host")
    try:
        async with HostClient(url, token=TOKEN) as client:
            assert await client.create_session(session_id=SID) == SID
            sent = await client.send(SID, TASK, key="parity")

            async def asked() -> list[dict[str, Any]]:
                return await client.approvals(SID)

            (pending,) = await _async_wait_for("the approval over HTTP", asked)
            assert (pending["call_id"], pending["tool"]) == ("call-4-1", "launch")
            assert (await client.answer(SID, "call-4-1", allow=True))["status"] == "allow"
        if kill:
            await asyncio.to_thread(_kill_inside_settle, scn, proc, "host")
            proc = await _serve(scn, port, "host-restarted")
        async with HostClient(url, token=TOKEN) as client:
            done = await client.wait_message(SID, sent["message"]["id"], within=90)
    finally:
        await asyncio.to_thread(_stop, proc)
    assert (done["status"], done["result"]["status"]) == ("done", "completed"), done
    assert done["kind"] == ("resume" if kill else "message")
    return workspace


def _host(scn: Scenario, kill: bool) -> Path:
    return asyncio.run(_host_run(scn, kill))


def _on_plane(dsn: Path, work: Callable[[ControlPlane], Awaitable[T]]) -> T | None:
    """``work`` on the control plane, or None while a worker holds the file's lock."""

    async def run() -> T:
        plane = open_control(str(dsn))
        try:
            await plane.start()
            return await work(plane)
        finally:
            await plane.close()

    try:
        return asyncio.run(run())
    except ControlPlaneError:
        return None


def _pending(dsn: Path) -> list[ApprovalRequest] | None:
    async def work(plane: ControlPlane) -> list[ApprovalRequest]:
        return await plane.list_approvals(session_id=SID)

    return _on_plane(dsn, work)


def _answered(dsn: Path, call_id: str) -> bool | None:
    async def work(plane: ControlPlane) -> bool:
        _, won = await plane.answer_approval(
            session_id=SID, call_id=call_id, allow=True, by="parity-test"
        )
        return won

    return _on_plane(dsn, work)


def _row(dsn: Path) -> SessionRow | None:
    async def work(plane: ControlPlane) -> SessionRow | None:
        return await plane.get_session(session_id=SID)

    return _on_plane(dsn, work)


def _start_worker(
    scn: Scenario, name: str, *extra: str, lease_ttl: float = 4.0
) -> subprocess.Popen[bytes]:
    """A worker. Its lease TTL is how long a session it dies holding stays locked; too
    short a one on a loaded machine misses a renewal and is fenced (a new run)."""
    return scn.spawn(
        name,
        ["worker", *scn.flags(), *scn.control_flags(), "--model", scn.model,
         "--tools", str(TOOLS), "--poll", "0.05", "--lease-ttl", str(lease_ttl),
         "--grace", "5", "--workdir", str(scn.root / "workdir"), *extra],
    )  # fmt: skip


def _completed(dsn: Path, procs: list[subprocess.Popen[bytes]]) -> SessionRow | None:
    for proc in procs:
        if proc.poll() is not None:
            raise AssertionError(f"a worker exited {proc.returncode}")
    row = _row(dsn)
    return row if row is not None and row.status == "completed" else None


def _restored(scn: Scenario, row: SessionRow) -> Path:
    """The workspace the worker left: its last snapshot, restored for the test to read."""
    into = scn.root / "restored"
    assert row.snapshot is not None

    async def restore() -> None:
        storage = scn.where.open()
        try:
            await restore_snapshot(row.snapshot or "", storage.artifacts, into)
        finally:
            await storage.close()

    asyncio.run(restore())
    return into


def _send(scn: Scenario) -> None:
    sent = scn.lodger(
        "send", SID, TASK, "--workspace", str(scn.project), *scn.flags(), *scn.control_flags(),
        "--json",
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["duplicate"] is False


def _worker(scn: Scenario, kill: bool) -> Path:
    (scn.root / "workdir").mkdir()
    _send(scn)
    flags = ("--trust-projects", "--approval-wait", "90")
    procs = [_start_worker(scn, "worker", *flags)]
    try:
        alive = _alive(procs[0], scn, "worker")

        def asked() -> list[ApprovalRequest] | None:
            alive()
            return _pending(scn.control)

        # polled gently: the SQLite control plane is one file the worker writes too
        (pending,) = _wait_for("the approval in the control plane", asked, every=0.2)
        assert (pending.call_id, pending.tool) == ("call-4-1", "launch")
        _wait_for("the answer recorded", lambda: _answered(scn.control, "call-4-1"), every=0.2)
        if kill:
            _kill_inside_settle(scn, procs[0], "worker")
            # it takes the session once the dead worker's lease (4 s) has expired
            procs = [_start_worker(scn, "worker-2", *flags, lease_ttl=15)]
        row = _wait_for("the session completed", lambda: _completed(scn.control, procs), every=0.2)
    finally:
        for proc in procs:
            _stop(proc)
    return _restored(scn, row)


DRIVE: dict[str, Callable[[Scenario, bool], Path]] = {
    "library": _library,
    "cli": _cli,
    "host": _host,
    "worker": _worker,
}


# ---------------------------------------------------------------- the facts


def _without_root(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace(root, "ROOT")
    if isinstance(value, list):
        return [_without_root(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _without_root(v, root) for k, v in value.items()}
    return value


#: body fields that name where, not what: the workspace path and identity differ by door
#: (a worker restores the workspace into a fresh directory at every wake, so its resume
#: records the move in run_started), and a snapshot's ref and size hash lodger.toml,
#: which names the test's paths
_DROPPED = {
    "session_started": ("workspace", "workspace_id"),
    "run_started": ("workspace", "workspace_id"),
    "workspace_snapshot": ("ref", "size"),
}


def normalized(events: list[Event], root: Path) -> list[dict[str, Any]]:
    """The facts without ids, times, digests, offsets and the test's paths; run, turn,
    step and operation ids as ordinals (first seen is 0)."""
    seen: dict[str, dict[str, int]] = {}

    def ordinal(space: str, value: str | None) -> int | None:
        if value is None:
            return None
        known = seen.setdefault(space, {})
        return known.setdefault(value, len(known))

    out = []
    for event in events:
        body = event.body.model_dump(mode="json")
        for key in _DROPPED.get(body["kind"], ()):
            body.pop(key)
        for key in ("operation_id", "retry_of"):
            if key in body:
                body[key] = ordinal("operation", body[key])
        if "parent_run_id" in body:
            body["parent_run_id"] = ordinal("run", body["parent_run_id"])
        if body.get("resumed_from"):
            body["resumed_from"] = body["resumed_from"]["high_water"]
        out.append(
            {
                "turn": ordinal("turn", event.turn_id),
                "run": ordinal("run", event.run_id),
                "step": ordinal("step", event.step_id),
                "call_id": event.call_id,
                "parent_call_id": event.parent_call_id,
                "origin": event.origin,
                "visibility": event.visibility,
                "body": _without_root(body, str(root)),
            }
        )
    return out


def _of(events: list[Event], kind: str, call_id: str | None = None) -> list[dict[str, Any]]:
    return [
        e.body.model_dump(mode="json")
        for e in events
        if e.kind == kind and (call_id is None or e.call_id == call_id)
    ]


def _check_the_story(scn: Scenario, events: list[Event], workspace: Path, *, killed: bool) -> None:
    """What the session must show on any door, read off its raw facts."""
    rm = "call-0-1"
    assert [(d["decision"], d["by"]) for d in _of(events, "permission_decided", rm)] == [
        ("deny", "policy")
    ]
    assert [r["reason"] for r in _of(events, "call_rejected", rm)] == ["denied"]
    assert not _of(events, "tool_dispatched", rm)
    assert (workspace / "victim.txt").read_text() == "keep me\n"  # nothing removed it
    for call in ("call-1-1", "call-2-1"):  # sandboxed: T1 names the backend
        (t1,) = _of(events, "tool_dispatched", call)
        assert "actor:sandbox:bubblewrap" in t1["resources"]
        assert not _of(events, "permission_decided", call)  # confined: allowed by default
    assert [r["content"] for r in _of(events, "tool_responded", "call-1-1")] == [
        "hi\n[exit code 0]"
    ]
    (allocated,) = _of(events, "tool_responded", "call-2-1")
    assert "268435456" not in allocated["content"]  # memory_mb = 64 held: it never got 256 MiB
    assert [(d["decision"], d["by"], d["reason"]) for d in _of(
        events, "permission_decided", "call-3-1"
    )] == [("allow", "policy", "rule 'tiny__add'")]  # fmt: skip
    assert [(r["status"], r["content"]) for r in _of(events, "tool_responded", "call-3-1")] == [
        ("ok", "42")
    ]
    assert [p["tool"] for p in _of(events, "permission_requested", "call-4-1")] == ["launch"]
    assert [(d["decision"], d["by"]) for d in _of(events, "permission_decided", "call-4-1")] == [
        ("allow", "user")
    ]
    assert [r["content"] for r in _of(events, "tool_responded", "call-4-1")] == ["launched rocket"]
    if not killed:  # else the resumed run's probe found its result (_check_the_recovery)
        assert [r["content"] for r in _of(events, "tool_responded", "call-5-1")] == [
            "settled crash"
        ]
    ended = _of(events, "turn_ended")
    assert [(t["status"], t["answer"]) for t in ended] == [("completed", "done")]
    # each effect once, outside every process; the MCP server started by this run
    assert scn.lines("effects") == ["launch rocket", "settle crash"]
    assert [line.split()[0] for line in scn.lines("invocations")] == ["launch", "settle"]
    assert scn.lines("mcp-starts")


def _check_the_recovery(scn: Scenario, events: list[Event]) -> None:
    """A turn SIGKILLed inside settle and resumed: a second run, linked to the first,
    whose probe found settle's effect, so settle was never dispatched again."""
    runs = [e for e in events if e.kind == "run_started"]
    assert len(runs) == 2
    assert runs[1].body.parent_run_id == runs[0].run_id  # type: ignore[union-attr]
    assert len(_of(events, "turn_started")) == 1
    assert len(_of(events, "tool_dispatched", "call-5-1")) == 1
    assert not _of(events, "tool_responded", "call-5-1")
    observed = _of(events, "recovery_observed", "call-5-1")
    assert [(o["status"], o["reason"], o["observation"]) for o in observed] == [
        ("completed", "probe_applied", "settled crash")
    ]
    assert len(scn.lines("mcp-starts")) == 2  # the dead process's server, the resumer's
    verified = scn.lodger("log", "verify", SID, *scn.flags(), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _check_the_storage(events: list[Event], storage: str) -> None:
    """Each turn's end records its workspace snapshot (in the append of run_ended and
    turn_ended): on an object store so that a worker elsewhere can wake the session, in a
    state directory so that a rewind can restore its files. Whichever door ran the turn,
    on either storage."""
    kinds = [e.kind for e in events]
    del storage
    assert kinds.count("workspace_snapshot") == 1
    assert kinds[-3:] == ["workspace_snapshot", "run_ended", "turn_ended"]
    assert [s["files"] for s in _of(events, "workspace_snapshot")] == [2]  # victim, toml


# ---------------------------------------------------------------- the tests


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    events: list[Event]
    facts: list[dict[str, Any]]
    workspace: Path


def _drive(root: Path, door: str, storage: str, *, kill: bool) -> Outcome:
    scn = _scenario(root, storage, kill=kill)
    workspace = DRIVE[door](scn, kill)
    events = scn.events()
    return Outcome(scn, events, normalized(events, scn.root), workspace)


Library = Callable[[str, bool], Outcome]


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Library:
    """``(storage, kill) -> Outcome`` of the library door, each run once: every door is
    compared with it on the same storage."""
    made: dict[tuple[str, bool], Outcome] = {}

    def outcome(storage: str, kill: bool) -> Outcome:
        if (storage, kill) not in made:
            root = tmp_path_factory.mktemp(f"library-{storage}-{'killed' if kill else 'whole'}")
            made[storage, kill] = _drive(root, "library", storage, kill=kill)
        return made[storage, kill]

    return outcome


#: who answers a person's approval at each door (``permission_decided.who``): the library
#: program's approver answers bare, the CLI names its user, the host the token's public
#: id, the worker the control plane's ``answered_by``
ANSWERER: dict[str, Callable[[str | None], bool]] = {
    "library": lambda who: who is None,
    "cli": lambda who: who is not None and who.startswith("cli:"),
    "host": lambda who: who is not None and who.startswith("token:tok_"),
    "worker": lambda who: who == "parity-test",
}


def _without_answerers(door: str, facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The facts with the answerer of each person's decision checked for ``door`` and
    left out: the one field that differs between doors by design."""
    out = []
    for fact in facts:
        body = fact["body"]
        if body["kind"] == "permission_decided" and body["by"] == "user":
            assert ANSWERER[door](body["who"]), (door, body)
            fact = {**fact, "body": {**body, "who": None}}
        out.append(fact)
    return out


def _compare(door: str, storage: str, got: Outcome, library: Library, *, kill: bool) -> None:
    facts = _without_answerers(door, got.facts)
    answered = [f for f in got.facts if f["body"].get("by") == "user"]
    assert answered, "a person answered an approval at every door"
    if door != "library":
        assert facts == library(storage, kill).facts
    elif storage == "store":  # both storages snapshot the workspace: the same facts
        assert facts == library("state", kill).facts


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("door", DOORS)
def test_every_door_gives_the_same_facts(
    door: str, storage: str, tmp_path: Path, library: Library
) -> None:
    got = library(storage, False) if door == "library" else _drive(
        tmp_path, door, storage, kill=False
    )  # fmt: skip
    _check_the_story(got.scenario, got.events, got.workspace, killed=False)
    _check_the_storage(got.events, storage)
    assert len(got.scenario.lines("mcp-starts")) == 1
    _compare(door, storage, got, library, kill=False)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("door", DOORS)
def test_every_door_resumes_a_killed_turn_with_the_same_facts(
    door: str, storage: str, tmp_path: Path, library: Library
) -> None:
    got = library(storage, True) if door == "library" else _drive(
        tmp_path, door, storage, kill=True
    )  # fmt: skip
    _check_the_story(got.scenario, got.events, got.workspace, killed=True)
    _check_the_recovery(got.scenario, got.events)
    _check_the_storage(got.events, storage)
    _compare(door, storage, got, library, kill=True)


def test_an_untrusted_project_on_a_worker_still_denies_and_starts_no_mcp_server(
    tmp_path: Path,
) -> None:
    """The issue's repro: a worker without --trust-projects restores the session's
    workspace and applies its deny rule (``rm victim.txt`` is refused, the file stays)
    and its sandbox limit, but starts none of its MCP servers: their tools are unknown."""
    script = [
        {"calls": [{"name": "shell", "args": {"command": "rm victim.txt"}}]},
        {"calls": [{"name": "shell", "args": {"command": ALLOCATE}}]},
        {"calls": [{"name": "tiny__add", "args": {"a": 20, "b": 22}}]},
        {"text": "done"},
    ]
    scn = _scenario(tmp_path, "state", kill=False, script=script)
    (scn.root / "workdir").mkdir()
    _send(scn)
    procs = [_start_worker(scn, "worker")]
    try:
        row = _wait_for("the session completed", lambda: _completed(scn.control, procs), every=0.2)
    finally:
        _stop(procs[0])
    events = scn.events()
    assert [(d["decision"], d["by"]) for d in _of(events, "permission_decided", "call-0-1")] == [
        ("deny", "policy")
    ]
    assert [r["reason"] for r in _of(events, "call_rejected", "call-0-1")] == ["denied"]
    assert not _of(events, "tool_dispatched", "call-0-1")
    assert (_restored(scn, row) / "victim.txt").read_text() == "keep me\n"
    (allocated,) = _of(events, "tool_responded", "call-1-1")
    assert "268435456" not in allocated["content"]  # a lower limit narrows: it applies
    assert not scn.lines("mcp-starts")  # no MCP server process ever started
    assert all("tiny__add" not in s["tools"] for s in _of(events, "run_started"))
    assert [r["tool"] for r in _of(events, "call_rejected", "call-2-1")] == ["tiny__add"]
    assert "ignored: 1 allow rule(s); 1 MCP server(s)" in scn.log("worker")
