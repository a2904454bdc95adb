"""Adversarial audit of the object-store artifact store: objects damaged behind lodger's
back, on the directory object store and on S3 (moto on loopback)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import obstore
import pytest

from lodger.errors import StorageError
from lodger.storage import FileArtifactStore
from lodger.storage.objectartifacts import ObjectArtifactStore, blob_key
from lodger.storage.objectstore import open_object_store

from ._s3server import S3Server


# the S3 server (moto) is slow to start: the fast lane runs the directory store only
@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'objects'}"
    server: S3Server = request.getfixturevalue("s3")
    return server.url()


async def _keys(store: ObjectArtifactStore, sha256: str) -> list[str]:
    found: list[str] = []
    async for chunk in obstore.list(store.store, f"blobs/{sha256[:2]}/"):
        found.extend(str(meta["path"]) for meta in chunk)
    return sorted(found)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data.replace(b"large", b"LARGE", 1), id="one-word"),
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: b"", id="emptied"),
        pytest.param(lambda data: data + b"\0" * (1 << 20), id="extended"),
    ],
)
async def test_a_put_over_a_damaged_object_stores_the_bytes_and_keeps_the_damage(
    url: str, damage: Callable[[bytes], bytes]
) -> None:
    """Storing the same bytes twice stores them once: the second put trusted any object
    of that name (a create-only put that already existed), so a result whose earlier copy
    was damaged in the store was committed referring to bytes nobody could read back."""
    store = ObjectArtifactStore(open_object_store(url).store)
    data = b"a large tool result\n" * 1000
    ref = await store.put(data)
    damaged = damage(data)
    await obstore.put_async(store.store, blob_key(ref.sha256), damaged)
    with pytest.raises(StorageError) as caught:
        await store.get(ref.sha256)
    assert caught.value.code == "artifact_corrupt"
    assert ref.sha256 in caught.value.message

    again = await ObjectArtifactStore(open_object_store(url).store).put(data)
    assert again == ref
    assert await store.get(ref.sha256) == data
    keys = await _keys(store, ref.sha256)
    assert len(keys) == 2 and keys[0] == blob_key(ref.sha256), keys
    assert ".damaged-" in keys[1]
    kept = await obstore.get_async(store.store, keys[1])
    assert bytes(await kept.bytes_async()) == damaged  # the evidence, as found


async def test_a_put_over_an_intact_object_writes_nothing(url: str) -> None:
    store = ObjectArtifactStore(open_object_store(url).store)
    data = b"the same bytes"
    ref = await store.put(data)
    before = await obstore.head_async(store.store, blob_key(ref.sha256))
    assert await store.put(data) == ref
    assert store.skipped == 1
    after = await obstore.head_async(store.store, blob_key(ref.sha256))
    assert after["e_tag"] == before["e_tag"]
    assert await _keys(store, ref.sha256) == [before["path"]]


async def test_a_directory_in_a_blobs_place_fails_the_put_clearly(tmp_path: Path) -> None:
    """On the directory store a folder can sit where a blob belongs: the create-only put
    said it already existed and the put returned a ref nobody could read (artifact_missing
    on every get). The put must fail instead, with a storage error naming the artifact."""
    root = tmp_path / "objects"
    store = ObjectArtifactStore(open_object_store(f"file://{root}").store)
    data = b"bytes"
    sha = hashlib.sha256(data).hexdigest()
    (root / blob_key(sha)).mkdir(parents=True)
    with pytest.raises(StorageError) as caught:
        await store.put(data)
    assert caught.value.code == "artifact_write"
    assert sha in caught.value.message


async def test_a_directory_in_a_blobs_place_is_a_corrupt_artifact(tmp_path: Path) -> None:
    """As the file store says: obstore reports a folder as no object at all, and get
    called the artifact missing ("deleted or belongs to another store")."""
    root = tmp_path / "objects"
    store = ObjectArtifactStore(open_object_store(f"file://{root}").store)
    sha = hashlib.sha256(b"bytes").hexdigest()
    (root / blob_key(sha)).mkdir(parents=True)
    with pytest.raises(StorageError) as caught:
        await store.get(sha)
    assert caught.value.code == "artifact_corrupt"
    assert sha in caught.value.message
    with pytest.raises(StorageError) as missing:  # a name with nothing there stays missing
        await store.get(hashlib.sha256(b"other").hexdigest())
    assert missing.value.code == "artifact_missing"


async def test_concurrent_puts_over_a_damaged_object_all_repair_it(url: str) -> None:
    store = ObjectArtifactStore(open_object_store(url).store)
    data = b"racing repair\n" * 500
    ref = await store.put(data)
    await obstore.put_async(store.store, blob_key(ref.sha256), b"X" + data[1:])
    refs = await asyncio.gather(
        *(ObjectArtifactStore(open_object_store(url).store).put(data) for _ in range(8))
    )
    assert set(refs) == {ref}
    assert await store.get(ref.sha256) == data
    keys = await _keys(store, ref.sha256)
    assert keys[0] == blob_key(ref.sha256)
    assert 1 <= len(keys) - 1 <= 8  # each repairer that saw the damage kept it aside


@pytest.mark.parametrize("kind", ["file-store", "object-store"])
@pytest.mark.parametrize(
    "name", ["", "..", "../../outside", "ab/../../outside", "A" * 64, "a" * 64 + "/x", "\0"]
)
async def test_a_name_that_is_no_sha256_is_a_missing_artifact(
    tmp_path: Path, kind: str, name: str
) -> None:
    """``get`` took any string as a path: the file store read files outside its root
    (``../../dev/zero`` would read forever) and the object store let obstore's ValueError
    escape as a traceback. A name that is no sha256 names no artifact."""
    (tmp_path / "outside").write_bytes(b"not lodger's")
    store: FileArtifactStore | ObjectArtifactStore = (
        FileArtifactStore(tmp_path / "artifacts" / "root")
        if kind == "file-store"
        else ObjectArtifactStore(open_object_store(f"file://{tmp_path / 'objects'}").store)
    )
    with pytest.raises(StorageError) as caught:
        await store.get(name)
    assert caught.value.code == "artifact_missing"
    assert "not a sha256 digest" in caught.value.message
