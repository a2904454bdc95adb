"""Stores that cannot fence are refused before any session is written (issue 27 §2).

Broke: s3rver (npm) ignores ``If-None-Match`` on PUT, so two writers racing for an offset
were both told their append committed; one acknowledged commit was lost. Now the first
writer of a store proves a second create-only put is refused, and a store that takes it
is refused in one line. moto and a ``file://`` directory pass; a marker object makes the
proof one HEAD on later opens.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest

from lodger.errors import StorageError
from lodger.storage import Storage
from lodger.storage._store_probe import MARKER_KEY, forget_probes
from lodger.storage.objectstore import ObjectLogStore, open_object_store

from ._s3server import S3RVER_CREDENTIALS, S3Server, running_s3rver

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def s3rver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3rver(tmp_path_factory.mktemp("s3rver")) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh_probes() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()


def _keys(url: str) -> list[str]:
    store = open_object_store(url).store
    return sorted(str(m["path"]) for chunk in obstore.list(store) for m in chunk)


def test_s3rver_is_refused_in_one_line_before_anything_is_written(
    s3rver: S3Server, tmp_path: Path
) -> None:
    url = s3rver.url()
    (tmp_path / "script.json").write_text(json.dumps([{"text": "never"}]))
    env = {**os.environ, **S3RVER_CREDENTIALS, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "lodger", "run", "hello", "--session", "s1", "--store", url,
         "--model", f"script:{tmp_path / 'script.json'}", "--workspace", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    first = done.stderr.strip().splitlines()[0]
    shown = url.split("?")[0]
    assert first.startswith(f"error: object store {shown} cannot fence writers"), done.stderr
    assert "If-None-Match on PUT" in first
    os.environ.update(S3RVER_CREDENTIALS)  # the listing below reads the bucket
    try:
        keys = _keys(url)
    finally:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(name, None)
    assert not [k for k in keys if k.startswith("sessions/")], keys  # no session written
    assert MARKER_KEY not in keys  # and no marker that would let the next run in


async def _open_and_write(url: str) -> ObjectLogStore:
    storage = Storage.from_url(url)
    store = storage.log.store
    assert isinstance(store, ObjectLogStore)
    async with await storage.log.open_writer("s1"):
        pass
    await storage.close()
    return store


@pytest.mark.slow
def test_moto_passes_and_the_marker_makes_the_next_open_one_head(s3: S3Server) -> None:
    url = s3.url()
    first = asyncio.run(_open_and_write(url))
    assert first.probe_requests == 5  # HEAD, put, refused put, delete, marker
    assert MARKER_KEY in _keys(url)
    forget_probes()  # another process: only the marker remembers
    again = asyncio.run(_open_and_write(url))
    assert again.probe_requests == 1
    assert not [k for k in _keys(url) if "probe-" in k]  # the probe object was removed
    # and inside one process the answer is remembered per store: no request at all
    assert asyncio.run(_open_and_write(url)).probe_requests == 0


def test_a_directory_store_passes_the_probe(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    assert asyncio.run(_open_and_write(url)).probe_requests == 5
    assert (tmp_path / "objects" / MARKER_KEY).is_file()
    forget_probes()
    assert asyncio.run(_open_and_write(url)).probe_requests == 1


def test_a_store_that_ignores_create_only_is_refused_as_a_library_user_meets_it(
    s3rver: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in S3RVER_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    storage = Storage.from_url(s3rver.url())

    async def main() -> None:
        try:
            with pytest.raises(StorageError) as info:
                await storage.log.open_writer("s1")
            assert info.value.code == "store_cannot_fence"
            # refused again on the next try: a failed proof is not remembered as a pass
            with pytest.raises(StorageError):
                await storage.log.open_writer("s1")
        finally:
            await storage.close()

    asyncio.run(main())
