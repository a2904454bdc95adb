"""Projections of the log for the model (DESIGN section 10). Pure functions of a prefix.

``project_messages`` turns committed events into the provider-neutral conversation:
user inputs, model outputs with their calls, and each call's result right after the
output that proposed it, in the order the model emitted the calls (the log may hold them
in completion order). Hidden events (nested code-mode calls) never reach the model;
calls without a committed outcome (dangling) are stripped, as are their results.
To fit a token budget, the oldest tool results are elided (the log keeps them whole).

Images and documents (a turn's attachments, a tool result's media artifacts) become the
messages' ``parts``. Their bytes live in the artifact store; the projection reads them
from ``media`` (sha256 -> bytes), which the engine fills before it projects
(``Projector.needed_media`` says what is missing): a part whose bytes are not there
fails closed, naming its artifact.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from lodger._core.bulk import cycle_collector_paused
from lodger._core.records import record
from lodger._pinned import (
    CompactionFold,
    Pinned,
    pinned_from,
    pinned_items,
    pinned_plain,
    render_head,
)
from lodger.errors import CorruptLogError, StorageError
from lodger.events import (
    ArtifactRef,
    ArtifactStored,
    Attachment,
    CallAccepted,
    CallRejected,
    CancelRequested,
    Compacted,
    CompactionFailed,
    ContextCompacted,
    Event,
    FileCheckpoint,
    MessageQueued,
    ModelOutput,
    OperatorDecision,
    OutputRejected,
    PermissionDecided,
    PermissionModeChanged,
    PermissionRequested,
    ProcessEnded,
    ProcessStarted,
    ProposedCall,
    ProviderRetried,
    QueueChanged,
    RecoveryDecided,
    RecoveryObserved,
    Rewound,
    RunEnded,
    RunStarted,
    SessionStarted,
    SteerDelivered,
    SteerReceived,
    StepStarted,
    ToolDispatched,
    ToolResponded,
    ToolsActivated,
    TurnEnded,
    TurnStarted,
    WorkspaceSnapshot,
)
from lodger.providers.base import (
    AssistantMessage,
    MediaPart,
    Message,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "MessageLog",
    "MessageSnapshot",
    "Pinned",
    "Projection",
    "Projector",
    "estimate_tokens",
    "pinned_items",
    "project_messages",
    "render_head",
    "running_note",
]

ELIDED = "[result elided to fit the context budget: {n} characters; the full text is in the log]"

#: the bytes of the media the projection may need, by sha256
Media = Mapping[str, bytes]
_NO_MEDIA: Media = {}


def _missing_media(sha256: str, what: str) -> StorageError:
    return StorageError(
        f"{what} (artifact {sha256}) is not loaded for the model's context",
        hint="the artifact store lost it, or the context was projected before its media "
        "were read; restore the artifact store the session was written with",
        code="artifact_missing",
    )


def _data(media: Media, sha256: str, what: str) -> bytes:
    data = media.get(sha256)
    if data is None:
        raise _missing_media(sha256, what)
    return data


def _tool_media(refs: Sequence[ArtifactRef]) -> tuple[ArtifactRef, ...]:
    """The artifacts of a tool result that are media for the model (the text/plain
    artifact of a result too long for its fact is not: the fact holds its preview)."""
    return tuple(r for r in refs if r.media_type != "text/plain")


def _attachment_parts(attachments: Sequence[Attachment], media: Media) -> tuple[MediaPart, ...]:
    """A turn's attachments as the model's parts, with their bytes from ``media``."""
    parts: list[MediaPart] = []
    for a in attachments:
        if a.artifact is not None:
            what = f"attachment {a.name!r} ({a.media_type})" if a.name else a.media_type
            data = _data(media, a.artifact.sha256, what)
            parts.append(MediaPart(media_type=a.media_type, data=data, name=a.name))
        else:
            parts.append(MediaPart(media_type=a.media_type, url=a.url, name=a.name))
    return tuple(parts)


def _result_parts(refs: Sequence[ArtifactRef], media: Media) -> tuple[MediaPart, ...]:
    return tuple(
        MediaPart(
            media_type=r.media_type,
            data=_data(media, r.sha256, f"a tool result's {r.media_type}"),
        )
        for r in _tool_media(refs)
    )


def _needed_by(e: Event) -> dict[str, str]:
    """sha256 -> what it is, of the media an event puts in the model's context."""
    body = e.body
    if isinstance(body, TurnStarted) and body.attachments:
        return {
            a.artifact.sha256: f"attachment {a.name!r} ({a.media_type}) of turn {e.turn_id}"
            for a in body.attachments
            if a.artifact is not None
        }
    if isinstance(body, ToolResponded) and body.artifacts:
        return {
            r.sha256: f"the {r.media_type} result of call {e.call_id}"
            for r in _tool_media(body.artifacts)
        }
    return {}


class MessageSnapshot(Sequence[Message]):
    """The first ``n`` messages of an append-only list, then a tail: an immutable view
    that costs O(1) to take, so a step's request never copies a long history."""

    __slots__ = ("_base", "_n", "_tail")

    def __init__(self, base: Sequence[Message], n: int, tail: tuple[Message, ...] = ()) -> None:
        self._base, self._n, self._tail = base, n, tail

    def __len__(self) -> int:
        return self._n + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("message index out of range")
        return self._base[index] if index < self._n else self._tail[index - self._n]

    def __iter__(self) -> Iterator[Message]:
        yield from itertools.islice(self._base, self._n)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[Message]) -> tuple[Message, ...]:
        # a tuple, as ``TurnResult.messages`` was before it became a view
        return (*self, *other)

    def __radd__(self, other: Sequence[Message]) -> tuple[Message, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return f"MessageSnapshot({list(self)!r})"


class MessageLog(Sequence[Message]):
    """The closed messages of a projection, in order; they only grow.

    Built as events fold; a checkpoint's (``lodger.engine.checkpoint``) are kept as the
    compressed JSON chunks it stored, each turned into messages when one of its messages
    is first read: opening a long session does not build the conversation nobody reads (a model
    request that looks at the latest turn only, a turn that stops before its first
    request). A provider that sends the whole conversation reads them all.
    """

    __slots__ = (
        "_chunk",
        "_chunks",
        "_list",
        "_loaded",
        "_media",
        "_session_id",
        "_stored_count",
    )

    def __init__(self) -> None:
        self._list: list[Message] = []  # the messages after the stored ones
        self._chunks: list[bytes] = []
        self._loaded: list[list[Message] | None] = []
        self._chunk = 1
        self._stored_count = 0
        self._session_id = ""
        self._media: Media = _NO_MEDIA

    @classmethod
    def stored(
        cls,
        chunks: list[bytes],
        *,
        chunk: int,
        count: int,
        session_id: str,
        media: Media = _NO_MEDIA,
    ) -> MessageLog:
        """``count`` messages stored as zlib-compressed JSON arrays of ``chunk`` messages
        each (the last may hold fewer); their parts' bytes are read from ``media``."""
        if chunk < 1 or count < 0 or len(chunks) != -(-count // chunk):
            raise ValueError("stored messages: the chunks do not hold the count")
        log = cls()
        log._chunks, log._chunk, log._stored_count = chunks, chunk, count
        log._loaded = [None] * len(chunks)
        log._session_id = session_id
        log._media = media
        return log

    def _load(self, index: int) -> list[Message]:
        loaded = self._loaded[index]
        if loaded is not None:
            return loaded
        expected = min(self._chunk, self._stored_count - index * self._chunk)
        try:
            items = json.loads(zlib.decompress(self._chunks[index]))
            if not isinstance(items, list) or len(items) != expected:
                raise ValueError("another number of messages")
            loaded = _messages_from(items, self._media)
        except (ValueError, TypeError, KeyError, IndexError, zlib.error, RecursionError) as exc:
            # only a file sealed right and written wrong reaches this (by hand: a bug
            # would be caught by the property tests): fail closed, name the way out
            raise CorruptLogError(
                f"session {self._session_id!r}: the messages of its fold checkpoint cannot "
                f"be read ({exc})",
                hint="delete the session's file in the state directory's checkpoints/ "
                "folder; the next open decodes the whole log",
                code="bad_checkpoint",
                session_id=self._session_id,
            ) from None
        self._loaded[index] = loaded
        return loaded

    def append(self, message: Message) -> None:
        self._list.append(message)

    def extend(self, messages: Iterable[Message]) -> None:
        self._list.extend(messages)

    def __len__(self) -> int:
        return self._stored_count + len(self._list)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if index >= self._stored_count:
            return self._list[index - self._stored_count]
        if index < 0:
            raise IndexError("message index out of range")
        return self._load(index // self._chunk)[index % self._chunk]

    def __iter__(self) -> Iterator[Message]:
        for index in range(len(self._chunks)):
            yield from self._load(index)
        yield from self._list


@dataclass(frozen=True, kw_only=True)
class Projection:
    messages: Sequence[Message]
    elided_call_ids: tuple[str, ...]
    estimated_tokens: int


def _chars(m: Message) -> int:
    if isinstance(m, UserMessage):
        return len(m.text)
    if isinstance(m, AssistantMessage):
        return len(m.text) + sum(len(c.arguments) + len(c.name) for c in m.calls)
    return len(m.content)


def estimate_tokens(messages: Sequence[Message], *, chars: int | None = None) -> int:
    """A provider-neutral estimate (about four characters a token)."""
    if chars is None:
        chars = sum(_chars(m) for m in messages)
    return chars // 4 + 4 * len(messages)


def _assistant(body: ModelOutput, calls: tuple[ProposedCall, ...]) -> AssistantMessage:
    """The model's output as the model reads it back, with the calls that have results."""
    message: AssistantMessage = record(
        AssistantMessage,
        {
            "text": body.text,
            "reasoning": body.reasoning,
            "calls": calls,
            "provider_state": body.provider_state,
        },
    )
    return message


def _result_of(e: Event, name: str, media: Media = _NO_MEDIA) -> ToolResultMessage | None:
    """The model-visible result a committed event gives its call, if any."""
    assert e.call_id is not None
    body = e.body
    if isinstance(body, CallRejected):
        return ToolResultMessage(
            call_id=e.call_id, name=body.tool, content=body.message, is_error=True
        )
    if isinstance(body, ToolResponded):
        message: ToolResultMessage = record(
            ToolResultMessage,
            {
                "call_id": e.call_id,
                "name": name,
                "content": body.content,
                "is_error": body.status != "ok",
                "parts": _result_parts(body.artifacts, media) if body.artifacts else (),
            },
        )
        return message
    if isinstance(body, CallAccepted):
        return ToolResultMessage(call_id=e.call_id, name=name, content=running_note(name, body))
    if isinstance(body, RecoveryObserved | OperatorDecision):
        outcome = _recovered_result(body)
        if outcome is not None:
            return ToolResultMessage(
                call_id=e.call_id, name=name, content=outcome[0], is_error=outcome[1]
            )
    return None


def _results_by_call(
    events: Sequence[Event], media: Media
) -> tuple[dict[str, ToolResultMessage], dict[str, UserMessage]]:
    """Each call's result, and the late results (by event id) shown as runtime notes."""
    names: dict[str, str] = {}
    results: dict[str, ToolResultMessage] = {}
    accepted_at: dict[str, int] = {}  # call id -> visible outputs before its call_accepted
    late: dict[str, UserMessage] = {}
    outputs = 0
    for e in events:
        body = e.body
        if isinstance(body, ModelOutput):
            for c in body.calls:
                names[c.call_id] = c.name
            outputs += e.visibility == "model"
        if e.visibility != "model" or e.call_id is None:
            continue
        result = _result_of(e, names.get(e.call_id, ""), media)
        if result is None:
            continue
        if isinstance(body, CallAccepted):
            accepted_at[e.call_id] = outputs
        elif accepted_at.get(e.call_id, outputs) < outputs:
            late[e.id] = _late_note(e.call_id, result)
            continue
        results[e.call_id] = result
    return results, late


def running_note(name: str, accepted: CallAccepted) -> str:
    """What the model reads for a call that runs remotely (``call_accepted``) until its
    result comes: that it runs, and its handle."""
    return json.dumps(
        {
            "status": "running",
            "handle": accepted.handle,
            "note": f"{name or 'the tool'} was accepted and is still running; its result "
            "is delivered when it arrives (at a later step or turn)",
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def _late_note(call_id: str, result: ToolResultMessage) -> UserMessage:
    """A long-running call's result that came after the model read it was running: the
    tool result it was shown stays as it was, and the outcome is a runtime note."""
    outcome = "failed" if result.is_error else "finished"
    return UserMessage(
        text=f"The long-running call {call_id} ({result.name}) {outcome}: {result.content}",
        source="runtime",
    )


def _recovered_result(body: RecoveryObserved | OperatorDecision) -> tuple[str, bool] | None:
    """What recovery learned about an interrupted call, as the result the model sees."""
    if isinstance(body, OperatorDecision):
        if body.decision == "completed":
            return body.result or "the operator confirmed this call completed", False
        if body.decision == "not_applied":
            return "this call was interrupted and the operator confirmed it was not applied", True
        return None
    if body.status == "completed":
        return body.observation or "recovery confirmed this call completed", False
    if body.status == "not_applied":
        return (
            "this call was interrupted before its effect; recovery confirmed it was not applied"
            + (f" ({body.observation})" if body.observation else ""),
            True,
        )
    if body.status == "interrupted":
        return body.observation or "this call was interrupted; its outcome is unknown", True
    return None


def project_messages(
    events: Sequence[Event],
    *,
    budget_tokens: int | None = None,
    keep_recent: int = 1,
    media: Media = _NO_MEDIA,
) -> Projection:
    """The conversation for the next request, from the committed ``events``.

    With ``budget_tokens``, results of all but the ``keep_recent`` latest model outputs
    are elided oldest first until the estimate fits (or nothing older is left).
    ``media`` holds the bytes of the attachments and media results (by sha256).
    After a ``compacted`` fact, the newest one's summary (with what it pinned) stands
    for the prefix it covers (``_project_compacted``).
    """
    for index in range(len(events) - 1, -1, -1):
        if type(events[index].body) is Compacted and events[index].visibility == "model":
            return _project_compacted(
                events, index, budget_tokens=budget_tokens, keep_recent=keep_recent, media=media
            )
    results, late = _results_by_call(events, media)
    messages: list[Message] = []
    outputs: list[tuple[int, int]] = []  # (index of the assistant message, number of calls)
    steers: dict[str, str] = {}
    for e in events:
        if e.visibility != "model":
            continue
        body = e.body
        if isinstance(body, TurnStarted):
            messages.append(_user_message(body, media))
        elif isinstance(body, OutputRejected):
            messages.append(UserMessage(text=body.message, source="runtime"))
        elif isinstance(body, SteerReceived):
            steers[body.steer_id] = body.text
        elif isinstance(body, SteerDelivered):
            messages.extend(_steer_messages(body, steers))
        elif e.id in late:
            messages.append(late[e.id])
        elif isinstance(body, ModelOutput):
            kept = tuple(c for c in body.calls if c.call_id in results)
            outputs.append((len(messages), len(kept)))
            messages.append(
                AssistantMessage(
                    text=body.text,
                    reasoning=body.reasoning,
                    calls=kept,
                    provider_state=body.provider_state,
                )
            )
            messages.extend(results[c.call_id] for c in kept)
    return _elide(messages, outputs, budget_tokens=budget_tokens, keep_recent=keep_recent)


def _covered_end(events: Sequence[Event], index: int) -> int:
    """Where the prefix the compaction at ``index`` covers ends among ``events``: facts
    of its session at or past ``covers.high_water`` committed with it (a step's start)
    are not covered."""
    fact = events[index]
    body = fact.body
    assert isinstance(body, Compacted)
    start = index
    while start > 0:
        before = events[start - 1]
        if before.session_id != fact.session_id or before.offset < body.covers.high_water:
            break
        start -= 1
    return start


def _project_compacted(
    events: Sequence[Event],
    index: int,
    *,
    budget_tokens: int | None,
    keep_recent: int,
    media: Media,
    pinned: Pinned | None = None,
) -> Projection:
    """The projection after the compaction at ``index``: one runtime message with what it
    pinned and its summary, then the facts after the prefix it covers. Calls stay
    whole: a result whose call was summarized away pairs with no output of the tail, so
    it is not shown (as a call without a result is not)."""
    body = events[index].body
    assert isinstance(body, Compacted)
    end = _covered_end(events, index)
    if pinned is None:
        pinned = pinned_items(events[:end])
    tail = [*events[end:index], *events[index + 1 :]]
    head = (
        UserMessage(text=render_head(pinned, body.summary), source="runtime"),
        *_settled_after(tail),
    )
    head_tokens = estimate_tokens(head)
    rest = project_messages(
        tail,
        budget_tokens=None if budget_tokens is None else max(budget_tokens - head_tokens, 0),
        keep_recent=keep_recent,
        media=media,
    )
    return Projection(
        messages=(*head, *rest.messages),
        elided_call_ids=rest.elided_call_ids,
        estimated_tokens=rest.estimated_tokens + head_tokens,
    )


def _settled_after(tail: Sequence[Event]) -> list[UserMessage]:
    """Calls proposed before a compaction that settled after it (a parked approval
    answered later): no output of the tail proposes them, so their results cannot go
    back as tool results; the model reads each outcome as a runtime note instead."""
    proposed = {c.call_id for e in tail if type(e.body) is ModelOutput for c in e.body.calls}
    notes: list[UserMessage] = []
    for e in tail:
        if e.visibility != "model" or e.call_id is None or e.call_id in proposed:
            continue
        body = e.body
        if isinstance(body, ToolResponded):  # its text only: media stay in the log
            content, failed = body.content, body.status != "ok"
        else:
            result = _result_of(e, "")
            if result is None:
                continue
            content, failed = result.content, result.is_error
        outcome = "failed" if failed else "returned"
        notes.append(
            UserMessage(
                text=f"The call {e.call_id} proposed before the summary {outcome}: {content}",
                source="runtime",
            )
        )
    return notes


def _steer_messages(body: SteerDelivered, texts: dict[str, str]) -> list[UserMessage]:
    """The steers a step first carried, as the user's messages (each shown once: its
    text is taken out of ``texts``; an id with no ``steer_received`` shows nothing)."""
    out = []
    for steer_id in body.steer_ids:
        text = texts.pop(steer_id, None)
        if text is not None:
            out.append(UserMessage(text=text, source="steer"))
    return out


def _user_message(body: TurnStarted, media: Media) -> UserMessage:
    if not body.attachments:
        return UserMessage(text=body.input)
    return UserMessage(text=body.input, parts=_attachment_parts(body.attachments, media))


def _elide(
    messages: list[Message],
    outputs: Sequence[tuple[int, int]],
    *,
    budget_tokens: int | None,
    keep_recent: int,
    chars: int | None = None,
) -> Projection:
    estimate = estimate_tokens(messages, chars=chars)
    elided: list[str] = []
    if budget_tokens is not None and estimate > budget_tokens:
        messages = list(messages)
        older = outputs[:-keep_recent] if keep_recent > 0 else outputs
        for index, count in older:
            for position in range(index + 1, index + 1 + count):
                original = messages[position]
                assert isinstance(original, ToolResultMessage)
                replacement = ELIDED.format(n=len(original.content))
                if len(original.content) <= len(replacement):
                    continue
                messages[position] = ToolResultMessage(
                    call_id=original.call_id,
                    name=original.name,
                    content=replacement,
                    is_error=original.is_error,
                    parts=original.parts,
                )
                elided.append(original.call_id)
                estimate -= (len(original.content) - len(replacement)) // 4
                if estimate <= budget_tokens:
                    break
            if estimate <= budget_tokens:
                break
        estimate = estimate_tokens(messages)
    return Projection(
        messages=tuple(messages), elided_call_ids=tuple(elided), estimated_tokens=estimate
    )


#: body classes that give the model nothing to read (exact classes: a subclass goes
#: through the checks of ``Projector._feed`` as before)
_UNSEEN: frozenset[type] = frozenset(
    {
        SessionStarted,
        RunStarted,
        StepStarted,
        ProviderRetried,
        PermissionRequested,
        PermissionDecided,
        ToolDispatched,
        ToolsActivated,
        RecoveryDecided,
        ArtifactStored,
        WorkspaceSnapshot,
        ContextCompacted,
        CompactionFailed,
        MessageQueued,
        QueueChanged,
        CancelRequested,
        PermissionModeChanged,
        Rewound,
        FileCheckpoint,
        ProcessStarted,
        ProcessEnded,
        RunEnded,
        TurnEnded,
    }
)


_MEDIA_BODIES: frozenset[type] = frozenset({TurnStarted, ToolResponded})


class Projector:
    """``project_messages`` computed incrementally as events are committed.

    A run asks for a projection at every step; folding only the new events keeps that
    cost independent of the session's length. The result is always equal to
    ``project_messages(events)`` (a property test holds the two together): when a result
    arrives for an output that is no longer the latest, it falls back to a full rebuild.
    """

    def __init__(
        self,
        events: Sequence[Event],
        *,
        prefix: Sequence[Event] = (),
        media: MutableMapping[str, bytes] | None = None,
    ) -> None:
        self._events = events  # a list that only grows (the journal's)
        # events before the session's own (a fork's inherited history), projected first
        # (folded at the first projection: their media are read by then)
        self._prefix = tuple(prefix)
        self._prefix_fed = False
        #: the bytes of the media in the context, by sha256 (the engine fills it)
        self.media: MutableMapping[str, bytes] = media if media is not None else {}
        #: sha256 -> what it is, of every medium folded (or restored) so far
        self._media_refs: dict[str, str] = {}
        self._media_types: set[str] = set()
        self._seen = 0
        self._closed = MessageLog()
        self._closed_chars = 0  # kept as messages close, so an estimate costs O(new events)
        self._outputs: list[tuple[int, int]] = []
        self._open: ModelOutput | None = None
        self._open_offset = -1  # the offset of the open output among the session's own events
        self._open_results: dict[str, ToolResultMessage] = {}
        self._names: dict[str, str] = {}
        self._closed_calls: set[str] = set()
        self._stale = False
        #: results written to the open output so far, and the open block ``project``
        #: made last (the output's message and its results, and their characters): the
        #: next output closes that same block, unless a result came since
        self._result_writes = 0
        self._block: tuple[ModelOutput, int, tuple[Message, ...], int] | None = None
        #: what compaction reads of every event folded (pins, the breaker's counts)
        self._fold = CompactionFold()
        #: the newest ``compacted`` fact folded, the items it pinned, and (once found) its
        #: position among the prefix and the events
        self._compaction: Event | None = None
        self._compaction_pinned = Pinned()
        self._compaction_at: int | None = None
        #: the text of each steer received and not yet carried by a step, by steer id
        self._steers: dict[str, str] = {}
        #: call id -> visible outputs folded before its ``call_accepted`` (a later
        #: result of it is a runtime note once an output came after)
        self._accepted_at: dict[str, int] = {}

    @property
    def media_types(self) -> frozenset[str]:
        """The media type of every part the context has held so far (URL parts too)."""
        return frozenset(self._media_types)

    def needed_media(self) -> dict[str, str]:
        """sha256 -> what it is, of the media the next projection needs that ``media``
        does not hold yet (the engine reads them from the artifact store)."""
        wanted = dict(self._media_refs)
        pending: Iterable[Event] = self._events[self._seen :]
        if not self._prefix_fed:
            pending = itertools.chain(self._prefix, pending)
        for e in pending:
            if type(e.body) in _MEDIA_BODIES:
                wanted.update(_needed_by(e))
        return {sha: what for sha, what in wanted.items() if sha not in self.media}

    def _note_media(self, e: Event, message: UserMessage | ToolResultMessage) -> None:
        if message.parts:
            self._media_refs.update(_needed_by(e))
            self._media_types.update(p.media_type for p in message.parts)

    def _open_block(self, body: ModelOutput) -> tuple[tuple[Message, ...], int]:
        """The open output's messages (with the calls that have results) and their chars."""
        made = self._block
        if made is not None and made[0] is body and made[1] == self._result_writes:
            return made[2], made[3]
        results = self._open_results
        kept = tuple(c for c in body.calls if c.call_id in results)
        if len(kept) == len(body.calls):
            kept = body.calls  # the output's own tuple: one object less kept per step
        block: tuple[Message, ...] = (
            _assistant(body, kept),
            *(results[c.call_id] for c in kept),
        )
        chars = sum(_chars(m) for m in block)
        self._block = (body, self._result_writes, block, chars)
        return block, chars

    def _close_open(self) -> None:
        body = self._open
        if body is None:
            return
        block, chars = self._open_block(body)
        self._outputs.append((len(self._closed), len(block) - 1))
        self._closed.extend(block)
        self._closed_chars += chars
        self._closed_calls.update(c.call_id for c in body.calls)
        self._open, self._open_results, self._block = None, {}, None

    def _feed(self, e: Event) -> None:
        body = e.body
        if type(body) is Compacted and e.visibility == "model":
            self._compaction, self._compaction_at = e, None
            self._compaction_pinned = self._fold.pinned()
        self._fold.feed(e)
        if type(body) in _UNSEEN:
            return
        if isinstance(body, ModelOutput):
            for c in body.calls:
                self._names[c.call_id] = c.name
        if e.visibility != "model":
            return
        if isinstance(body, TurnStarted):
            self._close_open()
            message = _user_message(body, self.media)
            self._note_media(e, message)
            self._closed.append(message)
            self._closed_chars += len(body.input)
        elif isinstance(body, OutputRejected):
            self._close_open()
            self._closed.append(UserMessage(text=body.message, source="runtime"))
            self._closed_chars += len(body.message)
        elif isinstance(body, SteerReceived):
            self._steers[body.steer_id] = body.text
        elif isinstance(body, SteerDelivered):
            self._close_open()
            for message in _steer_messages(body, self._steers):
                self._closed.append(message)
                self._closed_chars += len(message.text)
        elif isinstance(body, ModelOutput):
            self._close_open()
            self._open, self._open_offset = body, e.offset
        elif e.call_id is not None:
            result = _result_of(e, self._names.get(e.call_id, ""), self.media)
            if result is None:
                return
            outputs = len(self._outputs) + (self._open is not None)
            if type(body) is CallAccepted:
                self._accepted_at[e.call_id] = outputs
            elif self._accepted_at.get(e.call_id, outputs) < outputs:
                self._close_open()
                note = _late_note(e.call_id, result)
                self._closed.append(note)
                self._closed_chars += len(note.text)
                return
            self._note_media(e, result)
            if e.call_id in self._closed_calls:
                self._stale = True
            self._open_results[e.call_id] = result
            self._result_writes += 1

    def _fold_pending(self) -> None:
        events = self._events
        if len(events) < self._seen:
            raise ValueError("the projected event list shrank; a log never loses events")
        if not self._prefix_fed:
            self._prefix_fed = True
            for e in self._prefix:
                self._feed(e)
        # a long history folds here once (an opened session's first request): its
        # messages survive, so collections would walk the whole heap, again and again
        with cycle_collector_paused(len(events) - self._seen):
            for e in events[self._seen :]:
                self._feed(e)
        self._seen = len(events)

    def compaction_state(self) -> tuple[Event | None, CompactionFold]:
        """The newest ``compacted`` fact (None: none yet) and what compaction reads of
        the events so far (``lodger._pinned.CompactionFold``: the pins, the breaker)."""
        self._fold_pending()
        return self._compaction, self._fold

    def project(self, *, budget_tokens: int | None = None, keep_recent: int = 1) -> Projection:
        self._fold_pending()
        events = self._events
        if self._compaction is not None:
            return self._compacted(budget_tokens, keep_recent)
        if self._stale:
            whole = [*self._prefix, *events] if self._prefix else events
            return project_messages(
                whole, budget_tokens=budget_tokens, keep_recent=keep_recent, media=self.media
            )
        closed = len(self._closed)
        chars = self._closed_chars
        block: tuple[Message, ...] = ()
        if self._open is not None:
            block, block_chars = self._open_block(self._open)
            chars += block_chars
        estimate = estimate_tokens((), chars=chars) + 4 * (closed + len(block))
        if budget_tokens is None or estimate <= budget_tokens:
            # the common case: a view over the history, no copy of it
            projection: Projection = record(
                Projection,
                {
                    "messages": MessageSnapshot(self._closed, closed, block),
                    "elided_call_ids": (),
                    "estimated_tokens": estimate,
                },
            )
            return projection
        outputs = list(self._outputs)
        if self._open is not None:
            outputs.append((closed, len(block) - 1))
        return _elide(
            [*self._closed, *block],
            outputs,
            budget_tokens=budget_tokens,
            keep_recent=keep_recent,
            chars=chars,
        )

    def _compacted(self, budget_tokens: int | None, keep_recent: int) -> Projection:
        """The projection after the newest compaction (its pinned items found once)."""
        fact = self._compaction
        assert fact is not None
        sequence: Sequence[Event] = [*self._prefix, *self._events] if self._prefix else self._events
        if self._compaction_at is None:
            self._compaction_at = self._position(fact)
        return _project_compacted(
            sequence,
            self._compaction_at,
            budget_tokens=budget_tokens,
            keep_recent=keep_recent,
            media=self.media,
            pinned=self._compaction_pinned,
        )

    def _position(self, fact: Event) -> int:
        """Where ``fact`` sits among the prefix and the events (found once per compaction:
        an own event sits at its offset, an inherited one is looked for)."""
        events = self._events
        if fact.offset < len(events) and events[fact.offset].id == fact.id:
            return len(self._prefix) + fact.offset
        for i in range(len(self._prefix) - 1, -1, -1):
            if self._prefix[i].id == fact.id:
                return i
        for i in range(len(events) - 1, -1, -1):
            if events[i].id == fact.id:
                return len(self._prefix) + i
        raise ValueError(f"projector: the compaction at offset {fact.offset} was not folded")

    # ------------------------------------------------------------------ checkpoints

    def export(self) -> dict[str, Any] | None:
        """This projector's state as plain values (``lodger.engine.checkpoint``), after
        folding every event it was given, without its closed messages (``closed_plain``);
        None for a fork's (its inherited prefix is read again on open). The call names
        are not included: every proposed call's name is in the call states, which
        ``restore`` is given."""
        if self._prefix:
            return None
        self.project()  # fold what is pending
        return {
            "seen": self._seen,
            "closed_chars": self._closed_chars,
            "outputs": self._outputs,
            "closed_count": len(self._closed),
            "open_at": self._open_offset if self._open is not None else None,
            "open_results": [_message_plain(m) for m in self._open_results.values()],
            "unclosed_calls": sorted(self._names.keys() - self._closed_calls),
            "stale": self._stale,
            "media": self._media_refs,
            "media_types": sorted(self._media_types),
            "compaction": self._compaction.offset if self._compaction is not None else None,
            "compaction_pinned": pinned_plain(self._compaction_pinned),
            "compaction_fold": self._fold.export(),
            "steers": dict(self._steers),
            "accepted_at": dict(self._accepted_at),
        }

    def closed_plain(self) -> list[list[Any]]:
        """The closed messages as plain values (``MessageLog.stored`` reads them back)."""
        return [_message_plain(m) for m in self._closed]

    @classmethod
    def restore(
        cls,
        events: Sequence[Event],
        data: Mapping[str, Any],
        *,
        names: dict[str, str],
        closed: list[bytes],
        chunk: int,
        session_id: str,
        media: MutableMapping[str, bytes] | None = None,
    ) -> Projector:
        """A projector over ``events`` continuing from ``export()``'s values, with
        ``names`` the tool name of every call proposed so far and ``closed`` the JSON of
        ``closed_plain()`` in arrays of ``chunk`` messages (each parsed when one of its
        messages is first read); raises ``ValueError``, ``TypeError`` or ``KeyError`` on
        values ``export`` cannot have made."""
        projector = cls(events, media=media)
        seen = data["seen"]
        if type(seen) is not int or not 0 <= seen <= len(events):
            raise ValueError("projector: bad seen offset")
        count = data["closed_count"]
        if type(count) is not int or count < 0:
            raise ValueError("projector: bad message count")
        results: dict[str, ToolResultMessage] = {}
        refs = data.get("media", {})
        kinds = data.get("media_types", [])
        if not all(type(k) is str and type(v) is str for k, v in refs.items()):
            raise TypeError("projector: a medium is not named by text")
        if not all(type(k) is str for k in kinds):
            raise TypeError("projector: a media type is not text")
        projector._media_refs, projector._media_types = dict(refs), set(kinds)
        steers = data.get("steers", {})
        if not all(type(k) is str and type(v) is str for k, v in steers.items()):
            raise TypeError("projector: a waiting steer is not text")
        projector._steers = dict(steers)
        accepted_at = data.get("accepted_at", {})
        if not all(type(k) is str and type(v) is int for k, v in accepted_at.items()):
            raise TypeError("projector: a long-running call's position is not a count")
        projector._accepted_at = dict(accepted_at)
        for message in _messages_from(data["open_results"], projector.media):
            if not isinstance(message, ToolResultMessage):
                raise TypeError("projector: an open result is not a tool result")
            results[message.call_id] = message
        outputs = [(int(index), int(count)) for index, count in data["outputs"]]
        open_at = data["open_at"]
        if open_at is not None:
            body = events[open_at].body
            if not isinstance(body, ModelOutput) or open_at >= seen:
                raise ValueError("projector: the open output is not a model output")
            projector._open, projector._open_offset = body, open_at
        projector._seen = seen
        projector._closed = MessageLog.stored(
            closed, chunk=chunk, count=count, session_id=session_id, media=projector.media
        )
        projector._closed_chars = int(data["closed_chars"])
        projector._outputs = outputs
        projector._open_results = results
        projector._names = names
        projector._closed_calls = names.keys() - set(data["unclosed_calls"])
        projector._stale = data["stale"] is True
        compaction = data.get("compaction")
        if compaction is not None:
            if type(compaction) is not int or not 0 <= compaction < seen:
                raise ValueError("projector: bad compaction offset")
            fact = events[compaction]
            if type(fact.body) is not Compacted:
                raise ValueError("projector: the compaction is not a compacted fact")
            projector._compaction = fact
        projector._compaction_pinned = pinned_from(data["compaction_pinned"])
        projector._fold = CompactionFold.restore(data["compaction_fold"])
        return projector


def _parts_plain(parts: Sequence[MediaPart]) -> list[list[Any]]:
    """Parts by reference (the bytes stay in the artifact store)."""
    return [
        [
            p.media_type,
            hashlib.sha256(p.data).hexdigest() if p.data is not None else None,
            p.url,
            p.name,
        ]
        for p in parts
    ]


def _parts_from(items: list[list[Any]], media: Media) -> tuple[MediaPart, ...]:
    parts: list[MediaPart] = []
    for media_type, sha256, url, name in items:
        if type(media_type) is not str or type(name) is not str:
            raise TypeError("projector: a part holds a value that is not text")
        if sha256 is not None:
            data = _data(media, str(sha256), f"a {media_type} of the context")
            parts.append(MediaPart(media_type=media_type, data=data, name=name))
        elif type(url) is str:
            parts.append(MediaPart(media_type=media_type, url=url, name=name))
        else:
            raise TypeError("projector: a part has neither bytes nor a URL")
    return tuple(parts)


def _message_plain(m: Message) -> list[Any]:
    if isinstance(m, UserMessage):
        if m.parts:
            return ["u", m.text, m.source, _parts_plain(m.parts)]
        return ["u", m.text, m.source]
    if isinstance(m, AssistantMessage):
        calls = [[c.call_id, c.name, c.arguments] for c in m.calls]
        return ["a", m.text, m.reasoning, calls, m.provider_state]
    if m.parts:
        return ["r", m.call_id, m.name, m.content, m.is_error, _parts_plain(m.parts)]
    return ["r", m.call_id, m.name, m.content, m.is_error]


def _messages_from(items: list[list[Any]], media: Media = _NO_MEDIA) -> list[Message]:
    """``_message_plain``'s inverse, checking every value's type (a ``TypeError`` or
    ``ValueError`` otherwise); the parts' bytes come from ``media``."""
    out: list[Message] = []
    append = out.append
    for item in items:
        tag = item[0]
        if tag == "r":
            _, call_id, name, content, is_error, *rest = item
            if type(call_id) is not str or type(name) is not str or type(content) is not str:
                raise TypeError("projector: a tool result holds a value that is not text")
            append(
                ToolResultMessage(
                    call_id=call_id,
                    name=name,
                    content=content,
                    is_error=is_error is True,
                    parts=_parts_from(rest[0], media) if rest else (),
                )
            )
        elif tag == "a":
            _, text, reasoning, calls, provider_state = item
            if type(text) is not str or type(reasoning) is not str:
                raise TypeError("projector: an output holds a value that is not text")
            if provider_state is not None and type(provider_state) is not dict:
                raise TypeError("projector: provider state is not a mapping")
            append(
                AssistantMessage(
                    text=text,
                    reasoning=reasoning,
                    # validated (strict): a value that is not text fails here
                    calls=tuple(ProposedCall(call_id=i, name=n, arguments=a) for i, n, a in calls),
                    provider_state=provider_state,
                )
            )
        elif tag == "u":
            _, text, source, *rest = item
            if type(text) is not str or source not in ("input", "runtime", "steer"):
                raise TypeError("projector: a user message holds a bad value")
            parts = _parts_from(rest[0], media) if rest else ()
            append(UserMessage(text=text, source=source, parts=parts))
        else:
            raise ValueError(f"projector: unknown message tag {tag!r}")
    return out
