"""Storage faults told apart from other writers and from damage (issue 27, section 9).

Every fault here is real: the tests' S3 server (moto) on loopback behind a
fault-injecting HTTP proxy (``_faultproxy``) that acknowledges puts it never forwards,
refuses every put once the store is "made read-only", or cuts a response body. The CLI
runs as a user runs it, ``python -m lodger`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from lodger.cli import main
from lodger.errors import CommitFailedError, CorruptLogError, StorageError
from lodger.storage import EventLog
from lodger.storage._objectio import READ_TRIES
from lodger.storage._segments import seg_key
from lodger.storage.objectstore import ObjectLogStore, open_object_store

from ._faultproxy import Fault, Rule, fault_proxy
from ._object_writer import make_draft
from ._s3server import BUCKET, CREDENTIALS, S3Server

SRC = Path(__file__).resolve().parents[2] / "src"
SID = "s1"
SCRIPT = [
    {"calls": [{"name": "write_file", "args": {"path": "out.txt", "content": "HI"}}]},
    {"text": "wrote HI"},
]


def _log(endpoint: str, prefix: str) -> EventLog:
    where = open_object_store(f"s3://{BUCKET}/{prefix}?endpoint={endpoint}")
    return EventLog(ObjectLogStore(where.store, identity=f"{where.identity}#{uuid.uuid4()}"))


@dataclass(frozen=True)
class _Done:
    returncode: int
    stdout: str
    stderr: str


class _Run:
    """``python -m lodger`` against one store prefix, through a given endpoint."""

    def __init__(self, tmp_path: Path, prefix: str) -> None:
        self.tmp = tmp_path
        self.prefix = prefix
        self.ws = tmp_path / "ws"
        self.ws.mkdir(parents=True, exist_ok=True)
        (tmp_path / "script.json").write_text(json.dumps(SCRIPT))

    def __call__(self, endpoint: str, *args: str, process: bool = False) -> _Done:
        """The command, in this process (click's runner) or, with ``process``, as a
        ``python -m lodger`` subprocess."""
        store = f"s3://{BUCKET}/{self.prefix}?endpoint={endpoint}"
        argv = [*args, "--store", store, "--state", str(self.tmp / "state")]
        if not process:
            done = CliRunner(env=CREDENTIALS).invoke(main, argv)
            return _Done(done.exit_code, done.stdout, done.stderr)
        env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(SRC)}
        command = [sys.executable, "-m", "lodger", *argv]
        ran = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        return _Done(ran.returncode, ran.stdout, ran.stderr)

    def turn(self, endpoint: str, *extra: str, process: bool = False) -> _Done:
        return self(
            endpoint, "run", "write HI", "--model", f"script:{self.tmp / 'script.json'}",
            "--workspace", str(self.ws), "--session", SID, "--yes", *extra, process=process,
        )  # fmt: skip


# ---------------------------------------------------------------- a store that lies


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
async def test_a_put_the_store_did_not_keep_fails_the_append_and_moves_no_head(
    s3: S3Server,
) -> None:
    """Broke: the lying put of a segment counted as committed, the next append and the
    head named it, and every later read failed with ``gap``. Now one HEAD after each
    segment put catches it: the append fails naming the key, no head covers it, and the
    log reads and takes the next append at the same offset."""
    prefix = uuid.uuid4().hex
    lost = seg_key(SID, 1)
    with fault_proxy(
        s3.endpoint, lambda m, p, b: "lie" if m == "PUT" and p.endswith(lost) else None
    ) as proxy:
        log = _log(proxy.endpoint, prefix)
        writer = await log.open_writer(SID)
        await writer.append([make_draft("a", 0)], expected_offset=0)
        with pytest.raises(CommitFailedError) as info:
            await writer.append([make_draft("a", 1)], expected_offset=1)
        assert isinstance(info.value, StorageError)
        assert f"acknowledged the write of {lost} but does not hold it" in info.value.message
        assert len(proxy.faults("lie")) == 1  # the fault was injected, once
        await writer.close()  # records the head it has: offset 0's
        await log.close()
    reader = _log(s3.endpoint, prefix)  # straight to the server: what really is stored
    assert await reader.store.stored_head(session_id=SID) == (
        1, (await reader.read(SID))[0].digest,
    )  # fmt: skip
    assert (await reader.verify(SID)).high_water == 1
    async with await reader.open_writer(SID) as again:
        await again.append([make_draft("b", 1)], expected_offset=1)
    assert [e.id for e in await reader.read(SID)] == ["a-0", "b-1"]
    await reader.close()


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
async def test_a_head_the_store_did_not_keep_fails_its_checkpoint(s3: S3Server) -> None:
    """A dropped head object would later read as a head deleted outside lodger
    (``head_missing``) on a healthy log: the checkpoint that wrote it fails instead,
    saying the events are stored, and the next one records the head."""
    prefix = uuid.uuid4().hex
    with fault_proxy(
        s3.endpoint, lambda m, p, b: "lie" if m == "PUT" and "/head/" in p else None
    ) as proxy:
        log = _log(proxy.endpoint, prefix)
        writer = await log.open_writer(SID)
        with pytest.raises(CommitFailedError, match="could not record its head") as info:
            await writer.append([make_draft("a", 0)], expected_offset=0)
        assert "acknowledged the write of sessions/s1/head/" in info.value.message
        with pytest.raises(CommitFailedError, match="could not record its head"):
            await writer.close()  # tries again at the release: dropped again
        assert len(proxy.faults("lie")) == 2
        await log.close()
    reader = _log(s3.endpoint, prefix)
    async with await reader.open_writer(SID) as again:  # the segment is there, headless
        await again.append([make_draft("a", 1)], expected_offset=1)
    assert (await reader.verify(SID)).high_water == 2
    assert (await reader.store.stored_head(session_id=SID))[0] == 2
    await reader.close()


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
def test_a_lost_t1_segment_stops_the_call_before_its_effect(s3: S3Server, tmp_path: Path) -> None:
    """Broke: a lying put of the T1 segment ended the turn "completed", exit 0, with the
    session unreadable afterwards. Now the T1 commit fails, the tool never runs, and the
    session verifies and reads."""
    run = _Run(tmp_path, uuid.uuid4().hex)

    def lie_on_t1(method: str, path: str, body: bytes) -> Fault | None:
        hit = method == "PUT" and "/seg/" in path and b'"kind":"tool_dispatched"' in body
        return "lie" if hit else None

    with fault_proxy(s3.endpoint, lie_on_t1) as proxy:
        result = run.turn(proxy.endpoint)
        assert len(proxy.faults("lie")) == 1
    assert result.returncode == 1, result.stdout + result.stderr
    assert "acknowledged the write of sessions/s1/seg/" in result.stderr
    assert "but does not hold it" in result.stderr
    assert "turn completed" not in result.stdout
    assert not (run.ws / "out.txt").exists()  # the effect never ran
    verified = run(s3.endpoint, "log", "verify", SID)
    assert verified.returncode == 0, verified.stderr
    shown = run(s3.endpoint, "log", "show", SID, "--json")
    assert shown.returncode == 0, shown.stderr
    kinds = [e["body"]["kind"] for e in json.loads(shown.stdout)["events"]]
    assert kinds[0] == "session_started" and "tool_dispatched" not in kinds, kinds


# ---------------------------------------------------------------- the first failure


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
def test_a_failed_t2_is_reported_first_with_what_it_left_undecided(
    s3: S3Server, tmp_path: Path
) -> None:
    """Broke: on a store made read-only after the tool ran, the T2 commit failure was
    replaced by the writer release's "could not record its head", and the hint said
    nothing after the last committed fact ran (the effect had). Now the commit failure
    is the error, its hint names the undecided call, and the release comes second."""
    run = _Run(tmp_path, uuid.uuid4().hex)
    effect = run.ws / "out.txt"

    def read_only_after_the_effect(method: str, path: str, body: bytes) -> Fault | None:
        return "deny" if method == "PUT" and effect.exists() else None

    with fault_proxy(s3.endpoint, read_only_after_the_effect) as proxy:
        result = run.turn(proxy.endpoint, "--json", process=True)
        denied = [seen.path for seen in proxy.faults("deny")]
    assert effect.read_text() == "HI"  # the effect ran
    assert any("/seg/" in path for path in denied) and any("/head/" in path for path in denied)
    assert result.returncode == 1
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    error = lines[0]["error"]
    assert error["message"].startswith(f"commit to session '{SID}' at offset ")
    assert "could not record its head" not in error["message"]
    assert "nothing after the last committed fact ran" not in error["hint"]
    assert "write_file" in error["hint"] and "undecided" in error["hint"]
    assert len(error["notes"]) == 1 and "could not record its head" in error["notes"][0]
    # the human form (in this process): the error, its hint, then the release as a note
    human = _Run(tmp_path / "human", uuid.uuid4().hex)
    effect = human.ws / "out.txt"
    with fault_proxy(s3.endpoint, read_only_after_the_effect) as proxy:
        shown = human.turn(proxy.endpoint)
    assert shown.returncode == 1 and effect.exists()
    error, hint, note = shown.stderr.splitlines()[-3:]
    assert error.startswith(f"error: commit to session '{SID}' at offset "), shown.stderr
    assert hint.startswith("hint: call ") and "write_file" in hint
    assert note.startswith("note: then, closing the session's writer: ")
    assert "could not record its head" in note


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
def test_a_refused_t1_still_says_nothing_ran(s3: S3Server, tmp_path: Path) -> None:
    """The other side of the hint: a T1 refused by the store leaves no call undecided."""
    run = _Run(tmp_path, uuid.uuid4().hex)

    def deny_t1(method: str, path: str, body: bytes) -> Fault | None:
        hit = method == "PUT" and b'"kind":"tool_dispatched"' in body
        return "deny" if hit else None

    with fault_proxy(s3.endpoint, deny_t1) as proxy:
        result = run.turn(proxy.endpoint, "--json")
        assert proxy.faults("deny")
    assert not (run.ws / "out.txt").exists()
    error = json.loads(result.stderr.splitlines()[0])["error"]
    assert "nothing after the last committed fact ran" in error["hint"]


# ---------------------------------------------------------------- transient reads


def _cut_first_segment_read(kind: Fault) -> tuple[list[int], Rule]:
    cuts: list[int] = []

    def rule(method: str, path: str, body: bytes) -> Fault | None:
        if method == "GET" and "/seg/" in path and not cuts:
            cuts.append(1)
            return kind
        return None

    return cuts, rule


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
@pytest.mark.parametrize("kind", ["cut", "cut_close", "short"])
def test_a_read_cut_on_the_way_is_retried(s3: S3Server, tmp_path: Path, kind: Fault) -> None:
    """Broke: a segment GET whose body was cut mid-way (the connection closed without a
    length, or a length rewritten to match the cut) failed ``lodger run --session`` at
    open, the second telling the user to restore a backup. Now it is read again."""
    run = _Run(tmp_path, uuid.uuid4().hex)
    assert run.turn(s3.endpoint).returncode == 0
    cuts, rule = _cut_first_segment_read(kind)
    with fault_proxy(s3.endpoint, rule) as proxy:
        result = run.turn(proxy.endpoint)
        assert proxy.faults(kind)
    assert cuts == [1]
    assert result.returncode == 0, result.stderr
    assert "turn completed" in result.stdout


@pytest.mark.slow  # the S3 server (and a CLI process or two): seconds, not ms
def test_a_read_that_keeps_failing_is_a_read_failure_not_damage(
    s3: S3Server, tmp_path: Path
) -> None:
    run = _Run(tmp_path, uuid.uuid4().hex)
    assert run.turn(s3.endpoint).returncode == 0

    def every_segment_read(kind: Fault) -> Rule:
        return lambda m, p, b: kind if m == "GET" and "/seg/" in p else None

    with fault_proxy(s3.endpoint, every_segment_read("cut_close")) as proxy:
        result = run(proxy.endpoint, "log", "show", SID, "--json")
        assert len(proxy.faults("cut_close")) == READ_TRIES
    assert result.returncode == 1
    error = json.loads(result.stderr.splitlines()[0])["error"]
    assert error["code"] == "object_store_read"
    assert "read failure" in error["hint"] and "backup" not in error["hint"]
    # a body cut at every read to a length that matches: the store says it holds more
    with fault_proxy(s3.endpoint, every_segment_read("short")) as proxy:
        result = run(proxy.endpoint, "log", "show", SID, "--json")
        assert len(proxy.faults("short")) == 2
    assert result.returncode == 1
    error = json.loads(result.stderr.splitlines()[0])["error"]
    assert error["code"] == "object_store_read"
    assert "read failure" in error["hint"] and "backup" not in error["hint"]


async def test_stored_damage_is_still_damage(tmp_path: Path) -> None:
    """A segment that reads the same twice and does not decode is damage, as before."""
    where = open_object_store(f"file://{tmp_path / 'objects'}")
    log = EventLog(ObjectLogStore(where.store, identity=where.identity))
    async with await log.open_writer(SID) as writer:
        await writer.append([make_draft("a", 0), make_draft("a", 1)], expected_offset=0)
    path = tmp_path / "objects" / seg_key(SID, 0)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CorruptLogError, match="truncated data"):
        await EventLog(ObjectLogStore(where.store, identity=where.identity + "#r")).read(SID)
    await log.close()


@pytest.mark.slow  # the S3 server
@pytest.mark.parametrize("kind", ["cut_close", "short"])
async def test_an_artifact_read_cut_on_the_way_is_read_again(s3: S3Server, kind: Fault) -> None:
    """Broke: a blob whose body was cut failed the read, or read as corrupt (its hash did
    not match) with a hint that it was modified outside lodger."""
    from lodger.storage.objectartifacts import ObjectArtifactStore

    prefix = uuid.uuid4().hex
    data = b"workspace file " * 500
    ref = await ObjectArtifactStore(
        open_object_store(f"s3://{BUCKET}/{prefix}?endpoint={s3.endpoint}").store
    ).put(data)
    cuts, rule = _cut_first_blob_read(kind)
    with fault_proxy(s3.endpoint, rule) as proxy:
        store = open_object_store(f"s3://{BUCKET}/{prefix}?endpoint={proxy.endpoint}").store
        assert await ObjectArtifactStore(store).get(ref.sha256) == data
        assert proxy.faults(kind) and cuts == [1]


def _cut_first_blob_read(kind: Fault) -> tuple[list[int], Rule]:
    cuts: list[int] = []

    def rule(method: str, path: str, body: bytes) -> Fault | None:
        if method == "GET" and "/blobs/" in path and not cuts:
            cuts.append(1)
            return kind
        return None

    return cuts, rule
