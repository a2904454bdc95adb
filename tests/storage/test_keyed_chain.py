"""The keyed digest chain (DESIGN L10): a forger without the key is told apart.

The attacker in these tests can write the state directory and run lodger's own code, but
does not hold the log key: they edit stored events and recompute the plain sha256 chain
(and the stored head) so that the log is self-consistent again.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lodger import Agent, ScriptedModel
from lodger.errors import ConfigError, CorruptLogError, LogKeyError, UsageError
from lodger.events import (
    EventDraft,
    SessionStarted,
    TurnStarted,
    chain_digest,
    keyed_chain_digest,
)
from lodger.storage import (
    EventLog,
    LogKey,
    MemoryArtifactStore,
    MemoryLogStore,
    Record,
    SqliteLogStore,
    Storage,
    log_key_from_env,
    open_log,
)
from lodger.storage.logkey import key_required_from_env
from lodger.testing.log_conformance import drafts

SECRET = bytes(range(100, 132))
KEY = LogKey(SECRET)
OTHER_KEY = LogKey(bytes(range(200, 232)))
SID = "keyed-1"
EVENTS = 8


def session_drafts(count: int = EVENTS) -> list[EventDraft]:
    start = EventDraft(id="ev-start", ts=1, body=SessionStarted(workspace="/w"))
    return [start, *drafts(1, count - 1)]


async def write(log: EventLog, session_id: str = SID, count: int = EVENTS) -> list[Record]:
    async with await log.open_writer(session_id) as writer:
        batch = session_drafts(count)
        await writer.append(batch[:3], expected_offset=0)
        await writer.append(batch[3:], expected_offset=3)
    return await log.store.read_records(session_id=session_id, start=0, end=None)


def forge(records: list[Record], offset: int, old: bytes, new: bytes) -> list[Record]:
    """Edit one event and recompute the plain chain from there on, as someone without the
    key would (they can run lodger's sha256 chain, but cannot compute the HMAC)."""
    out = list(records[:offset])
    prev = records[offset - 1].digest if offset else ""
    for record in records[offset:]:
        data = record.data
        if record.offset == offset:
            assert old in data
            data = data.replace(old, new, 1)
        digest = chain_digest(prev, data)
        out.append(Record(record.offset, data, digest))
        prev = digest
    return out


async def install(store: SqliteLogStore | MemoryLogStore, records: list[Record]) -> None:
    """Write forged records through the store's own API, so the stored head matches."""
    await store.append_records(session_id=SID, records=records, expected_offset=0)


# ---------------------------------------------------------------- writing


async def test_a_keyed_log_starts_keyed_sessions_and_records_the_chain(tmp_path: Path) -> None:
    log = EventLog(SqliteLogStore(tmp_path / "state"), key=KEY)
    records = await write(log)
    first = json.loads(records[0].data)["body"]
    assert (first["chain"], first["key_id"]) == ("hmac-sha256", KEY.key_id)
    prev = ""
    for record in records:  # every digest is the keyed one, none is plain
        assert record.digest == keyed_chain_digest(KEY.mac, prev, record.data)
        assert record.digest != chain_digest(prev, record.data)
        prev = record.digest
    await log.close()

    reopened = EventLog(SqliteLogStore(tmp_path / "state"), key=KEY)
    events = await reopened.read_all(SID)
    assert len(events) == EVENTS
    assert isinstance(events[0].body, SessionStarted)
    assert events[0].body.chain == "hmac-sha256"
    chain = await reopened.chain(SID)
    assert (chain.kind, chain.key_id, chain.keyed) == ("hmac-sha256", KEY.key_id, True)
    await reopened.close()


async def test_a_plain_log_records_a_plain_chain() -> None:
    log = EventLog(MemoryLogStore())
    records = await write(log)
    first = json.loads(records[0].data)["body"]
    assert (first["chain"], first["key_id"]) == ("sha256", None)
    assert records[1].digest == chain_digest(records[0].digest, records[1].data)
    assert (await log.chain(SID)).keyed is False


async def test_a_keyed_session_must_start_with_session_started() -> None:
    log = EventLog(MemoryLogStore(), key=KEY)
    async with await log.open_writer(SID) as writer:
        with pytest.raises(UsageError) as info:
            await writer.append(drafts(0, 2), expected_offset=0)
    assert info.value.code == "keyed_session_needs_start"
    assert "session_started" in info.value.message
    assert await log.store.read_records(session_id=SID, start=0, end=None) == []


async def test_a_key_does_not_change_an_existing_plain_session() -> None:
    store = MemoryLogStore()
    await write(EventLog(store), count=3)
    keyed = EventLog(store, key=KEY)
    async with await keyed.open_writer(SID) as writer:
        await writer.append(drafts(3, 2), expected_offset=3)
    records = await store.read_records(session_id=SID, start=0, end=None)
    assert records[4].digest == chain_digest(records[3].digest, records[4].data)
    assert len(await EventLog(store).read_all(SID)) == 5  # still readable without a key
    assert (await keyed.chain(SID)).kind == "sha256"


async def test_a_required_key_needs_a_key() -> None:
    with pytest.raises(UsageError) as info:
        EventLog(MemoryLogStore(), require_key=True)
    assert info.value.code == "key_required"
    assert "LODGER_LOG_KEY" in (info.value.hint or "")


# ---------------------------------------------------------------- forgery


async def test_a_plain_chain_cannot_tell_a_forgery_apart() -> None:
    """The limit the keyed chain exists for: a recomputed plain chain verifies."""
    original = await write(EventLog(MemoryLogStore()))
    store = MemoryLogStore()
    await install(store, forge(original, 3, b"content 3", b"content X"))
    events = await EventLog(store).read_all(SID)
    assert "content X" in events[3].model_dump_json()
    assert (await EventLog(store, key=KEY).chain(SID)).keyed is False


async def test_a_keyed_chain_names_the_forged_offset(tmp_path: Path) -> None:
    original = await write(EventLog(MemoryLogStore(), key=KEY))
    store = SqliteLogStore(tmp_path / "forged")
    await install(store, forge(original, 3, b"content 3", b"content X"))

    with pytest.raises(CorruptLogError) as info:
        await EventLog(store, key=KEY).verify(SID)
    err = info.value
    assert (err.code, err.session_id, err.offset) == ("forged", SID, 3)
    assert "forged at offset 3" in err.message
    assert "fork the session from offset 3" in (err.hint or "")
    # the prefix before the forgery still verifies with the key
    assert len(await EventLog(store, key=KEY).read(SID, end=3)) == 3

    # without the key a keyed session fails closed instead of verifying
    with pytest.raises(LogKeyError) as missing:
        await EventLog(store).verify(SID)
    assert (missing.value.code, missing.value.offset) == ("key_required", 0)
    assert missing.value.expected_key_id == KEY.key_id
    await store.close()


async def test_a_changed_byte_in_a_keyed_log_is_a_digest_mismatch() -> None:
    original = await write(EventLog(MemoryLogStore(), key=KEY))
    damaged = list(original)
    assert b"answer 5" in damaged[5].data
    damaged[5] = Record(5, damaged[5].data.replace(b"answer 5", b"answer 6"), damaged[5].digest)
    store = MemoryLogStore()
    await install(store, damaged)
    with pytest.raises(CorruptLogError) as info:
        await EventLog(store, key=KEY).read_all(SID)
    assert (info.value.code, info.value.offset) == ("digest_mismatch", 5)
    assert "keyed digest" in info.value.message


async def test_a_downgrade_to_a_plain_chain_reads_as_unkeyed_and_fails_when_required() -> None:
    original = await write(EventLog(MemoryLogStore(), key=KEY))
    old = b'"chain":"hmac-sha256","key_id":"%s"' % KEY.key_id.encode()
    store = MemoryLogStore()
    await install(store, forge(original, 0, old, b'"chain":"sha256","key_id":null'))

    lenient = EventLog(store, key=KEY)
    assert len(await lenient.read_all(SID)) == EVENTS
    chain = await lenient.chain(SID)
    assert (chain.kind, chain.key_id) == ("sha256", None)  # what `log verify` reports

    strict = EventLog(store, key=KEY, require_key=True)
    with pytest.raises(LogKeyError) as info:
        await strict.read_all(SID)
    assert (info.value.code, info.value.offset) == ("unkeyed_chain", 0)
    assert "not keyed" in info.value.message


async def test_the_wrong_key_is_named() -> None:
    store = MemoryLogStore()
    await write(EventLog(store, key=KEY))
    for read in (
        lambda log: log.read_all(SID),
        lambda log: log.read(SID, start=4),  # a later read checks offset 0 too
        lambda log: log.open_writer(SID),
    ):
        with pytest.raises(LogKeyError) as info:
            await read(EventLog(store, key=OTHER_KEY))
        err = info.value
        assert (err.code, err.offset) == ("wrong_key", 0)
        assert (err.expected_key_id, err.configured_key_id) == (KEY.key_id, OTHER_KEY.key_id)
        assert KEY.key_id in err.message and OTHER_KEY.key_id in err.message
        assert err.to_dict()["expected_key_id"] == KEY.key_id


async def test_a_later_read_of_a_keyed_session_checks_offset_zero() -> None:
    store = MemoryLogStore()
    written = await write(EventLog(store, key=KEY))
    later = await EventLog(store, key=KEY).read(SID, start=4)
    assert [e.digest for e in later] == [r.digest for r in written[4:]]
    with pytest.raises(LogKeyError) as info:
        await EventLog(store).read(SID, start=4)
    assert info.value.code == "key_required"
    # a forged offset 0 is caught by a later read as well
    forged = MemoryLogStore()
    await install(forged, forge(written, 0, b'"/w"', b'"/x"'))
    with pytest.raises(CorruptLogError) as forged_info:
        await EventLog(forged, key=KEY).read(SID, start=4)
    assert (forged_info.value.code, forged_info.value.offset) == ("forged", 0)


def _keyed_records() -> list[Record]:
    async def build() -> list[Record]:
        return await write(EventLog(MemoryLogStore(), key=KEY))

    return asyncio.run(build())


KEYED_RECORDS = _keyed_records()


@pytest.mark.slow
@settings(max_examples=300)
@given(st.data())
def test_any_single_byte_corruption_of_a_keyed_log_is_detected(data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(KEYED_RECORDS) - 1))
    target = KEYED_RECORDS[index]
    in_digest = data.draw(st.booleans())
    raw = target.digest.encode("latin-1") if in_digest else target.data
    position = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    byte = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != raw[position]))
    changed = raw[:position] + bytes([byte]) + raw[position + 1 :]
    damaged = list(KEYED_RECORDS)
    damaged[index] = (
        Record(target.offset, target.data, changed.decode("latin-1"))
        if in_digest
        else Record(target.offset, changed, target.digest)
    )

    async def read() -> None:
        store = MemoryLogStore()  # its stored head follows the damaged records
        await store.append_records(session_id=SID, records=damaged, expected_offset=0)
        await EventLog(store, key=KEY).read_all(SID)

    with pytest.raises(CorruptLogError) as info:
        asyncio.run(read())
    assert info.value.session_id == SID
    assert info.value.offset is not None and info.value.offset <= index


# ---------------------------------------------------------------- the key itself


def test_a_key_reads_as_hex_base64_or_urlsafe_base64() -> None:
    import base64

    as_hex = LogKey.from_text(SECRET.hex().upper() + "\n")
    as_b64 = LogKey.from_text(base64.b64encode(SECRET).decode())
    as_url = LogKey.from_text(base64.urlsafe_b64encode(SECRET).decode())
    assert as_hex.key_id == as_b64.key_id == as_url.key_id == KEY.key_id
    assert len(KEY.key_id) == 16
    assert SECRET.hex() not in repr(KEY) and KEY.key_id in repr(KEY)


@pytest.mark.parametrize(
    ("text", "code"),
    [("not a key!", "invalid_log_key"), ("", "invalid_log_key"), ("00" * 15, "log_key_too_short")],
)
def test_a_bad_key_is_refused(text: str, code: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogKey.from_text(text, source="$LODGER_LOG_KEY")
    assert info.value.code == code
    assert "openssl rand -hex 32" in (info.value.hint or "")


def test_a_key_file_inside_the_state_directory_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    inside = state / "log.key"
    inside.write_text(SECRET.hex())
    outside = tmp_path / "keys" / "log.key"
    outside.parent.mkdir()
    outside.write_text(SECRET.hex())
    alias = tmp_path / "keys" / "alias.key"
    alias.symlink_to(inside)  # a path outside that leads inside is inside
    for path in (inside, alias, state / ".." / "state" / "log.key"):
        with pytest.raises(ConfigError) as info:
            log_key_from_env(state, {"LODGER_LOG_KEY_FILE": str(path)})
        assert info.value.code == "key_in_state_dir"
        assert "outside the state directory" in (info.value.hint or "")
    found = log_key_from_env(state, {"LODGER_LOG_KEY_FILE": str(outside)})
    assert found is not None and found.key_id == KEY.key_id
    assert found.path == outside.resolve()  # for the integrator to hide from tools


def test_the_environment_names_one_key_or_none(tmp_path: Path) -> None:
    assert log_key_from_env(tmp_path, {}) is None
    found = log_key_from_env(tmp_path, {"LODGER_LOG_KEY": SECRET.hex()})
    assert found is not None and found.key_id == KEY.key_id and found.path is None
    both = {"LODGER_LOG_KEY": SECRET.hex(), "LODGER_LOG_KEY_FILE": str(tmp_path / "k")}
    with pytest.raises(ConfigError) as info:
        log_key_from_env(tmp_path, both)
    assert info.value.code == "ambiguous_log_key"
    with pytest.raises(ConfigError) as missing:
        log_key_from_env(tmp_path / "state", {"LODGER_LOG_KEY_FILE": str(tmp_path / "nope")})
    assert missing.value.code == "key_file_missing"
    assert key_required_from_env({"LODGER_LOG_KEY_REQUIRED": "1"}) is True
    assert key_required_from_env({}) is False
    with pytest.raises(ConfigError):
        key_required_from_env({"LODGER_LOG_KEY_REQUIRED": "maybe"})


async def test_open_log_takes_the_key_from_the_environment(tmp_path: Path) -> None:
    env = {"LODGER_LOG_KEY": SECRET.hex(), "LODGER_LOG_KEY_REQUIRED": "1"}
    log = open_log(tmp_path / "state", environ=env)
    assert log.key is not None and log.key.key_id == KEY.key_id
    assert log.require_key is True
    await write(log)
    await log.close()
    without = open_log(os.fspath(tmp_path / "state"), environ={})
    with pytest.raises(LogKeyError):
        await without.read_all(SID)
    await without.close()


async def test_an_agent_writes_a_keyed_session(tmp_path: Path) -> None:
    """The runtime needs no change to key its sessions: the log stamps the chain."""
    log = EventLog(SqliteLogStore(tmp_path / "state"), key=KEY)
    agent = Agent(
        model=ScriptedModel([{"text": "done"}]),
        storage=Storage(log=log, artifacts=MemoryArtifactStore(), state_dir=tmp_path / "state"),
    )
    result = await agent.run("hello", session="agent-keyed")
    events = await log.read_all("agent-keyed")
    await log.close()
    assert result.status == "completed"
    assert isinstance(events[0].body, SessionStarted)
    assert (events[0].body.chain, events[0].body.key_id) == ("hmac-sha256", KEY.key_id)
    with pytest.raises(LogKeyError):
        await EventLog(SqliteLogStore(tmp_path / "state")).read_all("agent-keyed")


def test_turn_started_is_not_a_chain_declaration() -> None:
    # only session_started declares a chain; any other first event is a plain chain
    from lodger.events import claimed_chain

    forged = json.dumps(
        {"body": {"kind": "turn_started", "input": "x", "chain": "hmac-sha256"}}
    ).encode()
    assert claimed_chain(forged) == ("sha256", None)
    assert claimed_chain(b"\xff not json") == ("sha256", None)
    assert TurnStarted(input="x").kind == "turn_started"
