"""Decoding a verified read (``VerifiedRecords.decode``) without hashing its bytes again.

A verified read checks order and the chain over every stored byte; decoding its records
later (a checkpoint's tail, an event ``History`` reads on demand) validates them only.
These tests hold that path to a full read on random logs of every event kind, plain and
keyed, and hold a chained record that does not decode to the same error, with the same
offset, as a full read gives.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lodger.events as ev
from lodger.errors import CorruptLogError
from lodger.events import EventDraft, SessionStarted, chain_digest, keyed_chain_digest
from lodger.storage import EventLog, LogKey, MemoryLogStore, Record
from test_event_encoding import drafts

SESSION = "verified-1"
KEY = LogKey(bytes(range(32)))


@pytest.fixture
def digests_computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many event digests the decoder computes (``decode_event``'s chain check)."""
    count = [0]
    real = ev._digest

    def counting(*args: Any) -> str:
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(ev, "_digest", counting)
    return count


def _log(key: LogKey | None) -> EventLog:
    return EventLog(MemoryLogStore(), key=key)


async def _write(log: EventLog, batch: list[EventDraft]) -> None:
    start = EventDraft(id="ev-start", ts=1, body=SessionStarted(workspace="/w"))
    async with await log.open_writer(SESSION) as writer:
        await writer.append([start, *batch], expected_offset=0)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.lists(drafts, min_size=1, max_size=12),
    keyed=st.booleans(),
    data=st.data(),
)
def test_a_verified_read_decodes_like_a_full_read_without_hashing_again(
    digests_computed: list[int], batch: list[EventDraft], keyed: bool, data: st.DataObject
) -> None:
    async def check() -> None:
        log = _log(KEY if keyed else None)
        await _write(log, batch)
        full = await log.read_all(SESSION)
        verified = await log.read_verified(SESSION)
        start = data.draw(st.integers(0, len(full)), label="start")
        end = data.draw(st.integers(start, len(full)), label="end")
        digests_computed[0] = 0
        assert verified.decode(start, end) == full[start:end]
        assert verified.decode() == full
        assert digests_computed[0] == 0  # the read checked the chain over these bytes

    asyncio.run(check())


async def _store_chained(records: list[bytes], key: LogKey | None) -> EventLog:
    """A log holding ``records`` with a valid chain over them (and a matching head): what
    a writer this version cannot read leaves, or a forger of a plain chain."""
    store = MemoryLogStore()
    stored: list[Record] = []
    prev = ""
    for offset, data in enumerate(records):
        prev = chain_digest(prev, data) if key is None else keyed_chain_digest(key.mac, prev, data)
        stored.append(Record(offset, data, prev))
    await store.append_records(session_id=SESSION, records=stored, expected_offset=0)
    return EventLog(store, key=key)


def _sealed(count: int, key: LogKey | None) -> list[bytes]:
    log = _log(key)
    asyncio.run(
        _write(
            log,
            [
                EventDraft(id=f"e{i}", ts=i, body=ev.TurnStarted(input=f"t{i}"))
                for i in range(1, count)
            ],
        )
    )
    return [
        r.data for r in asyncio.run(log.store.read_records(session_id=SESSION, start=0, end=None))
    ]


DAMAGE = {
    "unknown_field": lambda d: d.replace(b'"body":{', b'"body":{"colour":"red",', 1),
    "offset_mismatch": lambda d: d.replace(b'"offset":5', b'"offset":6', 1),
    "session_mismatch": lambda d: d.replace(SESSION.encode(), b"verified-2", 1),
    "newer_schema": lambda d: d.replace(b'"v":%d' % ev.SCHEMA_VERSION, b'"v":99', 1),
    "trailing_byte": lambda d: d + b" ",
    "not_json": lambda d: d[:-1],
    "empty_object": lambda d: b"{}",
}


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_chained_record_that_does_not_decode_fails_as_a_full_read_does(
    damage: str, keyed: bool
) -> None:
    key = KEY if keyed else None
    records = _sealed(9, key)
    changed = DAMAGE[damage](records[5])
    assert changed != records[5]
    records[5] = changed

    async def check() -> None:
        log = await _store_chained(records, key)
        verified = await log.read_verified(SESSION)  # the chain over the bytes holds
        with pytest.raises(CorruptLogError) as full:
            await log.read_all(SESSION)
        for start, end in ((0, None), (3, 7), (5, 6)):
            with pytest.raises(CorruptLogError) as lazy:
                verified.decode(start, end)
            assert (lazy.value.code, lazy.value.offset) == (full.value.code, full.value.offset)
            assert lazy.value.offset == 5
            assert str(lazy.value) == str(full.value)
        assert verified.decode(0, 5) == (await log.read(SESSION, end=5))
        assert verified.decode(6) == (await log.read(SESSION, start=6))

    asyncio.run(check())


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_full_read_names_the_first_bad_record_when_the_chain_breaks_after_it(
    damage: str, keyed: bool
) -> None:
    """A full read checks the chain over every byte before it decodes: a record that
    does not decode (its digest holds) before a record whose digest does not is still
    the error, with its offset, as when each record was decoded and hashed in turn."""
    key = KEY if keyed else None
    records = _sealed(9, key)
    records[5] = DAMAGE[damage](records[5])

    async def check() -> None:
        log = await _store_chained(records, key)
        stored = await log.store.read_records(session_id=SESSION, start=0, end=None)
        broken = [*stored[:7], Record(7, stored[7].data + b" ", stored[7].digest), stored[8]]
        store = MemoryLogStore()
        await store.append_records(session_id=SESSION, records=broken, expected_offset=0)
        damaged = EventLog(store, key=key)
        with pytest.raises(CorruptLogError) as first:
            await damaged.read_all(SESSION)
        assert first.value.offset == 5 and first.value.code != "digest_mismatch"
        with pytest.raises(CorruptLogError) as later:  # from offset 6: the broken digest
            await damaged.read(SESSION, start=6)
        assert (later.value.offset, later.value.code) == (7, "digest_mismatch")

    asyncio.run(check())
