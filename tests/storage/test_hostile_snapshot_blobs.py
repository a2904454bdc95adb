"""Adversarial audit of workspace snapshots over a damaged blob: a snapshot of a file whose
bytes are already stored must not trust (object stores) nor choke on (file store) a copy
damaged behind lodger's back. It stores the bytes again, and what it commits restores."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import obstore
import pytest

from lodger.errors import StorageError
from lodger.storage import FileArtifactStore
from lodger.storage.artifacts import ArtifactStore
from lodger.storage.objectartifacts import ObjectArtifactStore, blob_key
from lodger.storage.objectstore import open_object_store
from lodger.storage.snapshotcheck import check_snapshots
from lodger.storage.snapshots import restore_snapshot, snapshot_workspace

from ._s3server import S3Server

CONTENT = b"def main():\n    return 42\n" * 200


@pytest.fixture(params=["files", "objects", pytest.param("s3", marks=pytest.mark.slow)])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "files":
        return FileArtifactStore(tmp_path / "artifacts")
    if request.param == "objects":
        return ObjectArtifactStore(open_object_store(f"file://{tmp_path / 'objects'}").store)
    server: S3Server = request.getfixturevalue("s3")
    return ObjectArtifactStore(open_object_store(server.url()).store)


async def _overwrite(blobs: ArtifactStore, sha256: str, data: bytes, tmp_path: Path) -> None:
    """Replace the stored copy of ``sha256`` with ``data``, as damage outside lodger."""
    if isinstance(blobs, FileArtifactStore):
        (tmp_path / "artifacts" / sha256[:2] / sha256).write_bytes(data)
    else:
        assert isinstance(blobs, ObjectArtifactStore)
        await obstore.put_async(blobs.store, blob_key(sha256), data)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 3], id="truncated"),
        pytest.param(lambda data: b"", id="emptied"),
        pytest.param(lambda data: data + b"# appended\n", id="extended"),
    ],
)
async def test_a_snapshot_over_a_damaged_blob_stores_the_file_again(
    blobs: ArtifactStore, tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    """The file store failed every later snapshot of the file (artifact_corrupt from the
    check whether it was stored); an object store answered "stored" from the object's
    name alone, and the snapshot was committed referring to bytes no restore could read."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_bytes(CONTENT)
    sha = hashlib.sha256(CONTENT).hexdigest()
    await snapshot_workspace(ws, blobs)
    await _overwrite(blobs, sha, damage(CONTENT), tmp_path)

    again = await snapshot_workspace(ws, blobs)
    assert again.uploaded == 1  # the damaged copy did not count as stored
    await restore_snapshot(again.ref, blobs, tmp_path / "restored")
    assert (tmp_path / "restored" / "main.py").read_bytes() == CONTENT
    assert await blobs.get(sha) == CONTENT


async def test_a_snapshot_over_an_intact_blob_uploads_nothing(
    blobs: ArtifactStore, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_bytes(CONTENT)
    first = await snapshot_workspace(ws, blobs)
    again = await snapshot_workspace(ws, blobs)
    assert (first.uploaded, again.uploaded) == (1, 0)
    assert again.ref == first.ref


@pytest.fixture(params=["objects", pytest.param("s3", marks=pytest.mark.slow)])
def object_blobs(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectArtifactStore:
    if request.param == "objects":
        return ObjectArtifactStore(open_object_store(f"file://{tmp_path / 'objects'}").store)
    server: S3Server = request.getfixturevalue("s3")
    return ObjectArtifactStore(open_object_store(server.url()).store)


async def test_a_snapshot_over_a_same_size_damaged_object_is_found_and_repaired_by_the_deep_check(
    object_blobs: ObjectArtifactStore, tmp_path: Path
) -> None:
    """Was a strict xfail: an object store's snapshot checks a stored blob by name and
    size (one HEAD, kept on the hot path), so a same-size damaged copy is trusted and
    found only when a restore reads it. The deep check (``lodger store verify --deep``)
    reads every blob back: it names the damage, and repairs it from the live workspace,
    after which the snapshot restores."""
    blobs = object_blobs
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "main.py").write_bytes(CONTENT)
    sha = hashlib.sha256(CONTENT).hexdigest()
    await snapshot_workspace(ws, blobs)
    await _overwrite(blobs, sha, CONTENT.replace(b"42", b"41", 1), tmp_path)
    again = await snapshot_workspace(ws, blobs)
    assert again.uploaded == 0  # the hot path still trusts it (one HEAD)
    with pytest.raises(StorageError, match="does not match its hash"):
        await restore_snapshot(again.ref, blobs, tmp_path / "before")

    shallow = await check_snapshots([("log", again.ref)], blobs, session_id="s1", deep=False)
    assert shallow.damage == ()  # name and size look right: only reading finds it
    found = await check_snapshots([("log", again.ref)], blobs, session_id="s1")
    assert [(d.session_id, d.snapshot, d.path, d.key, d.problem) for d in found.damage] == [
        ("s1", again.ref, "src/main.py", blob_key(sha), "corrupt")
    ]
    assert found.unrepaired == found.damage

    fixed = await check_snapshots(
        [("log", again.ref)], blobs, session_id="s1", workspace=ws, repair=True
    )
    assert [d.repaired for d in fixed.damage] == [True] and fixed.unrepaired == ()
    assert "src/main.py" in fixed.damage[0].note
    await restore_snapshot(again.ref, blobs, tmp_path / "restored")
    assert (tmp_path / "restored" / "src" / "main.py").read_bytes() == CONTENT
    assert (await check_snapshots([("log", again.ref)], blobs, session_id="s1")).damage == ()


async def test_damage_no_workspace_file_matches_is_reported_unrepairable(
    blobs: ArtifactStore, tmp_path: Path
) -> None:
    """The workspace moved on (the file changed, another was deleted, one became a
    symlink to a copy of the bytes outside): nothing there hashes to the blob, so it is
    reported as unrepairable, and nothing is stored under its name."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_bytes(CONTENT)
    (ws / "gone.py").write_bytes(b"print('gone')\n")
    (ws / "linked.py").write_bytes(b"linked = 1\n")
    taken = await snapshot_workspace(ws, blobs)
    damaged = {
        hashlib.sha256(b).hexdigest(): b for b in (CONTENT, b"print('gone')\n", b"linked = 1\n")
    }
    for sha, data in damaged.items():
        await _overwrite(blobs, sha, bytes(reversed(data)), tmp_path)
    (ws / "main.py").write_bytes(CONTENT + b"# edited\n")
    (ws / "gone.py").unlink()
    outside = tmp_path / "outside.py"
    outside.write_bytes(b"linked = 1\n")
    (ws / "linked.py").unlink()
    (ws / "linked.py").symlink_to(outside)

    report = await check_snapshots(
        [("log", taken.ref)], blobs, session_id="s1", workspace=ws, repair=True
    )
    assert sorted(d.path for d in report.unrepaired) == ["gone.py", "linked.py", "main.py"]
    assert all(d.problem == "corrupt" and "unrepairable" in d.note for d in report.damage)
    for sha in damaged:
        with pytest.raises(StorageError, match="does not match its hash"):
            await blobs.get(sha)


async def test_a_missing_blob_is_named_and_stored_again(
    blobs: ArtifactStore, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_bytes(CONTENT)
    sha = hashlib.sha256(CONTENT).hexdigest()
    taken = await snapshot_workspace(ws, blobs)
    if isinstance(blobs, FileArtifactStore):
        (tmp_path / "artifacts" / sha[:2] / sha).unlink()
    else:
        assert isinstance(blobs, ObjectArtifactStore)
        await obstore.delete_async(blobs.store, blob_key(sha))
    shallow = await check_snapshots([("log", taken.ref)], blobs, session_id="s1", deep=False)
    assert [(d.path, d.problem) for d in shallow.damage] == [("main.py", "missing")]
    fixed = await check_snapshots(
        [("log", taken.ref)], blobs, session_id="s1", workspace=ws, repair=True
    )
    assert [d.repaired for d in fixed.damage] == [True]
    assert await blobs.get(sha) == CONTENT
