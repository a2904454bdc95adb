"""The bytes of the object-store log: segment, tombstone, head and manifest objects.

A segment holds the records of one append (or, once compacted, of many) verbatim::

    LSEG1\\n{"first": 4, "records": [[4, "<digest>", 312], ...], "session_id": "s1"}\\n<data><data>

The header names every record's offset, digest and length; the data follow back to back.
A tombstone takes the place of an appended segment once compaction has sealed its
records into a larger object; it keeps the key occupied, so a stale writer's
create-only put of that offset still fails (DESIGN L5).

Key layout under the store's root (offsets zero-padded so names sort as numbers)::

    sessions/<id>/seg/<first>            one append; later a tombstone
    sessions/<id>/sealed/<first>-<end>   compacted records [first, end)
    sessions/<id>/head/<high_water>-<digest>   the head after an append (empty body)
    sessions/<id>/manifest/<version>     immutable manifests; the newest wins
    blobs/<sha[:2]>/<sha256>             artifacts and workspace files, content-addressed
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lodger.errors import CorruptLogError
from lodger.storage.logstore import Record

__all__ = [
    "Manifest",
    "SealedRef",
    "decode_manifest",
    "decode_segment",
    "encode_manifest",
    "encode_segment",
    "encode_tombstone",
    "head_key",
    "manifest_key",
    "parse_head_key",
    "parse_seg_key",
    "sealed_key",
    "seg_key",
    "session_root",
]

_SEG_MAGIC = b"LSEG1\n"
_TOMB_MAGIC = b"LTOMB1\n"
_WIDTH = 20


def session_root(session_id: str) -> str:
    return f"sessions/{session_id}/"


def seg_key(session_id: str, first: int) -> str:
    return f"sessions/{session_id}/seg/{first:0{_WIDTH}d}"


def sealed_key(session_id: str, first: int, end: int) -> str:
    return f"sessions/{session_id}/sealed/{first:0{_WIDTH}d}-{end:0{_WIDTH}d}"


def head_key(session_id: str, high_water: int, digest: str) -> str:
    return f"sessions/{session_id}/head/{high_water:0{_WIDTH}d}-{digest}"


def manifest_key(session_id: str, version: int) -> str:
    return f"sessions/{session_id}/manifest/{version:0{_WIDTH}d}"


def parse_head_key(session_id: str, name: str) -> tuple[int, str]:
    """``<high_water>-<digest>`` as written by ``head_key``; anything else fails closed."""
    number, _, digest = name.partition("-")
    valid = (
        number.isdigit()
        and len(number) == _WIDTH
        and (digest == "" or (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)))
    )
    if not valid or (int(number) == 0) != (digest == ""):
        raise CorruptLogError(
            f"log for session {session_id!r} is invalid at offset 0: its head record "
            f"{name!r} is damaged (not <high_water>-<digest>)",
            hint="the head object was written outside lodger; restore the session's "
            "objects from a backup",
            code="head_damaged",
            session_id=session_id,
            offset=0,
        )
    return int(number), digest


def parse_seg_key(session_id: str, key: str) -> int:
    """The first offset a ``seg/`` key names, as written by ``seg_key``; any other name
    under ``seg/`` was put there outside lodger and fails closed."""
    name = key.rsplit("/", 1)[1]
    if (
        name.isdigit()
        and name.isascii()
        and len(name) == _WIDTH
        and key == seg_key(session_id, int(name))
    ):
        return int(name)
    raise CorruptLogError(
        f"log for session {session_id!r} is invalid at offset 0: object {key} is not a "
        "segment lodger writes (not seg/<first offset>)",
        hint="the object was put there outside lodger; remove it only if you know where it "
        "came from, or restore the session's objects from a backup",
        code="undecodable",
        session_id=session_id,
        offset=0,
    )


def encode_segment(session_id: str, records: Sequence[Record]) -> bytes:
    header = {
        "first": records[0].offset,
        "records": [[r.offset, r.digest, len(r.data)] for r in records],
        "session_id": session_id,
    }
    parts = [_SEG_MAGIC, json.dumps(header, separators=(",", ":")).encode(), b"\n"]
    parts.extend(r.data for r in records)
    return b"".join(parts)


def encode_tombstone(sealed: str) -> bytes:
    return _TOMB_MAGIC + json.dumps({"sealed_in": sealed}).encode()


def is_tombstone(blob: bytes) -> bool:
    return blob.startswith(_TOMB_MAGIC)


def _damaged(session_id: str, offset: int, key: str, why: str) -> CorruptLogError:
    return CorruptLogError(
        f"log for session {session_id!r} is invalid at offset {offset}: segment {key} "
        f"is damaged ({why})",
        hint="the object was modified outside lodger or belongs to another session; "
        f"restore it from a backup or fork the session from offset {offset}",
        code="undecodable",
        session_id=session_id,
        offset=offset,
    )


def decode_segment(session_id: str, first: int, key: str, blob: bytes) -> list[Record]:
    """The records of a segment object whose key says it starts at ``first``."""
    if not blob.startswith(_SEG_MAGIC):
        raise _damaged(session_id, first, key, "no segment header")
    newline = blob.find(b"\n", len(_SEG_MAGIC))
    if newline < 0:
        raise _damaged(session_id, first, key, "torn header")
    try:
        header = json.loads(blob[len(_SEG_MAGIC) : newline])
        rows = header["records"]
        if header["session_id"] != session_id or header["first"] != first:
            raise _damaged(session_id, first, key, "its header names another place")
        records: list[Record] = []
        at = newline + 1
        for offset, digest, length in rows:
            if not isinstance(offset, int) or not isinstance(length, int) or length < 0:
                raise _damaged(session_id, first, key, "invalid record entry")
            data = blob[at : at + length]
            if len(data) != length:
                raise _damaged(session_id, offset, key, "truncated data")
            records.append(Record(offset, data, str(digest)))
            at += length
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise _damaged(session_id, first, key, f"unreadable header: {exc}") from None
    if at != len(blob):
        raise _damaged(session_id, first, key, "bytes after the last record")
    return records


@dataclass(frozen=True, kw_only=True)
class SealedRef:
    key: str
    first: int
    end: int


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """One immutable version of a session's manifest (the newest version wins).

    ``sealed`` are the compacted segments covering ``[0, sealed_end)``; ``head`` the
    session's ``(high_water, digest)`` when it was written; ``snapshots`` the workspace
    snapshots by the high-water mark they were taken at; ``artifacts`` the sha256 of the
    artifacts the session references; ``parent`` the prefix a fork shares.
    """

    session_id: str
    version: int
    created_us: int
    head: tuple[int, str] | None = None
    sealed: tuple[SealedRef, ...] = ()
    snapshots: tuple[tuple[int, str], ...] = ()
    artifacts: tuple[str, ...] = ()
    parent: dict[str, Any] | None = field(default=None)

    @property
    def sealed_end(self) -> int:
        return self.sealed[-1].end if self.sealed else 0


def encode_manifest(manifest: Manifest) -> bytes:
    body = {
        "artifacts": list(manifest.artifacts),
        "created_us": manifest.created_us,
        "head": list(manifest.head) if manifest.head else None,
        "parent": manifest.parent,
        "sealed": [[s.key, s.first, s.end] for s in manifest.sealed],
        "session_id": manifest.session_id,
        "snapshots": [list(s) for s in manifest.snapshots],
        "v": 1,
        "version": manifest.version,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_manifest(session_id: str, key: str, blob: bytes) -> Manifest:
    try:
        raw = json.loads(blob)
        if raw["v"] != 1 or raw["session_id"] != session_id:
            raise ValueError("another version or session")
        head = raw["head"]
        sealed = tuple(SealedRef(key=str(k), first=int(f), end=int(e)) for k, f, e in raw["sealed"])
        for ref in sealed:  # never a key outside the session's own sealed objects
            if ref.key != sealed_key(session_id, ref.first, ref.end):
                raise ValueError(f"a sealed segment {ref.key!r} lodger does not write")
        return Manifest(
            session_id=session_id,
            version=int(raw["version"]),
            created_us=int(raw["created_us"]),
            head=(int(head[0]), str(head[1])) if head else None,
            sealed=sealed,
            snapshots=tuple((int(h), str(s)) for h, s in raw["snapshots"]),
            artifacts=tuple(str(a) for a in raw["artifacts"]),
            parent=raw["parent"],
        )
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise CorruptLogError(
            f"log for session {session_id!r} is invalid at offset 0: manifest {key} is "
            f"damaged ({exc})",
            hint="the manifest was written outside lodger; restore the session's objects "
            "from a backup",
            code="head_damaged",
            session_id=session_id,
            offset=0,
        ) from None
