"""What rewind costs a local session: the turn-end snapshot every turn now takes, the
per-edit checkpoint of a file tool, and a rewind itself.

Measured in one run, on this machine (shared and loaded: read ratios, not absolutes), in
a workspace of FILES files of 4 KiB on a SQLite log and a file artifact store:

- a turn that edits one file, with turn-end snapshots (the default) against
  ``snapshots=False`` (baseline), one agent over many turns (its snapshotter hashes only
  what changed since its last snapshot) and a fresh agent per turn, as each ``lodger run``
  process is (it starts from the state directory's stat cache, ``snapcache/``: it too
  reads only what changed, and looks each blob up with one ``stat``);
- a rewind that puts back CHANGED files against copying the same bytes with
  ``shutil.copyfile`` (baseline).

    python bench/rewind.py [--quick]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lodger import Agent, ScriptedModel
from lodger.runtime.builtin import workspace_tools
from lodger.runtime.sessions import Binding, Sessions
from lodger.storage import Storage


def _workspace(root: Path, files: int) -> Path:
    ws = root / "ws"
    for i in range(files):
        path = ws / f"d{i % 20}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{i}\n".encode() * 1024)
    return ws


def _edit(n: int) -> list[dict[str, Any]]:
    call = {"name": "write_file", "args": {"path": "edited.txt", "content": f"turn {n}\n"}}
    return [{"calls": [call]}, {"text": "done"}]


async def _turns(ws: Path, turns: int, *, snapshots: bool, fresh: bool) -> float:
    """Median seconds per turn."""
    storage = Storage.local(ws / ".lodger")
    times: list[float] = []
    agent: Agent | None = None
    try:
        for _ in range(turns):
            if agent is None or fresh:
                script = [_edit(k) for k in range(turns)]
                agent = Agent(
                    model=ScriptedModel(turns=script),
                    tools=workspace_tools(),
                    storage=storage,
                    workspace=ws,
                    snapshots=snapshots,
                )
            start = time.perf_counter()
            await agent.run("edit", session=f"s-{snapshots}-{fresh}")
            times.append(time.perf_counter() - start)
    finally:
        await storage.close()
    return statistics.median(times[1:] if len(times) > 1 else times)


async def _rewind(ws: Path, changed: int) -> tuple[float, float]:
    """Seconds for a rewind that puts back ``changed`` files, and for copying them."""
    async with Sessions(Storage.local(ws / ".lodger")) as sessions:
        for text in ("a", "b"):
            calls = [
                {"name": "write_file", "args": {"path": f"c/{i}.txt", "content": text * 4096}}
                for i in range(changed)
            ]
            binding = Binding(
                model=ScriptedModel([{"calls": calls}, {"text": "done"}]),
                tools=workspace_tools(),
                workspace=ws,
            )
            await sessions.run("write", binding=binding, session="r")
        start = time.perf_counter()
        await sessions.rewind("r", turn=2)
        took = time.perf_counter() - start
    source = ws / "c"
    target = ws.parent / "copy"
    target.mkdir()
    start = time.perf_counter()
    for path in source.iterdir():
        shutil.copyfile(path, target / path.name)
    return took, time.perf_counter() - start


async def main(quick: bool) -> dict[str, Any]:
    files, turns, changed = (200, 4, 20) if quick else (1000, 8, 100)
    out: dict[str, Any] = {"files": files, "turns": turns, "changed": changed}
    for label, snapshots, fresh in (
        ("off", False, False),
        ("on_one_agent", True, False),
        ("off_fresh", False, True),
        ("on_fresh", True, True),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            ws = _workspace(Path(tmp), files)
            out[f"turn_s_{label}"] = await _turns(ws, turns, snapshots=snapshots, fresh=fresh)
    out["ratio_one_agent"] = out["turn_s_on_one_agent"] / out["turn_s_off"]
    out["ratio_fresh_agent"] = out["turn_s_on_fresh"] / out["turn_s_off_fresh"]
    with tempfile.TemporaryDirectory() as tmp:
        ws = _workspace(Path(tmp), files)
        took, copy = await _rewind(ws, changed)
    out["rewind_s"], out["copy_s"] = took, copy
    out["ratio_rewind_to_copy"] = took / copy if copy else None
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller workspace")
    result = asyncio.run(main(parser.parse_args().quick))
    for key, value in result.items():
        print(f"{key:24} {value:.4f}" if isinstance(value, float) else f"{key:24} {value}")
    print(json.dumps(result))
