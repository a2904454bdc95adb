"""Fold checkpoints on object storage (``ObjectCheckpoints``), on a local directory and on
the S3-compatible server: they pass the checkpoint store conformance check; a long
session opened once writes one (an object under ``sessions/<id>/checkpoint/``) and the
next open, from another store handle as a worker elsewhere would, decodes only what
follows it and folds exactly as a full decode does; a damaged checkpoint object is
ignored (the open is still right and replaces it); a cache directory keeps it on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.engine.checkpoint import MIN_EVENTS, open_fold
from lodger.engine.state import SessionState
from lodger.events import (
    EventDraft,
    ModelOutput,
    ProposedCall,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    TurnEnded,
    TurnStarted,
)
from lodger.storage import Storage
from lodger.storage.objectstore import ObjectLogStore
from lodger.testing.checkpoint_conformance import check_checkpoint_store

from ._s3server import S3Server

SESSION = "s-long"
TOOLS = (ToolRef(name="read_file", schema_digest="sha256-read_file"),)


def _drafts(turns: int) -> list[EventDraft]:
    """``turns`` completed turns, each one call answered, then one more left open
    between T1 and T2 (so the fold has an open turn and an indeterminate call)."""
    out = [EventDraft(id="e0", ts=1, body=SessionStarted(workspace="/ws"))]

    def add(body: object, **env: str) -> None:
        out.append(EventDraft(id=f"e{len(out)}", ts=len(out) + 1, body=body, **env))  # type: ignore[arg-type]

    for n in range(turns + 1):
        t, r, s, c = f"t{n}", f"r{n}", f"st{n}", f"c{n}"
        add(TurnStarted(input=f"read it ({n})"), turn_id=t)
        add(RunStarted(model="scripted:x"), turn_id=t, run_id=r)
        add(StepStarted(index=0, model="scripted:x", tools=TOOLS), turn_id=t, run_id=r, step_id=s)
        call = ProposedCall(call_id=c, name="read_file", arguments='{"path": "a.txt"}')
        add(ModelOutput(calls=(call,)), turn_id=t, run_id=r, step_id=s)
        dispatched = ToolDispatched(
            operation_id=f"op{n}", tool="read_file", arguments={"path": "a.txt"}
        )
        add(dispatched, turn_id=t, run_id=r, step_id=s, call_id=c)
        if n == turns:
            break
        responded = ToolResponded(operation_id=f"op{n}", status="ok", content=f"line {n}")
        add(responded, turn_id=t, run_id=r, step_id=s, call_id=c)
        add(RunEnded(status="completed"), turn_id=t, run_id=r)
        add(TurnEnded(status="completed", answer="read"), turn_id=t)
    return out


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3")
        return server.url(f"ckpt-{tmp_path.name}")
    return f"file://{tmp_path / 'objects'}"


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_object_checkpoints_pass_the_conformance_check(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    storage = Storage.from_url(_url(kind, tmp_path, request))
    try:
        store = storage.log.store
        assert isinstance(store, ObjectLogStore)
        await check_checkpoint_store(store.checkpoints, keeps=True)
    finally:
        await storage.close()


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_a_long_session_wakes_from_its_checkpoint_elsewhere(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    drafts = _drafts(MIN_EVENTS // 8 + 10)
    assert len(drafts) >= MIN_EVENTS
    writer_side = Storage.from_url(url)
    try:
        async with await writer_side.log.open_writer(SESSION) as writer:
            for begin in range(0, len(drafts), 400):
                await writer.append(drafts[begin : begin + 400], expected_offset=begin)
        first = await open_fold(writer_side.log, SESSION)  # a full decode: writes one
        assert first.events.undecoded_base == 0
        store = writer_side.log.store
        assert isinstance(store, ObjectLogStore)
        keys = await store._list(f"sessions/{SESSION}/checkpoint/")
        assert len(keys) == 1
    finally:
        await writer_side.close()
    events = [e.digest for e in first.events]

    # another worker, with a cache directory, opens it from the checkpoint
    cache = tmp_path / "cache"
    woken = Storage.from_url(url, cache_dir=cache)
    try:
        second = await open_fold(woken.log, SESSION)
    finally:
        await woken.close()
    assert second.events.undecoded_base == len(drafts)  # nothing before it was decoded
    _assert_same(second, first)
    assert [e.digest for e in second.events] == events
    assert (cache / keys[0]).is_file()  # kept on this worker's disk for its next wake
    again = Storage.from_url(url, cache_dir=cache)
    try:
        hits = again.log.store.stats.cache_hits  # type: ignore[attr-defined]
        third = await open_fold(again.log, SESSION)
        assert again.log.store.stats.cache_hits > hits  # type: ignore[attr-defined]
    finally:
        await again.close()
    _assert_same(third, first)

    # a damaged checkpoint object is ignored; the open decodes everything and replaces it
    damaged = Storage.from_url(url)
    try:
        store = damaged.log.store
        assert isinstance(store, ObjectLogStore)
        blob = await store._get(keys[0])
        assert blob is not None
        flipped = bytearray(blob)
        flipped[len(flipped) // 2] ^= 0x01
        await store._delete(keys[0])
        await store._put(keys[0], bytes(flipped), create=True)
        fourth = await open_fold(damaged.log, SESSION)
        assert fourth.events.undecoded_base == 0  # the damaged one was not used
        _assert_same(fourth, first)
        replaced = await store._list(f"sessions/{SESSION}/checkpoint/")
        assert len(replaced) == 1 and replaced != keys  # a fresh one, the damaged one gone
    finally:
        await damaged.close()


def _assert_same(a: SessionState, b: SessionState) -> None:
    assert a.snapshot() == b.snapshot()
    assert a.calls == b.calls
    assert list(a.projector.project().messages) == list(b.projector.project().messages)
    assert len(a.events) == len(b.events)
