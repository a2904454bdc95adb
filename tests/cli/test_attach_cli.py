"""``lodger run --attach FILE``: a real process, a real SQLite log and artifact store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from lodger.events import TurnStarted
from lodger.storage import Storage

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(32))
PDF = b"%PDF-1.4\n" + b"1" * 20


def lodger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lodger", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


async def _started(state: Path, session: str) -> tuple[TurnStarted, list[bytes]]:
    storage = Storage.local(state)
    try:
        events = await storage.log.read_all(session)
        started = next(e.body for e in events if isinstance(e.body, TurnStarted))
        data = [
            await storage.artifacts.get(a.artifact.sha256)
            for a in started.attachments
            if a.artifact is not None
        ]
        return started, data
    finally:
        await storage.close()


def test_run_attach_stores_the_files_and_lists_them(tmp_path: Path) -> None:
    (tmp_path / "chart.png").write_bytes(PNG)
    (tmp_path / "paper.pdf").write_bytes(PDF)
    (tmp_path / "steps.json").write_text(json.dumps([{"text": "a chart"}]))
    proc = lodger(
        "run",
        "what is this?",
        "--attach",
        "chart.png",
        "--attach",
        "paper.pdf",
        "--model",
        "script:steps.json",
        "--state",
        "state",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["status"] == "completed"
    started, data = asyncio.run(_started(tmp_path / "state", result["session_id"]))
    assert started.input == "what is this?"
    assert [(a.media_type, a.name) for a in started.attachments] == [
        ("image/png", "chart.png"),
        ("application/pdf", "paper.pdf"),
    ]
    assert data == [PNG, PDF]
    shown = lodger("log", "show", result["session_id"], "--state", "state", cwd=tmp_path)
    assert "+ image/png chart.png 40 bytes" in shown.stdout


def test_run_attach_refuses_a_file_that_is_not_what_it_says(tmp_path: Path) -> None:
    (tmp_path / "fake.png").write_bytes(b"MZ\x90\x00 an executable")
    (tmp_path / "steps.json").write_text(json.dumps([{"text": "x"}]))
    proc = lodger(
        "run",
        "look",
        "--attach",
        "fake.png",
        "--model",
        "script:steps.json",
        "--state",
        "state",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "'fake.png' (image/png) are not image/png data" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state" / "artifacts").exists()  # nothing was stored
