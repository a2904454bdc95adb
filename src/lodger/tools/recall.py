"""``recall``: the model fetches a fact back from its session's log.

A compaction (``lodger.engine.compaction``) replaces a prefix of the model's context with
a summary, and the budget's elision shortens old tool results; the log keeps every fact
whole. ``recall`` reads it back, by one of:

- ``offset``: the fact at that offset of the session's log;
- ``call_id``: the call (tool and arguments) and its whole result (a result too long
  for its fact is read from the artifact store);
- ``query``: the facts whose text holds every word of the query (case aside), newest
  first, each with the offset and call id to recall it by.

The output is bounded (``max_chars``, at most ``MAX_CHARS``; ``start`` reads on), the
tool only reads
(recovery ``idempotent``: running it again after a crash is harmless) and it sees only its
own session's log (a fork's inherited history too).

>>> agent = Agent(model=..., compaction=CompactionPolicy(...))   # offers recall
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated

from pydantic import Field

from lodger.errors import StorageError, ToolCallError
from lodger.events import Event, ModelOutput, ToolDispatched, ToolResponded
from lodger.storage import EventLog
from lodger.storage.artifacts import ArtifactStore
from lodger.storage.forks import read_inherited
from lodger.tools.spec import Tool, ToolContext, tool

__all__ = ["MAX_CHARS", "KnownEvents", "recall_tool"]

#: the most characters one recall returns
MAX_CHARS = 8000
#: the most facts a search lists
_MAX_HITS = 20
#: the most result artifacts one search reads back
_MAX_ARTIFACTS = 50


def _text(e: Event) -> str:
    return json.dumps(e.body.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)


def _bounded(text: str, limit: int, start: int) -> str:
    """``limit`` characters of ``text`` from ``start``, saying how to read on."""
    if start >= len(text) and start > 0:
        raise ToolCallError(f"start={start} is past the end ({len(text)} characters)")
    end = start + limit
    part = text[start:end]
    if end >= len(text):
        return part
    return f"{part}\n... ({len(text) - end} more characters; recall again with start={end})"


async def _full_result(body: ToolResponded, artifacts: ArtifactStore) -> str:
    """A result's whole text: its fact's, or its text artifact's when it was cut."""
    if not body.truncated:
        return body.content
    for ref in body.artifacts:
        if ref.media_type == "text/plain":
            try:
                return (await artifacts.get(ref.sha256)).decode("utf-8", "replace")
            except StorageError:
                return body.content + "\n(the full text's artifact cannot be read)"
    return body.content


async def _by_offset(events: Sequence[Event], offset: int, artifacts: ArtifactStore) -> str:
    own = [e for e in events if e.session_id == events[-1].session_id]
    found = next((e for e in own if e.offset == offset), None)
    if found is None:
        raise ToolCallError(f"the log has no fact at offset {offset} (its head is {len(own)})")
    head = f"offset {found.offset}: {found.kind}" + (
        f" (call {found.call_id})" if found.call_id else ""
    )
    if isinstance(found.body, ToolResponded):
        return f"{head}\n{await _full_result(found.body, artifacts)}"
    return f"{head}\n{_text(found)}"


async def _by_call(events: Sequence[Event], call_id: str, artifacts: ArtifactStore) -> str:
    lines: list[str] = []
    for e in events:
        body = e.body
        if isinstance(body, ModelOutput):
            for c in body.calls:
                if c.call_id == call_id:
                    lines.append(f"offset {e.offset}: call {call_id} {c.name}({c.arguments})")
        elif e.call_id == call_id and isinstance(body, ToolDispatched):
            lines.append(f"offset {e.offset}: dispatched {body.tool}")
        elif e.call_id == call_id and isinstance(body, ToolResponded):
            text = await _full_result(body, artifacts)
            lines.append(f"offset {e.offset}: result ({body.status})\n{text}")
    if not lines:
        raise ToolCallError(f"no call {call_id!r} in this session's log")
    return "\n".join(lines)


async def _search(
    events: Sequence[Event], query: str, artifacts: ArtifactStore, *, asking: str
) -> str:
    """The facts holding every word of ``query``, newest first; the facts of the call
    ``asking`` (this very recall) are left out."""
    words = [w.casefold() for w in query.split()]
    if not words:
        raise ToolCallError("the query is empty: give words to search the log for")
    hits: list[str] = []
    read = 0
    for e in reversed(events):
        if e.kind == "compacted" or e.call_id == asking:
            continue  # the summary is in the context already; this call holds the query
        if isinstance(e.body, ModelOutput) and any(c.call_id == asking for c in e.body.calls):
            continue
        text = _text(e)
        if isinstance(e.body, ToolResponded) and e.body.truncated and read < _MAX_ARTIFACTS:
            read += 1
            text = await _full_result(e.body, artifacts)
        folded = text.casefold()
        if all(w in folded for w in words):
            at = folded.find(words[0])
            snippet = text[max(at - 150, 0) : at + 350].replace("\n", " ")
            call = f" call {e.call_id}" if e.call_id else ""
            hits.append(f"offset {e.offset} ({e.kind}{call}): ...{snippet}...")
            if len(hits) >= _MAX_HITS:
                break
    if not hits:
        return f"no fact of this session's log holds {query!r}"
    return "\n".join(hits)


#: a session's verified events (a fork's inherited ones first) where they are in memory
KnownEvents = Callable[[str], Sequence[Event] | None]


def recall_tool(
    log: EventLog, artifacts: ArtifactStore, *, known: KnownEvents | None = None
) -> Tool:
    """The ``recall`` tool over the sessions of ``log`` (and their result artifacts);
    ``known`` gives the events of a session whose fold is in memory (an agent's), so a
    recall reads nothing again."""

    @tool(group="memory", recovery="idempotent", nestable=True)
    async def recall(
        ctx: ToolContext,
        offset: Annotated[int | None, Field(ge=0, description="a fact's offset")] = None,
        call_id: Annotated[str | None, Field(description="a call's id")] = None,
        query: Annotated[str | None, Field(description="words to search the log for")] = None,
        max_chars: Annotated[int, Field(ge=200, le=MAX_CHARS)] = MAX_CHARS,
        start: Annotated[int, Field(ge=0, description="read on from this character")] = 0,
    ) -> str:
        """Fetch a fact of this session back from its log: one that was summarized or
        shortened in your context. Give exactly one of `offset` (a fact), `call_id` (a
        call and its whole result) or `query` (words; lists matching facts, newest
        first, with their offsets and call ids). A long answer is cut: recall again
        with the `start` it names to read on."""
        given = [v for v in (offset, call_id, query) if v is not None]
        if len(given) != 1:
            raise ToolCallError("give exactly one of offset, call_id or query")
        events = known(ctx.session_id) if known is not None else None
        if not events:
            own = await log.read_all(ctx.session_id)
            if not own:
                raise ToolCallError("this session has no log yet")
            events = [*await read_inherited(log, ctx.session_id, own), *own]
        if offset is not None:
            text = await _by_offset(events, offset, artifacts)
        elif call_id is not None:
            text = await _by_call(events, call_id, artifacts)
        else:
            assert query is not None
            text = await _search(events, query, artifacts, asking=ctx.call_id)
        return _bounded(text, max_chars, start)

    return recall
