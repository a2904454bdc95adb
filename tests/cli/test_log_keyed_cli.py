"""``lodger log verify`` with a log key: keyed and unkeyed chains, forgeries, key setup.

The state directory holds the plain demo sessions (``state_dir``) plus ``s-keyed``, written
with the key through the real SQLite log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lodger.cli import main
from lodger.events import EventDraft, chain_digest
from lodger.storage import EventLog, LogKey, SqliteLogStore

SECRET_HEX = "5e" * 32
KEY = LogKey(bytes.fromhex(SECRET_HEX))
KEYED = "s-keyed"
DEMO = "s-demo"


@pytest.fixture
def keyed_state(state_dir: Path, demo_drafts: list[EventDraft]) -> Path:
    async def write() -> None:
        log = EventLog(SqliteLogStore(state_dir), key=KEY)
        try:
            async with await log.open_writer(KEYED) as writer:
                await writer.append(demo_drafts, expected_offset=0)
        finally:
            await log.close()

    asyncio.run(write())
    return state_dir


def run(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    base: dict[str, str | None] = {"COLUMNS": "200", "NO_COLOR": "1", "LODGER_STATE": None}
    runner = CliRunner(env={**base, **(env or {})})
    return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)


WITH_KEY = {"LODGER_LOG_KEY": SECRET_HEX}


def forge(state: Path, session_id: str, offset: int, old: bytes, new: bytes) -> None:
    """Edit one event and recompute the plain digests after it, straight in SQLite."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn, conn:
        rows = conn.execute(
            'SELECT "offset", data, digest FROM events WHERE session_id = ? ORDER BY "offset"',
            (session_id,),
        ).fetchall()
        prev = rows[offset - 1][2] if offset else ""
        for at, data, _ in rows[offset:]:
            data = bytes(data)
            if at == offset:
                assert old in data
                data = data.replace(old, new, 1)
            prev = chain_digest(prev, data)
            conn.execute(
                'UPDATE events SET data = ?, digest = ? WHERE session_id = ? AND "offset" = ?',
                (data, prev, session_id, at),
            )


def test_verify_names_a_keyed_chain_and_its_key(keyed_state: Path) -> None:
    result = run("log", "verify", KEYED, "--state", keyed_state, env=WITH_KEY)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == (
        f"chain: hmac-sha256 key {KEY.key_id} (verified with the configured key)"
    )
    assert result.stderr == ""
    report = json.loads(
        run("log", "verify", KEYED, "--state", keyed_state, "--json", env=WITH_KEY).stdout
    )
    assert (report["ok"], report["chain"], report["key_id"]) == (True, "hmac-sha256", KEY.key_id)
    strict = run("log", "verify", KEYED, "--state", keyed_state, "--require-key", env=WITH_KEY)
    assert strict.exit_code == 0


def test_a_keyed_session_without_the_key_fails_closed(keyed_state: Path) -> None:
    result = run("log", "verify", KEYED, "--state", keyed_state)
    assert result.exit_code == 1
    error, hint = result.stderr.splitlines()
    assert error == (
        f"error: log for session 's-keyed' is keyed (hmac-sha256, key {KEY.key_id}) and no "
        "log key is configured"
    )
    assert "LODGER_LOG_KEY" in hint
    wrong = run("log", "verify", KEYED, "--state", keyed_state, "--json",
                env={"LODGER_LOG_KEY": "77" * 32})  # fmt: skip
    assert wrong.exit_code == 1
    error_json = json.loads(wrong.stdout)["error"]
    assert (error_json["code"], error_json["offset"]) == ("wrong_key", 0)
    assert error_json["expected_key_id"] == KEY.key_id
    # `sessions` lists it as unverified, not corrupt, and keeps listing the others
    listed = run("sessions", "--state", keyed_state)
    assert listed.exit_code == 0
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows[KEYED][3] == "unverified"
    assert rows[DEMO][3] == "completed"


def test_a_plain_session_reads_with_a_key_and_says_it_is_unkeyed(keyed_state: Path) -> None:
    plain = run("log", "verify", DEMO, "--state", keyed_state)
    assert plain.stdout.splitlines()[1].startswith("chain: sha256 (unkeyed)")

    result = run("log", "verify", DEMO, "--state", keyed_state, env=WITH_KEY)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1] == (
        f"chain: sha256 (unkeyed): a log key ({KEY.key_id}) is configured, but this session "
        "was not written with it"
    )
    assert "--require-key" in result.stderr

    for strict_args, env in (
        (("--require-key",), WITH_KEY),
        ((), {**WITH_KEY, "LODGER_LOG_KEY_REQUIRED": "1"}),
    ):
        strict = run("log", "verify", DEMO, "--state", keyed_state, *strict_args, env=env)
        assert strict.exit_code == 1
        assert strict.stderr.startswith(
            "error: log for session 's-demo' is not keyed (its chain is plain sha256)"
        )


def test_verify_names_the_offset_of_a_forgery(keyed_state: Path) -> None:
    forge(keyed_state, KEYED, 7, b"bravo contents", b"bravo CONTENTS")
    result = run("log", "verify", KEYED, "--state", keyed_state, "--json", env=WITH_KEY)
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert (error["code"], error["offset"], error["session_id"]) == ("forged", 7, KEYED)
    text = run("log", "verify", KEYED, "--state", keyed_state, env=WITH_KEY)
    assert text.stderr.startswith("error: log for session 's-keyed' is forged at offset 7:")


def test_a_key_file_in_the_state_directory_is_refused(keyed_state: Path) -> None:
    inside = keyed_state / "log.key"
    inside.write_text(SECRET_HEX)
    result = run("log", "verify", KEYED, "--state", keyed_state,
                 env={"LODGER_LOG_KEY_FILE": str(inside)})  # fmt: skip
    assert result.exit_code == 2
    error, hint = result.stderr.splitlines()
    assert error.startswith("error: the log key file")
    assert "is inside the state directory" in error
    assert hint.startswith("hint: a key beside the log it protects proves nothing")

    outside = keyed_state.parent / "log.key"
    outside.write_text(SECRET_HEX)
    ok = run("log", "verify", KEYED, "--state", keyed_state,
             env={"LODGER_LOG_KEY_FILE": str(outside)})  # fmt: skip
    assert ok.exit_code == 0, ok.output
