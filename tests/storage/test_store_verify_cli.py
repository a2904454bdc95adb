"""``lodger store verify --deep [--repair]`` as a user runs it, over a file:// store and a
real S3-compatible server (moto on loopback): a blob damaged with its size kept is named,
repaired from the live workspace, and the session's snapshot then restores."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import obstore
import pytest
from click.testing import CliRunner, Result

from lodger.cli import main
from lodger.storage import Storage
from lodger.storage.objectartifacts import blob_key
from lodger.storage.snapshots import restore_snapshot

from ._s3server import S3Server

CONTENT = "def answer():\n    return 42\n"
SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "src/app.py", "content": CONTENT}}]},
    {"text": "wrote it"},
]


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'objects'}"
    server: S3Server = request.getfixturevalue("s3")
    return server.url()


def _lodger(store: str, *args: str) -> Result:
    return CliRunner(env={"LODGER_STORE": store}).invoke(main, list(args))


def _run_a_turn(tmp_path: Path, store: str) -> Path:
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    ws = tmp_path / "ws"
    ws.mkdir()
    ran = _lodger(
        store, "run", "write the app", "--model", f"script:{tmp_path / 'script.json'}",
        "--workspace", str(ws), "--session", "s1", "--yes", "--state", str(tmp_path / "st"),
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    return ws


async def _damage(store: str, data: bytes) -> str:
    """Overwrite the blob of ``CONTENT`` with ``data`` behind lodger's back."""
    sha = hashlib.sha256(CONTENT.encode()).hexdigest()
    blobs = Storage.from_url(store).artifacts
    await obstore.put_async(blobs.store, blob_key(sha), data)  # type: ignore[attr-defined]
    return sha


def test_deep_verify_names_same_size_damage_and_repairs_it(tmp_path: Path, store: str) -> None:
    ws = _run_a_turn(tmp_path, store)
    assert _lodger(store, "store", "verify", "s1", "--deep").exit_code == 0  # intact
    sha = asyncio.run(_damage(store, CONTENT.replace("42", "41").encode()))

    shallow = _lodger(store, "store", "verify", "s1")
    assert shallow.exit_code == 0, shallow.output  # name and size: the hot path's check

    found = _lodger(store, "store", "verify", "s1", "--deep", "--json")
    assert found.exit_code == 1, found.output
    report = json.loads(found.stdout)
    assert report["ok"] is False
    (session,) = report["sessions"]
    assert session["session_id"] == "s1" and session["unrepaired"] == 1
    (damage,) = session["damage"]
    assert damage["path"] == "src/app.py" and damage["sha256"] == sha
    assert damage["key"] == blob_key(sha) and damage["problem"] == "corrupt"
    assert damage["snapshot"] == session["snapshots"][0]["ref"]
    text = _lodger(store, "store", "verify", "s1", "--deep")
    assert text.exit_code == 1
    assert f"damaged: session s1 snapshot {damage['snapshot'][:16]} src/app.py" in text.output
    assert blob_key(sha) in text.output

    fixed = _lodger(store, "store", "verify", "s1", "--repair", "--workspace", str(ws))
    assert fixed.exit_code == 0, fixed.output
    assert "repaired: session s1" in fixed.output and "stored again from src/app.py" in fixed.output
    assert _lodger(store, "store", "verify", "--deep").exit_code == 0  # every session
    blobs = Storage.from_url(store).artifacts
    asyncio.run(restore_snapshot(damage["snapshot"], blobs, tmp_path / "restored"))
    assert (tmp_path / "restored" / "src" / "app.py").read_text() == CONTENT


def test_damage_the_workspace_no_longer_holds_is_unrepairable(tmp_path: Path, store: str) -> None:
    ws = _run_a_turn(tmp_path, store)
    asyncio.run(_damage(store, CONTENT.replace("42", "41").encode()))
    (ws / "src" / "app.py").write_text(CONTENT + "# changed since\n")
    left = _lodger(store, "store", "verify", "s1", "--repair", "--workspace", str(ws), "--json")
    assert left.exit_code == 1, left.output
    (damage,) = json.loads(left.stdout)["sessions"][0]["damage"]
    assert damage["repaired"] is False and "unrepairable" in damage["note"]
    assert _lodger(store, "store", "verify", "s1", "--deep").exit_code == 1  # still there


def test_an_unknown_session_and_a_bad_workspace_are_one_line(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'objects'}"
    unknown = _lodger(store, "store", "verify", "nosuch", "--deep")
    assert unknown.exit_code == 4, unknown.output
    assert "no session 'nosuch'" in unknown.output
    bad = _lodger(store, "store", "verify", "--repair", "--workspace", str(tmp_path / "none"))
    assert bad.exit_code == 2, bad.output
    assert "not a directory" in bad.output
