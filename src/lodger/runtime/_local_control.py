"""Control requests between processes on one machine, through the state directory.

A session has one writer: a cancel or a permission-mode switch for a turn that another
process runs (``lodger run`` in another terminal, a host) must be committed by that
process. No host is needed for that: the process running a turn of session ``S`` writes
``<state>/running/S.json`` (its process record, ``lodger.storage._liveness``, and a
fresh token) while the turn runs, and watches ``<state>/requests/S/`` for files named
after that token, every ``POLL_S`` seconds, between steps and while tools run. A sender
reads the record, checks that its process is alive, writes its request there (atomically:
a temporary file renamed) and waits for the runner's reply (``replies/<request>``: what
the runner did with it, as JSON), which the runner writes once it has handled it.

A request addressed to a token nobody runs any more (the runner ended, or was killed) is
never taken: the sender then removes it and answers that nothing runs, and a later run
has another token, so a stale request can never stop it. The state directory is hidden
from tools, so a tool cannot forge a request. Signals were the other way (the pid is in
the record): a file carries who asked and why, and works the same for every process
that runs turns, a host included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from lodger.errors import LodgerError
from lodger.storage._liveness import alive, this_process

__all__ = ["POLL_S", "Runner", "announced", "runner_of", "send_request"]

#: how often a running turn looks for requests (seconds)
POLL_S = 0.1

#: a request taken from the directory -> the reply (the runner's own code)
Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _running_path(state_dir: Path, session_id: str) -> Path:
    return state_dir / "running" / f"{session_id}.json"


def _requests_dir(state_dir: Path, session_id: str) -> Path:
    return state_dir / "requests" / session_id


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    """``path`` holds ``data`` whole or not at all, for any reader. Written to a fresh
    file renamed onto a name that is normally absent: truncating or renaming over an
    existing file makes ext4 flush it first (``auto_da_alloc``: 2 ms against 0.05 ms)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else None
    return None


class Runner:
    """The process running a turn of a session, as its record says."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.token = str(record.get("token", ""))

    @property
    def pid(self) -> int | None:
        pid = self.record.get("pid")
        return pid if isinstance(pid, int) else None


def runner_of(state_dir: Path, session_id: str) -> Runner | None:
    """The live process running a turn of the session here (None: none is; a record a
    dead process left is ignored)."""
    record = _read(_running_path(state_dir, session_id))
    if record is None or not record.get("token") or alive(record) is not True:
        return None
    return Runner(record)


def send_request(
    state_dir: Path, session_id: str, body: dict[str, Any], *, wait_s: float = 10.0
) -> dict[str, Any] | None:
    """Hand ``body`` to the process running the session's turn and wait for its reply;
    None when nothing runs, or the runner ended (or did not answer within ``wait_s``)
    before it took the request. Blocking: call it in a thread."""
    runner = runner_of(state_dir, session_id)
    if runner is None:
        return None
    name = f"{runner.token}-{time.time_ns()}-{secrets.token_hex(3)}.json"
    where = _requests_dir(state_dir, session_id)
    path, reply = where / name, where / "replies" / name
    _write_atomically(path, body)
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            answer = _read(reply)
            if answer is not None:
                return answer
            if path.exists():
                now = runner_of(state_dir, session_id)
                if now is None or now.token != runner.token:
                    break  # the runner ended before it took it
            time.sleep(POLL_S / 2)
        return _read(reply)
    finally:
        for leftover in (path, reply):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _take(state_dir: Path, session_id: str, token: str) -> list[tuple[str, dict[str, Any]]]:
    """The requests addressed to ``token`` (name, body), oldest first, removed from the
    directory."""
    where = _requests_dir(state_dir, session_id)
    try:
        names = sorted(n for n in os.listdir(where) if n.startswith(f"{token}-"))
    except OSError:
        return []
    taken: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        path = where / name
        body = _read(path)
        with contextlib.suppress(OSError):
            path.unlink()
        if body is not None:
            taken.append((name, body))
    return taken


def _reply(state_dir: Path, session_id: str, name: str, answer: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the sender gave up and went: nobody reads it
        _write_atomically(_requests_dir(state_dir, session_id) / "replies" / name, answer)


async def _watch(state_dir: Path, session_id: str, token: str, handle: Handler) -> None:
    while True:
        # a look every POLL_S, the first after POLL_S: a turn shorter than that costs
        # no look (a request sent to it finds the runner gone: nothing ran any more)
        await asyncio.sleep(POLL_S)
        for name, body in await asyncio.to_thread(_take, state_dir, session_id, token):
            try:
                answer = await handle(body)
            except LodgerError as exc:  # e.g. a refused mode; the turn goes on
                answer = {"error": exc.to_dict()}
            await asyncio.to_thread(_reply, state_dir, session_id, name, answer)


def _announce(state_dir: Path, session_id: str, token: str) -> bool:
    with contextlib.suppress(OSError):  # a read-only state dir: no requests, nothing more
        _write_atomically(_running_path(state_dir, session_id), {**this_process(), "token": token})
        return True
    return False


def _withdraw(state_dir: Path, session_id: str, token: str) -> None:
    path = _running_path(state_dir, session_id)
    record = _read(path)
    if record is not None and record.get("token") == token:
        with contextlib.suppress(OSError):
            path.unlink()
    # a request that arrived too late for this turn is left to its sender, who removes it
    # once it sees the runner gone; no later run reads it (it has another token)


@contextlib.asynccontextmanager
async def announced(
    state_dir: Path, session_id: str, handler: Callable[[str], Handler]
) -> AsyncIterator[None]:
    """While the block runs a turn of the session: its record is in ``running/`` and
    requests sent to it are given to ``handler(token)`` (in a task this block owns)."""
    token = secrets.token_hex(8)
    handle = handler(token)
    if not await asyncio.to_thread(_announce, state_dir, session_id, token):
        yield
        return
    watcher = asyncio.ensure_future(_watch(state_dir, session_id, token, handle))
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await asyncio.to_thread(_withdraw, state_dir, session_id, token)
