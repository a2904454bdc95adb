"""Result bounding: what of a result goes into T2, and what goes to the artifact store.

A result longer than the limit is stored whole as a content-addressed artifact; T2 keeps
a preview and the reference. Text that cannot be stored (lone surrogates from a tool's
odd file names) is made storable, so a result can never fail its own T2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lodger.errors import StorageError
from lodger.events import ArtifactRef
from lodger.storage.artifacts import ArtifactStore

__all__ = ["PREVIEW_CHARS", "Bounded", "ResultBounder", "storable_text"]

PREVIEW_CHARS = 4_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as valid UTF-8: lone surrogates become U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


@dataclass(frozen=True, slots=True)
class Bounded:
    content: str
    truncated: bool
    artifacts: tuple[ArtifactRef, ...]


class ResultBounder:
    def __init__(self, artifacts: ArtifactStore, *, limit: int = 16_000) -> None:
        self.artifacts = artifacts
        self.limit = limit

    async def bound(self, content: str) -> Bounded:
        content = storable_text(content)
        if len(content) <= self.limit // 4:  # at most 4 bytes a character: surely fits
            return Bounded(content, False, ())
        data = content.encode("utf-8")
        if len(data) <= self.limit:
            return Bounded(content, False, ())
        try:
            ref = await self.artifacts.put(data)
        except StorageError as exc:  # the call happened: T2 must still record it
            note = (
                f"\n[... truncated: the full result ({len(data)} bytes) could not be stored "
                f"({exc.message})]"
            )
            return Bounded(content[:PREVIEW_CHARS] + note, True, ())
        note = (
            f"\n[... truncated: the full result ({len(data)} bytes) is stored as "
            f"artifact sha256:{ref.sha256}]"
        )
        return Bounded(content[:PREVIEW_CHARS] + note, True, (ref,))
