"""Fan-out of committed facts to live streams, resumable by offset.

A stream is "the session's log from offset N, then every fact committed after": it reads
the log from ``N`` and then follows. Following takes the facts this process commits from
an in-memory window (``Feeds.publish`` is called with each committed batch, in commit
order), and falls back to reading the log whenever the window cannot prove the next offset
(a gap: a fact committed by another process, such as ``lodger decide``) or when nothing
was published for ``poll_s`` seconds. Every fact is yielded by offset, so a stream never
skips or repeats one, whichever path delivered it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence

from lodger.events import Event
from lodger.storage import EventLog

__all__ = ["Feeds", "SessionFeed"]


class SessionFeed:
    """The recent committed facts of one session, and a signal for new ones."""

    def __init__(self, window: int) -> None:
        self.recent: deque[Event] = deque(maxlen=window)
        self._wake = asyncio.Event()
        self.followers = 0

    def publish(self, events: Sequence[Event]) -> None:
        for event in events:
            if self.recent and event.offset <= self.recent[-1].offset:
                continue  # already published (a fact seen twice by two observers)
            if self.recent and event.offset != self.recent[-1].offset + 1:
                self.recent.clear()  # a gap: what lies between is read from the log
            self.recent.append(event)
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

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

    async def follow(
        self, session_id: str, *, start: int = 0, follow: bool = True
    ) -> AsyncGenerator[Event, None]:
        """Every fact of the session from offset ``start``, in offset order; with
        ``follow``, forever (the caller stops iterating), else up to the current head."""
        feed = self.feed(session_id)
        feed.followers += 1  # a followed feed is never dropped
        events = self._follow(feed, session_id, start=start, follow=follow)
        try:
            async for event in events:
                yield event
        finally:
            feed.followers -= 1
            await events.aclose()

    async def _follow(
        self, feed: SessionFeed, session_id: str, *, start: int, follow: bool
    ) -> AsyncGenerator[Event, None]:
        next_offset = start
        read_log = True
        while True:
            wake = feed.wake  # taken before looking, so a publish after it wakes us
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
            if read_log or batch:
                continue
            if not follow:
                return
            try:
                await asyncio.wait_for(wake.wait(), self.poll_s)
            except TimeoutError:
                read_log = True  # nothing published here: another process may have written
