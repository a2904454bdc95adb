"""Every artifact store through the one conformance suite (``lodger.testing``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lodger.storage.artifacts import ArtifactStore, FileArtifactStore, MemoryArtifactStore
from lodger.storage.objectartifacts import ObjectArtifactStore, blob_key
from lodger.storage.objectstore import open_object_store
from lodger.testing.artifact_conformance import ArtifactConformance, Corrupt


@pytest.fixture(params=["memory", "files", "objects"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def artifacts(kind: str, tmp_path: Path) -> ArtifactStore:
    if kind == "objects":
        return ObjectArtifactStore(open_object_store(f"file://{tmp_path / 'o'}").store)
    return MemoryArtifactStore() if kind == "memory" else FileArtifactStore(tmp_path / "a")


@pytest.fixture
def corrupt(kind: str, tmp_path: Path, artifacts: ArtifactStore) -> Corrupt:
    if isinstance(artifacts, MemoryArtifactStore):
        memory = artifacts

        def flip(sha256: str) -> None:
            memory.blobs[sha256] = b"X" + memory.blobs[sha256][1:]

        return flip

    def damage(sha256: str) -> None:
        path = (
            tmp_path / "o" / blob_key(sha256)
            if kind == "objects"
            else tmp_path / "a" / sha256[:2] / sha256
        )
        data = bytearray(path.read_bytes())
        data[0] ^= 0xFF
        path.write_bytes(bytes(data))

    return damage


class TestArtifactStores(ArtifactConformance):
    pass
