"""Adversarial audit of the file artifact store: damaged files behind lodger's back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lodger.errors import StorageError
from lodger.storage import FileArtifactStore


async def test_a_put_over_a_damaged_copy_stores_the_bytes_and_keeps_the_damage(
    tmp_path: Path,
) -> None:
    """Storing the same bytes twice stores them once: the second put returned as soon as a
    file had the name, so a result whose earlier copy was damaged on disk was committed
    referring to bytes nobody could read back (artifact_corrupt)."""
    store = FileArtifactStore(tmp_path / "artifacts")
    data = b"a large tool result\n" * 1000
    ref = await store.put(data)
    path = tmp_path / "artifacts" / ref.sha256[:2] / ref.sha256
    damaged = data.replace(b"large", b"LARGE", 1)
    path.write_bytes(damaged)
    with pytest.raises(StorageError) as caught:
        await store.get(ref.sha256)
    assert caught.value.code == "artifact_corrupt"
    again = await FileArtifactStore(tmp_path / "artifacts").put(data)
    assert again == ref
    assert await store.get(ref.sha256) == data
    (kept,) = path.parent.glob(f"{ref.sha256}.damaged-*")
    assert kept.read_bytes() == damaged  # the evidence, as found


async def test_an_artifact_that_is_a_directory_is_a_clear_error_and_a_put_replaces_it(
    tmp_path: Path,
) -> None:
    data = b"bytes"
    sha = hashlib.sha256(data).hexdigest()
    folder = tmp_path / "artifacts" / sha[:2] / sha
    folder.mkdir(parents=True)
    store = FileArtifactStore(tmp_path / "artifacts")
    with pytest.raises(StorageError) as caught:
        await store.get(sha)
    assert caught.value.code == "artifact_corrupt"
    assert sha in caught.value.message
    await store.put(data)
    assert await store.get(sha) == data
