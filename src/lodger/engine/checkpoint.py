"""Fold checkpoints: a cache of what opening a session computes, never an authority.

Opening a session reads every record and checks the chain over every stored byte (the
integrity check; it always runs), then decodes and folds the events. Decoding and
folding 100k events costs seconds; a checkpoint stores their result (the ``SessionState``
fold, the call states, the model projection) as of offset ``N``, so an open decodes and
folds only the events from ``N`` on.

Why skipping the decode of the events before ``N`` is sound: the checkpoint is bound to
``(session id, N, the chain digest of event N-1, its format version, SCHEMA_VERSION)``
and sealed with its own sha256 (an HMAC under the log key for a keyed chain). The open
checks the chain over every stored byte first, so a digest at ``N-1`` equal to the one
the checkpoint names proves the bytes before ``N`` are the very bytes that a lodger of
this schema version decoded, validated and folded when it wrote the checkpoint: the fold
of the same bytes by the same code is the same. An edited byte anywhere still fails the
chain check, with its offset, before any checkpoint is looked at.

Anything wrong with a checkpoint (missing, torn, damaged, another session's, another
version's, another digest at ``N``: a rewritten log or another fork, a wrong MAC,
values the writer cannot have written) makes the open ignore it and decode everything;
a long log read that way writes a fresh one. The format is JSON of plain values (lists,
strings, numbers): loading one builds data, never runs code.

Events before ``N`` are decoded on demand (``History``) when something reads them.

    file  = MAGIC + header JSON + "\\n" + frame(payload JSON)
            + frame(a JSON array of up to MESSAGE_CHUNK closed messages) * k
            + seal (64 hex) + "\\n"
    frame(x) = len(zlib(x)) in ASCII digits + "\\n" + zlib(x) + "\\n"
    seal  = sha256(SEAL_TAG + everything before it), or HMAC-SHA256 under the log key

Each frame is compressed on its own (zlib, level 1): a checkpoint is several times
smaller than its JSON (an object store moves it on every save and on a cold wake), and a
chunk of messages is still inflated and parsed only when one of its messages is read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lodger._core.bulk import cycle_collector_paused
from lodger.context import Projector
from lodger.engine.history import History
from lodger.engine.queue import QueuedMessage
from lodger.engine.state import SessionState
from lodger.errors import CorruptLogError, LodgerError
from lodger.events import (
    ALWAYS_REASON,
    SCHEMA_VERSION,
    CallAccepted,
    Event,
    ForkParent,
    OperatorDecision,
    PermissionDecided,
    PermissionModeChanged,
    RecoveryObserved,
    ToolDispatched,
)
from lodger.recovery.classify import CallState, OperationRecord
from lodger.storage.eventlog import EventLog, SessionChain, VerifiedRecords

__all__ = [
    "CHECKPOINT_VERSION",
    "MIN_EVENTS",
    "checkpoint_due",
    "decode_or_why",
    "encode_checkpoint",
    "open_fold",
    "save_checkpoint",
]

CHECKPOINT_VERSION = 4  # 2: a call's awaiting_approval; 3: compressed frames; 4: compaction
MAGIC = b"lodger-fold-checkpoint\n"
SEAL_TAG = b"lodger-fold-checkpoint\x00"
#: below this many events a full decode is cheap: no checkpoint is written
MIN_EVENTS = 1_000
#: closed messages per frame: a request that reads the latest turn parses one or two
MESSAGE_CHUNK = 512
_LEVEL = 1  # zlib: level 1 is within a few percent of 6 on checkpoints, at a third the time


# ---------------------------------------------------------------------- the seal


def _seal(chain: SessionChain, body: bytes) -> str:
    if chain.keyed:
        if chain.mac is None:
            raise ValueError("a keyed session's checkpoint needs the log key")
        mac = chain.mac.copy()
        mac.update(SEAL_TAG)
        mac.update(body)
        return mac.hexdigest()
    h = hashlib.sha256(SEAL_TAG)
    h.update(body)
    return h.hexdigest()


# ---------------------------------------------------------------------- encoding


def _operation_plain(op: OperationRecord) -> list[Any]:
    return [
        op.operation_id,
        op.offset,
        op.run_id,
        op.responded_at,
        op.observed.model_dump(mode="json") if op.observed is not None else None,
        op.parked,
        op.decision.model_dump(mode="json") if op.decision is not None else None,
        op.accepted.model_dump(mode="json") if op.accepted is not None else None,
    ]


def _call_plain(c: CallState) -> list[Any]:
    return [
        c.call_id,
        c.tool,
        c.turn_id,
        c.offset,
        c.parent_call_id,
        c.origin,
        c.rejected,
        c.noted_not_dispatched,
        c.awaiting_approval,
        [_operation_plain(op) for op in c.operations],
    ]


def encode_checkpoint(state: SessionState, chain: SessionChain) -> bytes:
    """The checkpoint of ``state`` as of its last folded event (``len(state.events)``)."""
    n = len(state.events)
    if n == 0:
        raise ValueError("an empty fold has no checkpoint")
    # a plain value per message and call while the whole fold is alive: without the
    # pause, collections rescan that heap again and again (measured: 1.2 s of 100k, 0.5 s)
    with cycle_collector_paused(n):
        return _encode(state, chain, n)


def _encode(state: SessionState, chain: SessionChain, n: int) -> bytes:
    header = {
        "format": CHECKPOINT_VERSION,
        "schema": SCHEMA_VERSION,
        "session": state.session_id,
        "offset": n,
        "digest": state.events.digest_at(n - 1),
        "chain": chain.kind,
        "key_id": chain.key_id,
        "message_chunk": MESSAGE_CHUNK,
    }
    classifier = state._calls
    payload = {
        "state": {
            "workspace": state.workspace,
            "workspace_id": state.workspace_id,
            "open_turn": state.open_turn,
            "open_turn_offset": state.open_turn_offset,
            "last_run_id": state.last_run_id,
            "run_open": state.run_open,
            "last_model": state.last_model,
            "turns": state.turns,
            "last_turn_status": state.last_turn_status,
            "turn_steps": state.turn_steps,
            "turn_activated": state.turn_activated,
            "last_elided": list(state.last_elided),
            "always_allowed": state.always_allowed,
            "permission_mode_at": state.permission_mode_at,
            "step_mode_at": state.step_mode_at,
            "last_step_id": state.last_step_id,
            "parent": state.parent.model_dump(mode="json") if state.parent else None,
            "queue": [m.to_dict() for m in state.queue],
        },
        "calls": [_call_plain(c) for c in classifier.calls.values()],
        "dispatched_tools": sorted(classifier.dispatched_tools),
        "projector": state.projector.export() if state.inherited is None else None,
    }
    closed = state.projector.closed_plain() if payload["projector"] is not None else []
    texts = [json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()]
    for begin in range(0, len(closed), MESSAGE_CHUNK):
        chunk = closed[begin : begin + MESSAGE_CHUNK]
        texts.append(json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode())
    # JSON escapes every control character in strings: the header's newline ends it
    head = MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n"
    body = head + join_frames([zlib.compress(text, _LEVEL) for text in texts])
    return body + _seal(chain, body).encode() + b"\n"


def join_frames(blobs: Sequence[bytes]) -> bytes:
    """``blobs`` as frames: each one's length in ASCII digits, a newline, the bytes, a
    newline."""
    return b"".join(b"%d\n%s\n" % (len(blob), blob) for blob in blobs)


def split_frames(data: bytes, start: int = 0) -> list[bytes]:
    """The frames of ``data`` from ``start`` to its end; ValueError if they do not fit."""
    blobs: list[bytes] = []
    at, end = start, len(data)
    while at < end:
        newline = data.find(b"\n", at, at + 21)
        digits = data[at:newline]
        if newline < 0 or not digits.isdigit():
            raise ValueError("a frame without a length")
        stop = newline + 1 + int(digits)
        if stop >= end or data[stop : stop + 1] != b"\n":
            raise ValueError("a frame that does not end where its length says")
        blobs.append(data[newline + 1 : stop])
        at = stop + 1
    return blobs


# ---------------------------------------------------------------------- decoding


class _StoredOperation(OperationRecord):
    """An operation restored from a checkpoint: its T1 body is decoded from the log (the
    event at ``offset``) when first read, not when the session opens."""

    def __init__(self, history: History, item: list[Any]) -> None:  # not the dataclass's
        # an eighth item (schema 9's ``call_accepted``) is absent from checkpoints
        # written before it: such a fold saw no accepted call
        operation_id, offset, run_id, responded_at, observed, parked, decision = item[:7]
        accepted = item[7] if len(item) > 7 else None
        if type(operation_id) is not str or type(offset) is not int:
            raise TypeError("operation: bad id or offset")
        if not 0 <= offset < history.undecoded_base:
            raise ValueError("operation: offset outside the checkpoint")
        self._history = history
        self._dispatched: ToolDispatched | None = None
        self.operation_id = operation_id
        self.offset = offset
        self.run_id = run_id if run_id is None else str(run_id)
        self.responded_at = responded_at if responded_at is None else int(responded_at)
        self.observed = None if observed is None else RecoveryObserved.model_validate(observed)
        self.parked = parked is True
        self.decision = None if decision is None else OperatorDecision.model_validate(decision)
        self.accepted = None if accepted is None else CallAccepted.model_validate(accepted)

    @property
    def dispatched(self) -> ToolDispatched:
        if self._dispatched is None:
            event = self._history[self.offset]
            body = event.body
            if not isinstance(body, ToolDispatched) or body.operation_id != self.operation_id:
                raise CorruptLogError(
                    f"log for session {event.session_id!r}: its fold checkpoint names "
                    f"operation {self.operation_id!r} at offset {self.offset}, which holds "
                    f"another event",
                    hint="delete the session's file in the state directory's checkpoints/ "
                    "folder; the next open decodes the whole log",
                    code="bad_checkpoint",
                    session_id=event.session_id,
                    offset=self.offset,
                )
            self._dispatched = body
        return self._dispatched

    @dispatched.setter
    def dispatched(self, value: ToolDispatched) -> None:
        self._dispatched = value


def _optional_str(value: object) -> str | None:
    if value is not None and type(value) is not str:
        raise TypeError("expected a string or null")
    return value


def _restore_calls(history: History, items: list[Any]) -> dict[str, CallState]:
    calls: dict[str, CallState] = {}
    for item in items:
        call_id, tool, turn_id, offset, parent, origin, rejected, noted, awaiting, ops = item
        if type(call_id) is not str or type(tool) is not str or type(offset) is not int:
            raise TypeError("call: bad id, tool or offset")
        if origin not in ("provider", "code_mode", "runtime", "operator"):
            raise ValueError("call: bad origin")
        calls[call_id] = CallState(
            call_id=call_id,
            tool=tool,
            turn_id=_optional_str(turn_id),
            offset=offset,
            parent_call_id=_optional_str(parent),
            origin=origin,
            rejected=rejected is True,
            noted_not_dispatched=noted is True,
            awaiting_approval=awaiting is True,
            operations=[_StoredOperation(history, op) for op in ops],
        )
    return calls


def _mode_offset(history: History, n: int, at: object) -> int | None:
    """A permission mode's offset from a checkpoint, only where the verified log holds a
    switch (a mode is authority: a checkpoint is a cache)."""
    if at is None:
        return None
    if type(at) is not int or not 0 <= at < n:
        raise ValueError("state: a permission mode outside the checkpoint")
    if not isinstance(history[at].body, PermissionModeChanged):
        raise ValueError("state: a permission mode the log does not hold")
    return at


def _restore(
    session_id: str,
    verified: VerifiedRecords,
    n: int,
    payload: dict[str, Any],
    messages: list[bytes],
    chunk: object,
) -> SessionState:
    history = History(verified, n)
    state = SessionState(session_id, history=history)
    s = payload["state"]
    state.workspace = _optional_str(s["workspace"])
    state.workspace_id = _optional_str(s["workspace_id"])
    state.open_turn = _optional_str(s["open_turn"])
    state.open_turn_offset = s["open_turn_offset"]
    state.last_run_id = _optional_str(s["last_run_id"])
    state.run_open = s["run_open"] is True
    state.last_model = _optional_str(s["last_model"])
    state.turns = int(s["turns"])
    state.last_turn_status = _optional_str(s["last_turn_status"])
    state.turn_steps = int(s["turn_steps"])
    state.turn_activated = [str(name) for name in s["turn_activated"]]
    state.last_elided = tuple(str(c) for c in s["last_elided"])
    state.always_allowed = {str(k): int(v) for k, v in s["always_allowed"].items()}
    for tool, at in state.always_allowed.items():
        # a grant is authority (it answers approval prompts): a checkpoint is a cache, so
        # only a grant the verified log holds at the offset it names is taken from one
        if not 0 <= at < n:
            raise ValueError("state: a grant outside the checkpoint")
        body = history[at].body
        if not (
            isinstance(body, PermissionDecided)
            and body.tool == tool
            and (body.by, body.decision, body.reason) == ("user", "allow", ALWAYS_REASON)
        ):
            raise ValueError("state: a grant the log does not hold")
    state.permission_mode_at = _mode_offset(history, n, s.get("permission_mode_at"))
    state.step_mode_at = _mode_offset(history, n, s.get("step_mode_at"))
    state.last_step_id = _optional_str(s.get("last_step_id"))
    state.parent = None if s["parent"] is None else ForkParent.model_validate(s["parent"])
    state.queue = [QueuedMessage.from_dict(m) for m in s.get("queue", [])]
    if state.open_turn_offset is not None and type(state.open_turn_offset) is not int:
        raise TypeError("state: bad open turn offset")
    calls = _restore_calls(history, payload["calls"])
    tools = payload["dispatched_tools"]
    if not all(type(t) is str for t in tools):
        raise TypeError("state: a tool name is not a string")
    state._calls.restore(calls, set(tools))
    # the calls the model proposed (nested calls have a parent): their ids are taken, and
    # their names are what the projection names results by (a fork adds its ancestors'
    # ids when ``inherit`` is given them)
    names = {c.call_id: c.tool for c in calls.values() if c.parent_call_id is None}
    state.call_ids = set(names)
    projected = payload["projector"]
    state.projector = (
        Projector(history, media=state.media)
        if projected is None
        else Projector.restore(
            history,
            projected,
            names=names,
            closed=messages,
            chunk=int(chunk),  # type: ignore[call-overload]
            session_id=session_id,
            media=state.media,
        )
    )
    state.checkpoint_offset = n
    return state


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A checkpoint whose seal checked, parsed but not yet bound to the verified log."""

    header: dict[str, Any]
    payload: dict[str, Any]
    messages: list[bytes]  # the projection's closed messages: compressed JSON chunks


def _parse(data: bytes, chain: SessionChain) -> _Parsed | str:
    """Check the seal (under the session's chain) and parse; or why the bytes are unusable."""
    if not data.startswith(MAGIC) or not data.endswith(b"\n") or len(data) < len(MAGIC) + 66:
        return "not a checkpoint"
    body, seal = data[:-65], data[-65:-1]
    if body[-1:] != b"\n":
        return "torn"
    try:
        expected = _seal(chain, body)
    except ValueError:
        return "no key for a keyed session"
    if not hmac.compare_digest(expected.encode(), seal):
        return "bad seal"
    try:
        newline = body.index(b"\n", len(MAGIC))
        header = json.loads(body[len(MAGIC) : newline])
        if not isinstance(header, dict):
            return "bad header"
        if header.get("format") != CHECKPOINT_VERSION:
            return "another format version"
        if header.get("schema") != SCHEMA_VERSION:
            return "another schema version"
        if (header.get("chain"), header.get("key_id")) != (chain.kind, chain.key_id):
            return "another chain"
        frames = split_frames(body, newline + 1)
        if not frames:
            return "torn"
        payload_text = zlib.decompress(frames[0])
        with cycle_collector_paused(len(payload_text) // 100):
            payload = json.loads(payload_text)
        messages = frames[1:]  # inflated and parsed when one of their messages is read
    except (ValueError, zlib.error, RecursionError) as exc:  # nested past the parser's depth
        return f"unreadable ({type(exc).__name__})"
    if not isinstance(payload, dict):
        return "bad payload"
    return _Parsed(header, payload, messages)


def _bind(parsed: _Parsed, verified: VerifiedRecords) -> SessionState | str:
    """The fold a parsed checkpoint holds, if it belongs to this verified log."""
    header = parsed.header
    if header.get("session") != verified.session_id:
        return "another session"
    if (header.get("chain"), header.get("key_id")) != (verified.chain.kind, verified.chain.key_id):
        return "another chain"
    n = header.get("offset")
    if type(n) is not int or not 0 < n <= len(verified):
        return "offset beyond the log"
    if header.get("digest") != verified.records[n - 1].digest:
        return "another digest at its offset"
    try:
        with cycle_collector_paused(n):
            return _restore(
                verified.session_id,
                verified,
                n,
                parsed.payload,
                parsed.messages,
                header.get("message_chunk"),
            )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        return f"unreadable ({type(exc).__name__})"


def decode_or_why(data: bytes, verified: VerifiedRecords) -> SessionState | str:
    """The fold ``data`` holds for the session ``verified`` (a verified read of it), with
    no event after the checkpoint's offset folded yet; or why it was ignored."""
    parsed = _parse(data, verified.chain)
    return parsed if isinstance(parsed, str) else _bind(parsed, verified)


# ---------------------------------------------------------------------- opening and saving


def checkpoint_due(state: SessionState) -> bool:
    """Whether a new checkpoint is worth writing: a long log that grew by a tenth (at
    least 500 events) since the one it has."""
    n = len(state.events)
    return n >= MIN_EVENTS and n - state.checkpoint_offset >= max(500, n // 10)


async def save_checkpoint(log: EventLog, state: SessionState) -> bool:
    """Write ``state``'s checkpoint through the log's checkpoint store; True when written.

    Call it while nothing feeds ``state`` (between turns, holding the writer). A failure
    to write is not the caller's: a cache that is not written costs a full decode later.
    """
    if not state.events:
        return False
    try:
        chain = await log.chain(state.session_id)
        data = await asyncio.to_thread(encode_checkpoint, state, chain)
        await log.checkpoints.save_checkpoint(session_id=state.session_id, data=data)
    except (OSError, ValueError, TypeError, LodgerError):  # not written: a miss later
        return False
    state.checkpoint_offset = len(state.events)
    return True


async def open_fold(log: EventLog, session_id: str) -> SessionState:
    """The session's verified fold: every record read and its chain checked over every
    byte, then the checkpoint's fold plus the events after it, or (no usable
    checkpoint) every event decoded and folded, and a checkpoint written for next time.

    Raises ``SessionNotFoundError`` for a session without events, and what a full read
    raises for a damaged log (``CorruptLogError`` with the offset, ``LogKeyError``).
    """
    data = await log.checkpoints.load_checkpoint(session_id=session_id)
    if data is None:  # no checkpoint: one pass that chains and decodes, as a full read does
        events: Sequence[Event] = await log.read_all(session_id)
    else:
        verified = await log.read_verified(session_id)
        state = await asyncio.to_thread(decode_or_why, data, verified)
        if not isinstance(state, str):
            n = len(state.events)
            if n < len(verified):
                tail = await asyncio.to_thread(verified.decode, n)
                state.feed(tail)
            return state
        events = await asyncio.to_thread(verified.decode)  # the checkpoint did not fit
    folded = await asyncio.to_thread(SessionState, session_id, events)
    if len(events) >= MIN_EVENTS:
        await save_checkpoint(log, folded)
    return folded
