"""The conformance check every ``CheckpointStore`` runs (``lodger.storage.checkpoints``).

A store either keeps checkpoints (``keeps=True``: what was saved last loads back, byte for
byte, per session, until discarded) or keeps none (``keeps=False``: every load is None,
which is correct, only slower: opening a session then decodes its whole log). Either way
it refuses session ids that could name another file.

>>> await check_checkpoint_store(FileCheckpoints(tmp / "checkpoints"), keeps=True)
"""

from __future__ import annotations

from lodger.errors import UsageError
from lodger.storage.checkpoints import CheckpointStore

__all__ = ["check_checkpoint_store"]


async def check_checkpoint_store(store: CheckpointStore, *, keeps: bool) -> None:
    """Raise ``AssertionError`` naming the first rule ``store`` breaks."""
    assert isinstance(store, CheckpointStore), "not a CheckpointStore"
    assert await store.load_checkpoint(session_id="s1") is None, "a new store holds a checkpoint"
    first, second = b"first\n" + bytes(range(256)), b"second\n" * 1_000
    await store.save_checkpoint(session_id="s1", data=first)
    await store.save_checkpoint(session_id="s2", data=second)
    if keeps:
        assert await store.load_checkpoint(session_id="s1") == first, "saved bytes differ"
        assert await store.load_checkpoint(session_id="s2") == second, "sessions share checkpoints"
        await store.save_checkpoint(session_id="s1", data=second)
        assert await store.load_checkpoint(session_id="s1") == second, "a save does not replace"
        await store.discard_checkpoint(session_id="s1")
        assert await store.load_checkpoint(session_id="s1") is None, "discard keeps the bytes"
        assert await store.load_checkpoint(session_id="s2") == second, "discard hits another"
    else:
        assert await store.load_checkpoint(session_id="s1") is None, "a no-op store loads bytes"
    await store.discard_checkpoint(session_id="never-saved")  # not an error
    for bad in ("../s1", "a/b", "", ".hidden"):
        try:
            await store.save_checkpoint(session_id=bad, data=first)
        except UsageError:
            continue
        if keeps:
            raise AssertionError(f"session id {bad!r} was accepted")
