"""Fan-out of committed facts to live streams, resumable by offset.

A stream is "the session's log from offset N, then every fact committed after": it reads
the log from ``N`` and then follows. Following takes the facts this process commits from
an in-memory window (``Feeds.publish`` is called with each committed batch, in commit
order), and falls back to reading the log whenever the window cannot prove the next offset
(a gap: a fact committed by another process, such as ``lodger decide``) or when nothing
was published for ``poll_s`` seconds. Every fact is yielded by offset, so a stream never
skips or repeats one, whichever path delivered it.

Text deltas (``LiveText``: the model's text as it streams in a turn this process runs,
or a worker's, relayed) are transient: never facts, never in the log, never given an
offset. A follower that asks for them (``follow_live``) gets a bounded buffer of its own
(``DeltaBuffer``); each delta is held until the follower has yielded every fact
published before it, so a delta never comes before a fact that preceded it. A follower
that reads too slowly loses deltas, never facts: once a step's delta does not fit, the
rest of that step's deltas are dropped too, so what a follower got of a step's text is
always a prefix of it (the step's ``model_output`` fact holds the whole text); a delta
that comes after its step's output went out is dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from lodger.events import Event
from lodger.storage import EventLog

__all__ = ["DeltaBuffer", "Feeds", "LiveText", "SessionFeed"]

#: what one follower may hold of deltas it has not read yet
DELTA_CHARS = 64_000
DELTA_ITEMS = 256


@dataclass(frozen=True, slots=True)
class LiveText:
    """A piece of a step's text as the model streams it (transient: not a fact).

    ``after`` is one past the newest fact published when it came: a follower gives it
    out once it has given out every fact before that offset."""

    turn_id: str
    step_id: str
    text: str
    after: int


class DeltaBuffer:
    """One follower's deltas not read yet: at most ``max_chars`` characters in at most
    ``max_items`` pieces (adjacent pieces of one step are joined). Past that a step's
    deltas are dropped from the first that does not fit to its end (counted in
    ``dropped``), so what is given out of a step is a prefix of its text."""

    def __init__(self, *, max_chars: int = DELTA_CHARS, max_items: int = DELTA_ITEMS) -> None:
        self.max_chars = max_chars
        self.max_items = max_items
        self.items: deque[LiveText] = deque()
        self.chars = 0
        #: deltas (pieces as published) that were dropped
        self.dropped = 0
        self._lossy: tuple[str, str] | None = None  # the step whose rest is dropped

    def push(self, delta: LiveText) -> None:
        step = (delta.turn_id, delta.step_id)
        if step == self._lossy:
            self.dropped += 1
            return
        tail = self.items[-1] if self.items else None
        joins = tail is not None and (tail.turn_id, tail.step_id, tail.after) == (
            *step,
            delta.after,
        )
        if self.chars + len(delta.text) > self.max_chars or (
            not joins and len(self.items) >= self.max_items
        ):
            self._lossy = step
            self.dropped += 1
            return
        if joins and tail is not None:
            self.items[-1] = LiveText(*step, tail.text + delta.text, delta.after)
        else:
            self.items.append(delta)
        self.chars += len(delta.text)

    def take(self, upto: int) -> list[LiveText]:
        """The deltas due once the facts before offset ``upto`` were given out."""
        out: list[LiveText] = []
        while self.items and self.items[0].after <= upto:
            item = self.items.popleft()
            self.chars -= len(item.text)
            out.append(item)
        return out


class SessionFeed:
    """The recent committed facts of one session, and a signal for new ones."""

    def __init__(self, window: int) -> None:
        self.recent: deque[Event] = deque(maxlen=window)
        self._wake = asyncio.Event()
        self.followers = 0
        #: one past the newest offset published here
        self.head = 0
        #: the buffers of the followers that take deltas
        self.listeners: set[DeltaBuffer] = set()

    def publish_text(
        self, turn_id: str, step_id: str, text: str, *, after: int | None = None
    ) -> None:
        """A delta of a running step for the followers that take deltas (none: a no-op).
        ``after``: one past the newest fact committed before it (default: the newest
        published here; a worker's delta says its own)."""
        if not self.listeners or not text:
            return
        delta = LiveText(turn_id, step_id, text, self.head if after is None else after)
        for buffer in self.listeners:
            buffer.push(delta)
        self._signal()

    def _signal(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def publish(self, events: Sequence[Event]) -> None:
        for event in events:
            self.head = max(self.head, event.offset + 1)
            if self.recent and event.offset <= self.recent[-1].offset:
                continue  # already published (a fact seen twice by two observers)
            if self.recent and event.offset != self.recent[-1].offset + 1:
                self.recent.clear()  # a gap: what lies between is read from the log
            self.recent.append(event)
        self._signal()

    @property
    def wake(self) -> asyncio.Event:
        return self._wake

    def window_from(self, offset: int) -> list[Event] | None:
        """The published facts from ``offset`` on; ``[]`` when ``offset`` is past the
        newest; None when the window does not hold ``offset`` (read the log)."""
        if not self.recent:
            return None
        first, last = self.recent[0].offset, self.recent[-1].offset
        if offset > last:
            return []
        if offset < first:
            return None
        return list(self.recent)[offset - first :]


class Feeds:
    """One ``SessionFeed`` per session that has been published to or followed."""

    def __init__(
        self,
        log: EventLog,
        *,
        window: int = 2048,
        poll_s: float = 1.0,
        page: int = 500,
        keep: int = 256,
    ) -> None:
        self.log = log
        self.window = window
        self.page = page
        self.poll_s = poll_s
        #: how many feeds are kept; past it, those nobody follows are dropped (a window
        #: is a cache: a later stream reads the log), so a long-lived host that runs
        #: thousands of sessions does not keep a window of each
        self.keep = keep
        self._feeds: dict[str, SessionFeed] = {}

    def feed(self, session_id: str) -> SessionFeed:
        found = self._feeds.get(session_id)
        if found is None:
            if len(self._feeds) >= self.keep:
                for sid in [sid for sid, f in self._feeds.items() if f.followers == 0]:
                    del self._feeds[sid]
            found = self._feeds[session_id] = SessionFeed(self.window)
        return found

    def publish(self, session_id: str, events: Sequence[Event]) -> None:
        """Each fact reaches the feed of the log it was committed in: a rewound
        session's facts (published under its name) reach its branch's (``S..rN``)."""
        by_log: dict[str, list[Event]] = {}
        for event in events:
            by_log.setdefault(event.session_id or session_id, []).append(event)
        for log_id, batch in by_log.items():
            self.feed(log_id).publish(batch)

    def publish_text(
        self, session_id: str, turn_id: str, step_id: str, text: str, *, after: int | None = None
    ) -> None:
        found = self._feeds.get(session_id)
        if found is not None:  # nobody follows a session without a feed
            found.publish_text(turn_id, step_id, text, after=after)

    async def follow(
        self, session_id: str, *, start: int = 0, follow: bool = True
    ) -> AsyncGenerator[Event, None]:
        """Every fact of the session from offset ``start``, in offset order; with
        ``follow``, forever (the caller stops iterating), else up to the current head."""
        async for item in self.follow_live(session_id, start=start, follow=follow):
            assert isinstance(item, Event)  # no deltas were asked for
            yield item

    async def follow_live(
        self,
        session_id: str,
        *,
        start: int = 0,
        follow: bool = True,
        deltas: DeltaBuffer | None = None,
    ) -> AsyncGenerator[Event | LiveText, None]:
        """As ``follow``, with the deltas of the turns this process runs interleaved
        (through ``deltas``, this follower's own bounded buffer) when one is given."""
        feed = self.feed(session_id)
        feed.followers += 1  # a followed feed is never dropped
        if deltas is not None and follow:
            feed.listeners.add(deltas)
        events = self._follow(feed, session_id, start=start, follow=follow, deltas=deltas)
        try:
            async for event in events:
                yield event
        finally:
            feed.followers -= 1
            if deltas is not None:
                feed.listeners.discard(deltas)
            await events.aclose()

    async def _follow(
        self,
        feed: SessionFeed,
        session_id: str,
        *,
        start: int,
        follow: bool,
        deltas: DeltaBuffer | None,
    ) -> AsyncGenerator[Event | LiveText, None]:
        next_offset = start
        read_log = True
        written: deque[str] = deque(maxlen=64)  # steps whose output went out: no more deltas
        while True:
            wake = feed.wake  # taken before looking, so a publish after it wakes us
            if deltas is not None:
                for delta in deltas.take(next_offset):
                    if delta.step_id not in written:
                        yield delta
            batch = None if read_log or not follow else feed.window_from(next_offset)
            if batch is None:  # a page at a time: a stream holds one page, however long
                # the log and however slowly its client reads
                end = next_offset + self.page
                batch = await self.log.read(session_id, start=next_offset, end=end)
            read_log = False
            for event in batch:
                if event.offset != next_offset:  # never skip, never repeat
                    read_log = True
                    break
                yield event
                next_offset += 1
                if deltas is None:
                    continue
                if event.kind == "model_output" and event.step_id is not None:
                    written.append(event.step_id)  # a late delta of it would repeat it
                for delta in deltas.take(next_offset):  # came after this fact, before the next
                    if delta.step_id not in written:
                        yield delta
            if read_log or batch:
                continue
            if not follow:
                return
            if deltas is not None and deltas.items:
                if deltas.items[0].after <= next_offset:
                    continue  # a delta came while we yielded
                # a delta made after facts this process did not publish (a worker's):
                # they are in the log by now
                read_log = True
            try:
                await asyncio.wait_for(wake.wait(), self.poll_s)
            except TimeoutError:
                read_log = True  # nothing published here: another process may have written
