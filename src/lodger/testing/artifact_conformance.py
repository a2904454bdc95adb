"""The conformance suite every ``ArtifactStore`` runs.

A store plugs in with a pytest fixture named ``artifacts`` that yields a fresh store and,
for the tamper case, a fixture ``corrupt`` that returns a function damaging the stored
bytes of one artifact behind the store's back::

    class TestMyArtifacts(ArtifactConformance): ...
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import pytest

from lodger.errors import LodgerError
from lodger.storage.artifacts import ArtifactStore

__all__ = ["ArtifactConformance", "Corrupt"]

Corrupt = Callable[[str], None]
"""Damage the stored bytes of the artifact with this sha256."""


class ArtifactConformance:
    async def test_put_returns_the_content_address(self, artifacts: ArtifactStore) -> None:
        data = b"hello artifacts\n" * 100
        ref = await artifacts.put(data)
        assert ref.sha256 == hashlib.sha256(data).hexdigest()
        assert ref.size == len(data)
        assert await artifacts.get(ref.sha256) == data

    async def test_the_same_bytes_are_stored_once(self, artifacts: ArtifactStore) -> None:
        first = await artifacts.put(b"same")
        second = await artifacts.put(b"same")
        assert first == second
        assert await artifacts.get(first.sha256) == b"same"

    async def test_empty_and_binary_payloads(self, artifacts: ArtifactStore) -> None:
        for data in (b"", bytes(range(256)) * 4):
            ref = await artifacts.put(data, media_type="application/octet-stream")
            assert ref.media_type == "application/octet-stream"
            assert await artifacts.get(ref.sha256) == data

    async def test_concurrent_puts_of_the_same_bytes(self, artifacts: ArtifactStore) -> None:
        refs = await asyncio.gather(*(artifacts.put(b"racing bytes") for _ in range(8)))
        assert len({r.sha256 for r in refs}) == 1
        assert await artifacts.get(refs[0].sha256) == b"racing bytes"

    async def test_a_missing_artifact_is_a_clear_error(self, artifacts: ArtifactStore) -> None:
        missing = hashlib.sha256(b"never stored").hexdigest()
        with pytest.raises(LodgerError) as info:
            await artifacts.get(missing)
        assert info.value.code == "artifact_missing"
        assert missing in str(info.value)

    async def test_damaged_bytes_fail_closed(
        self, artifacts: ArtifactStore, corrupt: Corrupt
    ) -> None:
        ref = await artifacts.put(b"precious result")
        corrupt(ref.sha256)
        with pytest.raises(LodgerError) as info:
            await artifacts.get(ref.sha256)
        assert info.value.code == "artifact_corrupt"

    async def test_a_put_over_damaged_bytes_stores_them_again(
        self, artifacts: ArtifactStore, corrupt: Corrupt
    ) -> None:
        """Storing the same bytes twice stores them once, but never by trusting a damaged
        copy: the result the second put returns must read back."""
        data = b"a result stored twice\n" * 64
        ref = await artifacts.put(data)
        corrupt(ref.sha256)
        assert await artifacts.put(data) == ref
        assert await artifacts.get(ref.sha256) == data
