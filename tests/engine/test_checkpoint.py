"""Fold checkpoints (``lodger.engine.checkpoint``): a cache that never changes an answer.

A real SQLite log of a few thousand events of every shape the fold cares about (calls
proposed, rejected, dispatched, answered, nested code-mode calls, permission dialogues
with an "always", recovery observations, parks and operator decisions, output
rejections, compactions, tool activations) whose last turn is left open between T1 and
T2. Opening it from a checkpoint at any offset must give exactly the fold, the call
states and the model projection of a full decode; a checkpoint that is damaged, torn,
another session's, bound to another digest, of another version, sealed without the log
key, or a planted pickle is ignored, and a damaged LOG still fails closed with its
offset although a valid checkpoint covers it. ``lodger resume`` runs as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pickle
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lodger.context import MessageLog
from lodger.engine import checkpoint as ckpt
from lodger.engine.checkpoint import (
    decode_or_why,
    encode_checkpoint,
    open_fold,
)
from lodger.engine.state import SessionState
from lodger.errors import CorruptLogError
from lodger.events import (
    ALWAYS_REASON,
    CallRejected,
    ContextCompacted,
    Event,
    EventDraft,
    ModelOutput,
    OperatorDecision,
    OutputRejected,
    PermissionDecided,
    PermissionRequested,
    ProposedCall,
    RecoveryDecided,
    RecoveryObserved,
    RunEnded,
    RunStarted,
    SessionStarted,
    StepStarted,
    ToolDispatched,
    ToolRef,
    ToolResponded,
    ToolsActivated,
    TurnEnded,
    TurnStarted,
    chain_digest,
)
from lodger.providers.scripted import ScriptedModel
from lodger.recovery.classify import CallState
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import EventLog, LogKey, Record, SqliteLogStore
from lodger.storage.checkpoints import FileCheckpoints, MemoryCheckpoints, NoCheckpoints
from lodger.storage.eventlog import SessionChain, VerifiedRecords
from lodger.testing.checkpoint_conformance import check_checkpoint_store
from lodger.tools.workspace import workspace_id

SESSION = "s-ckpt"
TURNS = 70  # about 1,400 events: past MIN_EVENTS and the decode thread
TOOLS = (ToolRef(name="read_file", schema_digest="sha256-read_file"),)
SCRIPT = [{"calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]}, {"text": "done"}]


def drafts_of(
    workspace: Path, model: str, *, turns: int = TURNS, salt: str = ""
) -> list[EventDraft]:
    """Completed turns of every shape, then a last turn open between T1 and T2 of an
    idempotent ``read_file`` call."""
    out: list[EventDraft] = []

    def add(body: object, **env: str) -> None:
        n = len(out)
        out.append(EventDraft(id=f"e{n}", ts=1_700_000_000_000_000 + n, body=body, **env))  # type: ignore[arg-type]

    add(SessionStarted(workspace=str(workspace), workspace_id=workspace_id(workspace)))
    for k in range(1, turns + 1):
        t, r, s = f"t{k}", f"r{k}", f"r{k}s0"
        add(TurnStarted(input=f"task {k}{salt}"), turn_id=t)
        add(RunStarted(model=model), turn_id=t, run_id=r)
        if k % 5 == 0:
            add(ToolsActivated(query="grep", names=("grep_files",)), turn_id=t, run_id=r)
        add(StepStarted(index=0, model=model, tools=TOOLS), turn_id=t, run_id=r, step_id=s)
        calls = (
            ProposedCall(call_id=f"{s}c0", name="read_file", arguments='{"path": "a"}'),
            ProposedCall(call_id=f"{s}c1", name="nope", arguments="{}"),
            ProposedCall(call_id=f"{s}c2", name="read_file", arguments='{"path": "b"}'),
            ProposedCall(call_id=f"{s}c3", name="read_file", arguments='{"path": "c"}'),
        )
        add(
            ModelOutput(text=f"step {k}", reasoning="why" if k % 2 else "", calls=calls),
            turn_id=t,
            run_id=r,
            step_id=s,
        )
        env = {"turn_id": t, "run_id": r, "step_id": s}
        c0, c1, c2, c3 = (c.call_id for c in calls)
        add(PermissionRequested(tool="read_file", summary="read a"), **env, call_id=c0)
        if k % 4 == 2:  # its approval parked: the run waits, a new run asks again
            park = PermissionDecided(tool="read_file", decision="park", by="user", reason="w")
            add(park, **env, call_id=c0)
            add(RunEnded(status="interrupted", error="waiting"), turn_id=t, run_id=r)
            r = f"r{k}p"
            env = {"turn_id": t, "run_id": r, "step_id": s}
            add(RunStarted(model=model), turn_id=t, run_id=r)
            add(PermissionRequested(tool="read_file", summary="read a"), **env, call_id=c0)
        always = ALWAYS_REASON if k == 3 else ""
        add(
            PermissionDecided(tool="read_file", decision="allow", by="user", reason=always),
            **env,
            call_id=c0,
        )
        add(
            ToolDispatched(operation_id=f"op{c0}", tool="read_file", arguments={"path": "a"}),
            **env,
            call_id=c0,
        )
        add(
            ToolResponded(operation_id=f"op{c0}", status="ok", content=f"a {k}" * (k % 7)),
            **env,
            call_id=c0,
        )
        add(
            CallRejected(tool="nope", reason="unknown_tool", message="no tool nope"),
            **env,
            call_id=c1,
        )
        # c2 runs a nested (hidden, code-mode) call before its own result
        add(
            ToolDispatched(operation_id=f"op{c2}", tool="read_file", arguments={"path": "b"}),
            **env,
            call_id=c2,
        )
        nested = f"{c2}n0"
        add(
            ToolDispatched(operation_id=f"op{nested}", tool="read_file", arguments={"path": "."}),
            **env,
            call_id=nested,
            parent_call_id=c2,
            origin="code_mode",
            visibility="hidden",
        )
        add(
            ToolResponded(operation_id=f"op{nested}", status="ok", content="."),
            **env,
            call_id=nested,
            parent_call_id=c2,
            origin="code_mode",
            visibility="hidden",
        )
        add(
            ToolResponded(operation_id=f"op{c2}", status="error", content="no b"), **env, call_id=c2
        )
        add(
            ToolDispatched(
                operation_id=f"op{c3}",
                tool="read_file",
                arguments={"path": "c"},
                recovery="idempotent",
            ),
            **env,
            call_id=c3,
        )
        if k % 3 == 0:  # interrupted, then settled by recovery or by the operator
            add(RunEnded(status="interrupted"), turn_id=t, run_id=r)
            r = f"r{k}b"
            env = {"turn_id": t, "run_id": r, "step_id": s}
            add(RunStarted(model=model), turn_id=t, run_id=r)
            if k % 2:
                add(
                    RecoveryObserved(
                        operation_id=f"op{c3}", status="completed", reason="probe", observation="c"
                    ),
                    **env,
                    call_id=c3,
                )
            else:
                add(RecoveryDecided(operation_id=f"op{c3}", action="park"), **env, call_id=c3)
                add(
                    OperatorDecision(operation_id=f"op{c3}", decision="not_applied"),
                    **env,
                    call_id=c3,
                )
        else:
            add(ToolResponded(operation_id=f"op{c3}", status="ok", content="c"), **env, call_id=c3)
        if k % 4 == 1:
            add(OutputRejected(message="not JSON", attempt=1), turn_id=t, run_id=r)
        s1 = f"r{k}s1"
        add(StepStarted(index=1, model=model, tools=TOOLS), turn_id=t, run_id=r, step_id=s1)
        add(ModelOutput(text=f"done {k}"), turn_id=t, run_id=r, step_id=s1)
        if k % 6 == 2:
            add(
                ContextCompacted(elided_call_ids=(c0,), budget_tokens=100, estimated_tokens=200),
                turn_id=t,
                run_id=r,
            )
        add(RunEnded(status="completed"), turn_id=t, run_id=r)
        add(TurnEnded(status="completed", answer="ok"), turn_id=t)
    t, r, s = "t-last", "r-last", "r-last-s0"
    call = ProposedCall(call_id="call-last", name="read_file", arguments='{"path": "notes.txt"}')
    add(TurnStarted(input="read the notes"), turn_id=t)
    add(RunStarted(model=model), turn_id=t, run_id=r)
    add(StepStarted(index=0, model=model, tools=TOOLS), turn_id=t, run_id=r, step_id=s)
    add(ModelOutput(calls=(call,)), turn_id=t, run_id=r, step_id=s)
    add(
        ToolDispatched(
            operation_id="op-last",
            tool="read_file",
            arguments={"path": "notes.txt"},
            recovery="idempotent",
        ),
        turn_id=t,
        run_id=r,
        step_id=s,
        call_id=call.call_id,
    )
    return out


async def _build(state: Path, drafts: list[EventDraft], key: LogKey | None = None) -> None:
    log = EventLog(SqliteLogStore(state), key=key)
    try:
        async with await log.open_writer(SESSION) as writer:
            for begin in range(0, len(drafts), 1_000):
                await writer.append(drafts[begin : begin + 1_000], expected_offset=begin)
    finally:
        await log.close()


async def _verified(
    state: Path, key: LogKey | None = None, *, decode: bool = True
) -> tuple[VerifiedRecords, list[Event]]:
    log = EventLog(SqliteLogStore(state), key=key)
    try:
        verified = await log.read_verified(SESSION)
        return verified, verified.decode() if decode else []
    finally:
        await log.close()


def assert_same_fold(a: SessionState, b: SessionState) -> None:
    """Everything a reader of the fold can see, compared."""
    assert a.snapshot() == b.snapshot()
    assert a.calls == b.calls
    assert a.call_ids == b.call_ids
    assert a.always_allowed == b.always_allowed
    for budget in (None, 400):
        pa, pb = (
            a.projector.project(budget_tokens=budget),
            b.projector.project(budget_tokens=budget),
        )
        assert list(pa.messages) == list(pb.messages)
        assert (pa.estimated_tokens, pa.elided_call_ids) == (
            pb.estimated_tokens,
            pb.elided_call_ids,
        )
    assert len(a.events) == len(b.events)
    assert [e.digest for e in a.events] == [e.digest for e in b.events]


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("remember the milk\n")
    script = root / "script.json"
    script.write_text(json.dumps(SCRIPT))
    golden = root / "golden"
    asyncio.run(_build(golden, drafts_of(workspace, f"script:{script}")))
    return golden, workspace


@pytest.fixture(scope="module")
def full(long_log: tuple[Path, Path]) -> tuple[VerifiedRecords, list[Event], SessionState]:
    verified, events = asyncio.run(_verified(long_log[0]))
    return verified, events, SessionState(SESSION, events)


# ---------------------------------------------------------------------- equivalence


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_checkpoint_plus_tail_folds_like_the_whole_log(
    full: tuple[VerifiedRecords, list[Event], SessionState], data: st.DataObject
) -> None:
    verified, events, whole = full
    n = data.draw(st.integers(min_value=1, max_value=len(events)), label="checkpoint offset")
    prefix = SessionState(SESSION, events[:n])
    restored = decode_or_why(encode_checkpoint(prefix, verified.chain), verified)
    assert not isinstance(restored, str), restored
    assert restored.events.undecoded_base == n  # nothing before n was decoded to open it
    restored.feed(verified.decode(n))
    assert_same_fold(restored, whole)


def test_every_shape_is_in_the_log(full: tuple[VerifiedRecords, list[Event], SessionState]) -> None:
    """The equivalence above covers what it claims: each kind the fold reads occurs."""
    _, events, whole = full
    kinds = {e.body.kind for e in events}
    assert {
        "call_rejected", "context_compacted", "operator_decision", "output_rejected",
        "permission_decided", "recovery_decided", "recovery_observed", "tools_activated",
    } <= kinds  # fmt: skip
    assert any(e.parent_call_id for e in events) and any(e.visibility == "hidden" for e in events)
    statuses = {s.status()[0] for s in whole.calls.values()}
    assert {"completed", "rejected", "not_applied", "indeterminate"} <= statuses
    assert whole.always_allowed and whole.open_turn == "t-last"
    assert any(c.awaiting_approval for c in whole.calls.values())  # a parked approval


def test_a_checkpoint_keeps_every_field_of_a_call() -> None:
    """A field added to CallState and forgotten here would make a checkpointed fold differ
    from a full one only on logs that use it: fail on the shape instead."""
    plain = ckpt._call_plain(CallState(call_id="c", tool="t", turn_id=None, offset=0))
    assert len(plain) == len(dataclasses.fields(CallState))


def test_open_checkpoint_folds_later_appends_and_decodes_old_events_on_demand(
    full: tuple[VerifiedRecords, list[Event], SessionState],
) -> None:
    verified, events, whole = full
    n = len(events) // 2
    restored = decode_or_why(
        encode_checkpoint(SessionState(SESSION, events[:n]), verified.chain), verified
    )
    assert not isinstance(restored, str)
    restored.feed(verified.decode(n))
    # readers that look back (the plan's dispatched bodies, a slice, a reversed scan)
    plan = restored.plan()
    assert [c.call_id for c in plan.calls] == ["call-last"]
    assert (
        restored.calls["call-last"].operations[0].dispatched
        == whole.calls["call-last"].operations[0].dispatched
    )
    old = next(iter(restored.calls.values())).operations[0]
    assert old.dispatched.tool == "read_file"  # decoded from the log on demand
    assert restored.events[10:20] == events[10:20]
    assert list(reversed(restored.events))[:5] == events[::-1][:5]
    assert restored.used_tools() == whole.used_tools() == ["read_file"]


# ---------------------------------------------------------------------- open_fold and the store


async def _open(state: Path, key: LogKey | None = None) -> SessionState:
    log = EventLog(SqliteLogStore(state), key=key)
    try:
        return await open_fold(log, SESSION)
    finally:
        await log.close()


def _copy(golden: Path, tmp_path: Path, name: str = "state") -> Path:
    target = tmp_path / name
    shutil.copytree(golden, target)
    return target


def test_open_writes_a_checkpoint_then_uses_it(
    long_log: tuple[Path, Path],
    full: tuple[VerifiedRecords, list[Event], SessionState],
    tmp_path: Path,
) -> None:
    state = _copy(long_log[0], tmp_path)
    path = state / "checkpoints" / f"{SESSION}.ckpt"
    assert not path.exists()
    first = asyncio.run(_open(state))
    assert first.events.undecoded_base == 0 and path.exists()  # a full decode wrote it
    written = path.read_bytes()
    second = asyncio.run(_open(state))
    assert second.events.undecoded_base == len(full[1])  # opened from it
    assert second.checkpoint_offset == len(full[1])
    assert path.read_bytes() == written  # not rewritten when it matched
    assert_same_fold(second, full[2])
    assert_same_fold(first, full[2])


def _sealed(chain: object, body: bytes) -> bytes:
    return body + ckpt._seal(chain, body).encode() + b"\n"  # type: ignore[arg-type]


def _rewritten(data: bytes, chain: object, changes: dict[int, Callable[[bytes], bytes]]) -> bytes:
    """The checkpoint with frames changed (``changes``: frame index -> a function of its
    inflated text) and sealed again, as a hand-made file sealed right would be."""
    start = data.index(b"\n", len(ckpt.MAGIC)) + 1
    texts = [zlib.decompress(f) for f in ckpt.split_frames(data[:-65], start)]
    for index, change in changes.items():
        texts[index] = change(texts[index])
    return _sealed(chain, data[:start] + ckpt.join_frames([zlib.compress(t) for t in texts]))


def _reheader(data: bytes, chain: object, **changes: object) -> bytes:
    """The checkpoint with header fields changed and sealed again (a writer of another
    version would seal what it wrote)."""
    magic, rest = data[: len(ckpt.MAGIC)], data[len(ckpt.MAGIC) : -65]
    head, payload = rest.split(b"\n", 1)
    header = json.loads(head)
    header.update(changes)
    return _sealed(chain, magic + json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("flip_header", "bad seal"),
        ("flip_payload", "bad seal"),
        ("flip_seal", "bad seal"),
        ("truncated", "torn"),
        ("empty", "not a checkpoint"),
        ("format", "another format version"),
        ("schema", "another schema version"),
        ("other_session", "another session"),
        ("beyond", "offset beyond the log"),
        ("bad_values", "unreadable (TypeError)"),
        ("pickle", "not a checkpoint"),
    ],
)
def test_a_bad_checkpoint_is_ignored_and_the_open_is_still_right(
    long_log: tuple[Path, Path],
    full: tuple[VerifiedRecords, list[Event], SessionState],
    tmp_path: Path,
    damage: str,
    why: str,
) -> None:
    verified, events, whole = full
    good = encode_checkpoint(SessionState(SESSION, events[:-5]), verified.chain)
    chain = verified.chain
    marker = tmp_path / "pwned"
    middle = len(good) // 2
    if damage == "flip_header":
        bad = good[:30] + bytes([good[30] ^ 1]) + good[31:]
    elif damage == "flip_payload":
        bad = good[:middle] + bytes([good[middle] ^ 0x20]) + good[middle + 1 :]
    elif damage == "flip_seal":
        bad = good[:-3] + (b"0" if good[-3:-2] != b"0" else b"1") + good[-2:]
    elif damage == "truncated":
        bad = good[:middle] + good[-65:]  # a torn write that kept its tail
    elif damage == "empty":
        bad = b""
    elif damage == "format":
        bad = _reheader(good, chain, format=ckpt.CHECKPOINT_VERSION + 1)
    elif damage == "schema":
        bad = _reheader(good, chain, schema=0)
    elif damage == "other_session":
        bad = _reheader(good, chain, session="s-other")
    elif damage == "beyond":
        bad = _reheader(good, chain, offset=len(events) + 1)
    elif damage == "bad_values":

        def wrong(text: bytes) -> bytes:
            text = text.replace(b'"turns":', b'"turns":{"x":1},"ignored":', 1)
            return text.replace(b'"closed":[[', b'"closed":[[1,', 1)

        bad = _rewritten(good, chain, {0: wrong})
    else:  # a pickle that would run code if anything unpickled it
        bad = pickle.dumps(_Boom(str(marker)))
    assert decode_or_why(bad, verified) == why
    state = _copy(long_log[0], tmp_path)
    (state / "checkpoints").mkdir()
    (state / "checkpoints" / f"{SESSION}.ckpt").write_bytes(bad)
    opened = asyncio.run(_open(state))
    assert opened.events.undecoded_base == 0  # decoded everything instead
    assert_same_fold(opened, whole)
    assert not marker.exists()
    # and wrote a good one in its place
    assert (state / "checkpoints" / f"{SESSION}.ckpt").read_bytes() != bad


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def test_a_checkpoint_of_a_rewritten_log_or_another_fork_is_ignored(
    long_log: tuple[Path, Path], tmp_path: Path
) -> None:
    """The same session id and offset, other bytes before it (a log rewritten or restored
    from elsewhere, a fork that diverged): the digest at N differs, so it is ignored."""
    golden, workspace = long_log
    other = tmp_path / "other"
    asyncio.run(_build(other, drafts_of(workspace, "script:x", salt=" (rewritten)")))
    verified, events = asyncio.run(_verified(golden))
    theirs, their_events = asyncio.run(_verified(other))
    assert len(their_events) == len(events)
    planted = encode_checkpoint(SessionState(SESSION, their_events[:-5]), theirs.chain)
    assert decode_or_why(planted, verified) == "another digest at its offset"
    state = _copy(golden, tmp_path)
    (state / "checkpoints").mkdir()
    (state / "checkpoints" / f"{SESSION}.ckpt").write_bytes(planted)
    opened = asyncio.run(_open(state))
    assert opened.events.undecoded_base == 0
    assert_same_fold(opened, SessionState(SESSION, events))


def test_an_edited_byte_before_the_checkpoint_still_fails_closed(
    long_log: tuple[Path, Path],
    full: tuple[VerifiedRecords, list[Event], SessionState],
    tmp_path: Path,
) -> None:
    verified, events, _ = full
    state = _copy(long_log[0], tmp_path)
    (state / "checkpoints").mkdir()
    (state / "checkpoints" / f"{SESSION}.ckpt").write_bytes(
        encode_checkpoint(SessionState(SESSION, events), verified.chain)
    )
    target = 700  # well before the checkpoint's offset
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        (data,) = conn.execute(
            'SELECT data FROM events WHERE session_id = ? AND "offset" = ?', (SESSION, target)
        ).fetchone()
        edited = data.replace(b"task", b"tusk", 1) if b"task" in data else data[:-2] + b" }"
        conn.execute(
            'UPDATE events SET data = ? WHERE session_id = ? AND "offset" = ?',
            (edited, SESSION, target),
        )
        conn.commit()
    with pytest.raises(CorruptLogError) as caught:
        asyncio.run(_open(state))
    assert caught.value.offset == target


@pytest.mark.parametrize("after", [0, 2])
def test_a_record_after_the_checkpoint_that_does_not_decode_fails_closed(
    full: tuple[VerifiedRecords, list[Event], SessionState], tmp_path: Path, after: int
) -> None:
    """A writer this version cannot read (or a forger of a plain chain) stored an event
    after the checkpoint's offset, with the chain and the head recomputed over it: the
    chain verifies and the checkpoint fits, and decoding the tail still fails, naming
    the offset, as a full read does."""
    verified, events, _ = full
    n = len(events) - 10
    target = n + after
    records: list[Record] = []
    prev = ""
    for record in verified.records:
        data = record.data
        if record.offset == target:
            data = data.replace(b'"body":{', b'"body":{"colour":"red",', 1)
        prev = record.digest if record.offset < target else chain_digest(prev, data)
        records.append(Record(record.offset, data, prev))

    async def store() -> None:
        log = EventLog(SqliteLogStore(tmp_path / "state"))
        try:
            await log.store.append_records(session_id=SESSION, records=records, expected_offset=0)
            with pytest.raises(CorruptLogError) as full_read:
                await log.read_all(SESSION)
            assert (full_read.value.offset, full_read.value.code) == (target, "unknown_field")
        finally:
            await log.close()

    asyncio.run(store())
    data = encode_checkpoint(SessionState(SESSION, events[:n]), verified.chain)
    (tmp_path / "state" / "checkpoints").mkdir(exist_ok=True)
    (tmp_path / "state" / "checkpoints" / f"{SESSION}.ckpt").write_bytes(data)
    stored, _ = asyncio.run(_verified(tmp_path / "state", decode=False))
    restored = decode_or_why(data, stored)  # the open takes the checkpoint, then the tail
    assert not isinstance(restored, str), restored
    assert len(restored.events) == n
    with pytest.raises(CorruptLogError) as caught:
        asyncio.run(_open(tmp_path / "state"))
    assert (caught.value.offset, caught.value.code) == (target, "unknown_field")


def test_a_keyed_session_needs_a_checkpoint_sealed_under_its_key(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    key = LogKey(b"k" * 32)
    state = tmp_path / "state"
    asyncio.run(_build(state, drafts_of(workspace, "script:x", turns=50), key=key))
    first = asyncio.run(_open(state, key))  # full decode; writes a keyed checkpoint
    path = state / "checkpoints" / f"{SESSION}.ckpt"
    keyed = path.read_bytes()
    verified, events = asyncio.run(_verified(state, key))
    assert verified.chain.keyed
    second = asyncio.run(_open(state, key))
    assert second.events.undecoded_base == len(events)
    assert_same_fold(second, first)
    # the same checkpoint sealed with a plain sha256 (anyone can compute one): refused
    plain = _sealed(SessionChain("sha256"), keyed[:-65])
    assert decode_or_why(plain, verified) == "bad seal"
    path.write_bytes(plain)
    third = asyncio.run(_open(state, key))
    assert third.events.undecoded_base == 0
    assert_same_fold(third, first)


# ---------------------------------------------------------------------- stores and crashes


@pytest.mark.parametrize("kind", ["file", "memory", "none"])
async def test_checkpoint_stores_pass_the_conformance_suite(tmp_path: Path, kind: str) -> None:
    if kind == "file":
        await check_checkpoint_store(FileCheckpoints(tmp_path / "checkpoints"), keeps=True)
    elif kind == "memory":
        await check_checkpoint_store(MemoryCheckpoints(), keeps=True)
    else:
        await check_checkpoint_store(NoCheckpoints(), keeps=False)


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from lodger.storage.checkpoints import FileCheckpoints

    store = FileCheckpoints(Path(sys.argv[1]))
    versions = [Path(p).read_bytes() for p in sys.argv[2:]]

    async def main():
        n = 0
        while True:
            await store.save_checkpoint(session_id="s-ckpt", data=versions[n % len(versions)])
            n += 1
            if n == 3:
                print("writing", flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_sigkill_while_writing_leaves_the_old_or_the_new_checkpoint(
    full: tuple[VerifiedRecords, list[Event], SessionState], tmp_path: Path
) -> None:
    verified, events, whole = full
    offsets = (len(events) // 3, len(events) - 5)
    files = []
    for n in offsets:
        f = tmp_path / f"v{n}"
        f.write_bytes(encode_checkpoint(SessionState(SESSION, events[:n]), verified.chain))
        files.append(str(f))
    root = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    seen: set[int] = set()
    rng = random.Random(9)
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), *files],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"writing\n"  # past a few whole writes
        time.sleep(rng.uniform(0, 0.02))  # lands anywhere in a write (about 1 ms each)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        restored = decode_or_why((root / f"{SESSION}.ckpt").read_bytes(), verified)
        assert not isinstance(restored, str), restored  # never torn
        assert restored.checkpoint_offset in offsets
        seen.add(restored.checkpoint_offset)
        restored.feed(verified.decode(restored.checkpoint_offset))
        assert_same_fold(restored, whole)
    # leftovers of killed writes are temporary names, never read as a checkpoint
    assert all(p.name.endswith(".tmp") for p in root.iterdir() if p.name != f"{SESSION}.ckpt")


# ---------------------------------------------------------------------- lodger resume


def _resume(state: Path, workspace: Path) -> subprocess.CompletedProcess[bytes]:
    script = workspace.parent / "script.json"  # the one the session's runs name
    where = ["--workspace", str(workspace), "--state", str(state)]
    return subprocess.run(
        [sys.executable, "-m", "lodger", "resume", SESSION, "--model", f"script:{script}", *where],
        capture_output=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
        timeout=120,
    )


def _tail(state: Path, start: int) -> list[tuple[str, str | None, str]]:
    """What the resume appended, without its fresh ids and timestamps."""
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        rows = conn.execute(
            'SELECT data FROM events WHERE session_id = ? AND "offset" >= ? ORDER BY "offset"',
            (SESSION, start),
        ).fetchall()
    out = []
    for (data,) in rows:
        event = json.loads(data)
        body = {
            k: v
            for k, v in event["body"].items()
            if k
            not in (
                "operation_id",
                "retry_of",
                "resumed_from",
                "duration_ms",
                "usage",
                "elapsed_ms",
            )
        }
        out.append((body["kind"], event.get("call_id"), json.dumps(body, sort_keys=True)))
    return out


@pytest.mark.slow
def test_lodger_resume_with_a_checkpoint_appends_what_it_appends_without(
    long_log: tuple[Path, Path],
    full: tuple[VerifiedRecords, list[Event], SessionState],
    tmp_path: Path,
) -> None:
    golden, workspace = long_log
    verified, events, _ = full
    plain = _copy(golden, tmp_path / "a")
    cached = _copy(golden, tmp_path / "b")
    planted = _copy(golden, tmp_path / "c")
    # the checkpoint a turn writes when it ends: before the interrupted last turn
    for state in (cached, planted):
        (state / "checkpoints").mkdir()
        (state / "checkpoints" / f"{SESSION}.ckpt").write_bytes(
            encode_checkpoint(SessionState(SESSION, events[:-5]), verified.chain)
        )
    marker = tmp_path / "pwned"
    (planted / "checkpoints" / f"{SESSION}.ckpt").write_bytes(pickle.dumps(_Boom(str(marker))))
    before = (cached / "checkpoints" / f"{SESSION}.ckpt").read_bytes()
    results = {
        name: _resume(state, workspace)
        for name, state in (("plain", plain), ("cached", cached), ("planted", planted))
    }
    for name, done in results.items():
        assert done.returncode == 0, (name, done.stderr.decode()[-2000:])
    expected = _tail(plain, len(events))
    assert [k for k, _, _ in expected][-1] == "turn_ended" and ("tool_responded", "call-last") in [
        (k, c) for k, c, _ in expected
    ]
    assert _tail(cached, len(events)) == expected
    assert _tail(planted, len(events)) == expected
    assert not marker.exists()
    # the plain run decoded everything and left a checkpoint; the cached run used its own
    # (a few new events do not make a new one due)
    assert (plain / "checkpoints" / f"{SESSION}.ckpt").exists()
    assert (cached / "checkpoints" / f"{SESSION}.ckpt").read_bytes() == before


@pytest.mark.slow
def test_lodger_resume_fails_closed_on_a_log_edited_before_a_valid_checkpoint(
    long_log: tuple[Path, Path],
    full: tuple[VerifiedRecords, list[Event], SessionState],
    tmp_path: Path,
) -> None:
    golden, workspace = long_log
    verified, events, _ = full
    state = _copy(golden, tmp_path)
    (state / "checkpoints").mkdir()
    (state / "checkpoints" / f"{SESSION}.ckpt").write_bytes(
        encode_checkpoint(SessionState(SESSION, events[:-5]), verified.chain)
    )
    target = 1_234
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        (data,) = conn.execute(
            'SELECT data FROM events WHERE session_id = ? AND "offset" = ?', (SESSION, target)
        ).fetchone()
        conn.execute(
            'UPDATE events SET data = ? WHERE session_id = ? AND "offset" = ?',
            (data[:-1] + b" " + data[-1:], SESSION, target),
        )
        conn.commit()
    done = _resume(state, workspace)
    assert done.returncode != 0
    assert f"offset {target}" in done.stderr.decode()
    with contextlib.closing(sqlite3.connect(state / "log.sqlite3")) as conn:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM events WHERE session_id = ?", (SESSION,)
        ).fetchone()
    assert count == len(events)  # nothing appended


# ---------------------------------------------------------------------- lazy messages, turns


def test_checkpoint_messages_are_parsed_only_when_read(
    full: tuple[VerifiedRecords, list[Event], SessionState], monkeypatch: pytest.MonkeyPatch
) -> None:
    verified, _, whole = full
    monkeypatch.setattr(ckpt, "MESSAGE_CHUNK", 64)  # several chunks from a short log
    restored = decode_or_why(encode_checkpoint(whole, verified.chain), verified)
    assert not isinstance(restored, str)
    closed = restored.projector._closed
    assert isinstance(closed, MessageLog) and len(closed._loaded) > 2
    assert all(chunk is None for chunk in closed._loaded)  # nothing parsed to open it
    messages = restored.projector.project().messages
    assert messages[-1] == whole.projector.project().messages[-1]
    assert sum(chunk is not None for chunk in closed._loaded) <= 1  # the latest chunk only
    assert list(messages) == list(whole.projector.project().messages)


def test_a_sealed_checkpoint_with_unreadable_messages_fails_closed_when_read(
    full: tuple[VerifiedRecords, list[Event], SessionState],
) -> None:
    """Only a file written by hand and sealed right gets this far (a plain seal is no
    secret; a keyed one is): reading its messages fails closed, naming the way out."""
    verified, _, whole = full
    good = encode_checkpoint(whole, verified.chain)
    # the first chunk of messages
    bad = _rewritten(good, verified.chain, {1: lambda _: b'[["r", 1, 2, 3, false]]'})
    restored = decode_or_why(bad, verified)
    assert not isinstance(restored, str)
    with pytest.raises(CorruptLogError) as caught:
        list(restored.projector.project().messages)
    assert caught.value.code == "bad_checkpoint"


async def test_a_turn_on_a_long_session_opens_from_the_checkpoint_and_answers_the_same(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    drafts = drafts_of(workspace, "script:x")[:-5]  # ends with a completed turn
    plain, cached = tmp_path / "plain", tmp_path / "cached"
    await _build(plain, drafts)
    shutil.copytree(plain, cached)
    path = cached / "checkpoints" / f"{SESSION}.ckpt"
    binding = Binding(model=ScriptedModel([{"text": "ok"}]), workspace=workspace)
    async with Sessions.local(cached) as sessions:  # reads everything, writes a checkpoint
        await sessions.run("first", binding=binding, session=SESSION)
    assert path.exists()
    first = path.read_bytes()
    results = {}
    for name, state in (("plain", plain), ("cached", cached)):
        if name == "plain":
            async with Sessions.local(state) as sessions:
                await sessions.run("first", binding=binding, session=SESSION)
            (state / "checkpoints" / f"{SESSION}.ckpt").unlink()  # force a full decode next
        async with Sessions.local(state) as sessions:
            folded = await sessions.state(SESSION)
            results[name] = (
                folded.events.undecoded_base,
                await sessions.run("second", binding=binding, session=SESSION),
            )
    assert results["cached"][0] == len(drafts)  # from the checkpoint its first open wrote
    assert results["plain"][0] == 0
    a, b = results["plain"][1], results["cached"][1]
    assert (a.status, a.answer) == (b.status, b.answer) == ("completed", "ok")
    assert list(a.messages) == list(b.messages)
    assert path.read_bytes() == first  # two short turns later it is not due again


@pytest.mark.parametrize(
    "framed",
    [
        b"5\nabc\n",  # shorter than its length says
        b"3\nabcX",  # no newline where it ends
        b"x\nabc\n",  # a length that is not digits
        b"-3\nabc\n",
        b"3",  # no newline after the length
        b"9" * 40 + b"\nabc\n",  # a length longer than any frame can be
        b"3\nabc\n2\n",  # a second frame cut short
    ],
)
def test_frames_that_do_not_fit_are_refused(framed: bytes) -> None:
    with pytest.raises(ValueError, match="frame"):
        ckpt.split_frames(framed)


def test_frames_round_trip_whatever_bytes_they_hold() -> None:
    blobs = [b"", b"\n", b"12\n34\n", bytes(range(256)), zlib.compress(b"x" * 10_000)]
    assert ckpt.split_frames(ckpt.join_frames(blobs)) == blobs


def test_a_sealed_checkpoint_whose_payload_does_not_inflate_is_ignored(
    full: tuple[VerifiedRecords, list[Event], SessionState],
) -> None:
    verified, _, whole = full
    good = encode_checkpoint(whole, verified.chain)
    start = good.index(b"\n", len(ckpt.MAGIC)) + 1
    frames = ckpt.split_frames(good[:-65], start)
    frames[0] = b"not zlib at all"
    bad = _sealed(verified.chain, good[:start] + ckpt.join_frames(frames))
    assert decode_or_why(bad, verified) == "unreadable (error)"


def test_a_checkpoint_is_smaller_than_its_json(
    full: tuple[VerifiedRecords, list[Event], SessionState],
) -> None:
    verified, _, whole = full
    good = encode_checkpoint(whole, verified.chain)
    start = good.index(b"\n", len(ckpt.MAGIC)) + 1
    inflated = sum(len(zlib.decompress(f)) for f in ckpt.split_frames(good[:-65], start))
    assert len(good) * 3 < inflated  # compressed frames: several times smaller
